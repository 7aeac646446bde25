"""SGLang's ways of making a prefix cache: ``RadixCache(params)`` from a ``CacheInitParams``
and ``RadixCache.create_simulated(...)``, and the slot source of a cache made without a KV pool.

``takes_cache_init_params`` lets a cache class be built either way: with its own keyword
arguments, as the assembly builds it, or from SGLang's ``CacheInitParams`` (positionally or as
``params=``), with keyword arguments of its own beside it (``capacity=``, ``hicache_ratio=``...).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

import attrs

from schedkit.components.cache.cache_params import CacheInitParams
from schedkit.core.component import at_least

__all__ = [
    "SIMULATED_SIZE",
    "SGLangConstruction",
    "SimulatedSlots",
    "cache_arguments",
    "simulated_pools",
    "takes_cache_init_params",
]

C = TypeVar("C", bound=type)

# The size a cache made without a KV pool reports to the pools sized from it (the host tier's,
# twice this by default): 4,096 tokens.
SIMULATED_SIZE = 1 << 12


@attrs.define(slots=True, kw_only=True)
class SimulatedSlots:
    """The slots of a cache made without a KV pool (SGLang's ``create_simulated``): a slot is
    whatever label the caller inserts, nothing is bounded and nothing is held.

    ``alloc(n)`` hands out ``n`` new labels counting up from ``size`` (above the labels
    ``0..size - 1`` a caller is likely to pick) and never runs short; ``free`` takes back any
    labels and counts them in ``freed``; ``available_size()`` is always ``size``, the size the
    host tier's pool is made from. A sliding-window cache made this way takes its
    sliding-window slots from a ``SimulatedSlots`` too.
    """

    size: int = attrs.field(default=SIMULATED_SIZE, validator=at_least(1))
    page_size: int = attrs.field(default=1, validator=at_least(1))
    freed: int = attrs.field(init=False, default=0)
    _next: int = attrs.field(init=False, repr=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._next = self.size

    def alloc(self, n: int) -> list[int]:
        """``n`` new labels (a multiple of ``page_size``)."""
        if n < 0 or n % self.page_size:
            raise ValueError(
                f"alloc takes a non-negative multiple of page_size={self.page_size} slots, got {n}"
            )
        start, self._next = self._next, self._next + n
        return list(range(start, start + n))

    def free(self, indices: Sequence[int]) -> None:
        """Take back ``indices`` (counted in ``freed``)."""
        self.freed += len(indices)

    def available_size(self) -> int:
        """Always ``size``: labels never run short."""
        return self.size

    def clear(self) -> None:
        """Nothing is held: only the count of freed labels restarts."""
        self.freed = 0


def cache_arguments(
    params: CacheInitParams, cls: type, given: Collection[str] = ()
) -> dict[str, Any]:
    """The keyword arguments of ``cls`` that SGLang's ``params`` stand for, next to the
    arguments named in ``given`` (a ``capacity=`` given there sizes a real pool instead of
    the simulated one a None allocator stands for)."""
    if not isinstance(params, CacheInitParams):
        raise TypeError(
            f"{cls.__name__}(params) takes a CacheInitParams "
            f"(schedkit.components.cache.cache_params), got {type(params).__name__}"
        )
    fields = attrs.fields_dict(cls)
    args: dict[str, Any] = {}
    allocator = params.token_to_kv_pool_allocator
    if allocator is None:
        for name, pool in simulated_pools(cls, params.page_size).items():
            sized_by = "capacity" if name == "allocator" else "swa_capacity"
            if sized_by not in given and name not in given:
                args[name] = pool
    else:
        args["allocator"] = allocator
    args |= {
        "disable": params.disable,
        "page_size": params.page_size,
        "eviction_policy": params.eviction_policy.lower(),
        "enable_kv_cache_events": params.enable_kv_cache_events,
    }
    if "sliding_window_size" in fields:
        args["sliding_window_size"] = params.sliding_window_size
    if "is_eagle" in fields:
        args["is_eagle"] = params.is_eagle
    elif params.is_eagle:
        raise ValueError(
            f"is_eagle=True: {cls.__name__} has no EAGLE bigram keys; swa_radix_cache has them"
        )
    return args


def simulated_pools(cls: type, page_size: int) -> dict[str, SimulatedSlots]:
    """The pool arguments of a ``cls`` cache without memory pools: ``allocator`` and, for the
    sliding-window cache, ``swa_allocator``."""
    pools = {"allocator": SimulatedSlots(page_size=page_size)}
    if "swa_allocator" in attrs.fields_dict(cls):
        pools["swa_allocator"] = SimulatedSlots(page_size=page_size)
    return pools


def takes_cache_init_params(cls: C) -> C:
    """Let ``cls`` (an attrs cache class) also be built from SGLang's ``CacheInitParams``,
    given positionally or as ``params=``; other keyword arguments are the class's own."""
    attrs_init = cls.__init__

    @functools.wraps(attrs_init)
    def __init__(self: Any, params: CacheInitParams | None = None, /, **kwargs: Any) -> None:
        if params is None:
            params = kwargs.pop("params", None)
        if params is not None:
            kwargs = {**cache_arguments(params, cls, kwargs.keys()), **kwargs}
        attrs_init(self, **kwargs)

    cls.__init__ = __init__
    return cls


class SGLangConstruction:
    """``create_simulated``, SGLang's constructor of a cache without memory pools; mixed into
    ``RadixTree``."""

    __slots__ = ()

    @classmethod
    def create_simulated(
        cls,
        disable: bool = False,
        mock_allocator: Any = None,
        page_size: int = 1,
        enable_kv_cache_events: bool = False,
        **kwargs: Any,
    ) -> Any:
        """A cache of this class whose slots come from ``mock_allocator`` (anything with
        ``free``), or, without one, from ``capacity=`` slots of a real pool, or else from
        ``SimulatedSlots`` (slots are the caller's labels; ``simulated_pools``). Other keyword
        arguments are the class's own (``sliding_window_size=``, ``eviction_policy=``...)."""
        if mock_allocator is not None:
            kwargs["allocator"] = mock_allocator
        elif "capacity" not in kwargs and "allocator" not in kwargs:
            for name, pool in simulated_pools(cls, page_size).items():
                kwargs.setdefault(name, pool)
        return cls(
            disable=disable,
            page_size=page_size,
            enable_kv_cache_events=enable_kv_cache_events,
            **kwargs,
        )
