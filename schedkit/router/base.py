"""The vocabulary every routing policy shares: what a policy sees of a request
(``Candidates``), what it answers (``Route``), the ``RoutingPolicy`` protocol, and the registry
of policies by name (``POLICIES``, ``register_policy``, ``make_policy``), so that a fleet's
wiring or ``--router NAME`` names a policy and its settings."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import attrs

from schedkit.kv_events.hashing import page_hashes
from schedkit.router.load import LoadBoard

__all__ = [
    "POLICIES",
    "SIGNALS",
    "Candidates",
    "Route",
    "RoutingPolicy",
    "hold_pages",
    "make_policy",
    "policy_settings",
    "register_policy",
    "release_pages",
]

# The load signals a policy may read (each policy lists its own in ``signals``).
SIGNALS = {
    "requests": "requests routed to the worker and not finished (the router's count)",
    "queued": "requests routed to the worker whose first token has not come back yet",
    "prefill_tokens": "prompt tokens of queued requests past the prefix matched at routing",
    "decode_tokens": "prompt tokens of requests past their first token, not finished",
    "kv_usage": "the KV-pool usage the worker last reported (KvMetrics / get_loads)",
    "prefix": "leading prompt pages each worker holds, from its KV events",
    "pending_prefix": "pages of prompts routed to a worker and not yet prefilled there",
    "own_tree": "the policy's own record of the prompts it sent to each worker",
}


@attrs.frozen
class Route:
    """Where a request went and why: matched pages per rank and the rule that decided."""

    rank: int
    matched_pages: int
    scores: dict[int, int]
    reason: str

    @property
    def tie_break(self) -> bool:
        """True when equal prefixes left the choice to load."""
        return self.reason == "tie"


@attrs.define(slots=True)
class Candidates:
    """What a policy sees of one request: the live ranks in order, the prompt, the load
    signals (``loads``), the routing clock (``now``, seconds), and, for policies that look at
    prefixes, the leading pages of the prompt each rank holds (``matched``) and how many
    pages each rank's cache holds (``cached_pages``)."""

    ranks: list[int]
    token_ids: Sequence[int]
    page_size: int
    loads: LoadBoard
    now: float
    matched: dict[int, int] = attrs.field(factory=dict)
    cached_pages: Callable[[int], int] = lambda _rank: 0
    session: str | None = None
    extra_key: str | None = None
    cache_salt: str | None = None
    _hashes: list[int] | None = None

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens."""
        return len(self.token_ids)

    @property
    def hashes(self) -> list[int]:
        """The chained hash of each whole page of the prompt (computed once per request)."""
        if self._hashes is None:
            self._hashes = list(
                page_hashes(
                    self.token_ids,
                    self.page_size,
                    extra_key=self.extra_key,
                    cache_salt=self.cache_salt,
                )
            )
        return self._hashes


class RoutingPolicy(Protocol):
    """Chooses a rank from ``Candidates``.

    ``uses_prefix`` asks the router for ``matched``/``cached_pages`` from the KV-event index
    (and, when ``uses_pending``, the prompts routed but not yet prefilled); ``signals`` names
    the load signals it reads (keys of ``SIGNALS``). A policy may also define
    ``on_routed(candidates, rank, rid)``, ``on_finished(rid)`` and ``on_removed(rank)``, and
    ``reads_cached_pages = False`` when, using pending prompts, it never reads
    ``cached_pages`` (the router then need not count their pages against the index).
    """

    name: ClassVar[str]
    signals: ClassVar[tuple[str, ...]]
    uses_prefix: ClassVar[bool]
    uses_pending: ClassVar[bool]

    def choose(self, c: Candidates) -> tuple[int, str]: ...


POLICIES: dict[str, type] = {}


def register_policy(cls: type) -> type:
    """Class decorator: make a policy selectable by its ``name`` (``make_policy``, the fleet
    command's ``--router``, a fleet wiring's ``router: {policy: NAME}``)."""
    name = cls.name
    if name in POLICIES and POLICIES[name] is not cls:
        raise ValueError(f"routing policy {name!r} is already registered by {POLICIES[name]!r}")
    POLICIES[name] = cls
    return cls


def policy_settings(name: str) -> dict[str, Any]:
    """The settings policy ``name`` takes, with their defaults."""
    cls = _lookup(name)
    return {
        f.alias: f.default
        for f in attrs.fields(cls)
        if f.init and f.default is not attrs.NOTHING and not f.name.startswith("_")
    }


def _lookup(name: str) -> type:
    """The policy class called ``name``; ``module:Class`` imports a policy of one's own."""
    if name not in POLICIES and ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"routing policy {name!r}: cannot import it ({exc})") from None
        if not callable(getattr(cls, "choose", None)):
            raise ValueError(f"routing policy {name!r} has no choose(candidates) method")
        return cls
    if name not in POLICIES:
        raise ValueError(
            f"unknown routing policy {name!r}; valid: {', '.join(sorted(POLICIES))}, "
            "or module:Class for a policy of one's own"
        )
    return POLICIES[name]


def make_policy(name: str, **settings: Any) -> RoutingPolicy:
    """A fresh policy called ``name`` (a key of ``POLICIES``) with ``settings``; ValueError
    naming the valid settings for an unknown one or a bad value."""
    cls = _lookup(name)
    valid = policy_settings(name)
    unknown = sorted(set(settings) - set(valid))
    if unknown:
        takes = ", ".join(valid) if valid else "no settings"
        raise ValueError(
            f"routing policy {name!r} takes no {', '.join(map(repr, unknown))}; it takes {takes}"
        )
    try:
        return cls(**settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"routing policy {name!r}: {exc}") from None


def hold_pages(counts: dict[int, int], hashes: Sequence[int]) -> None:
    """Add one reference to each of ``hashes`` to ``counts`` (page hash -> requests holding
    it)."""
    get = counts.get
    for h in hashes:
        counts[h] = get(h, 0) + 1


def release_pages(counts: dict[int, int], hashes: Sequence[int]) -> None:
    """Take one reference to each of ``hashes`` off ``counts`` (page hash -> requests holding
    it), dropping a page whose count reaches zero."""
    get = counts.get
    for h in hashes:
        count = get(h, 0) - 1
        if count > 0:
            counts[h] = count
        else:
            counts.pop(h, None)
