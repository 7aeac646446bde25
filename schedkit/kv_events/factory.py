"""Publishers by name: a ``kv_events_config``'s ``publisher`` key picks the factory that
builds its publisher (``zmq`` and ``null`` built in; tests and the fleet register more)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedkit.core.component import ArgumentError
from schedkit.kv_events.config import EventPublisher, KvEventsConfig, parse_kv_events_config
from schedkit.kv_events.null_publisher import NullEventPublisher
from schedkit.kv_events.zmq_publisher import ZmqEventPublisher

__all__ = ["check_publisher_config", "create_publisher", "register_publisher"]


_FACTORIES: dict[str, Callable[[KvEventsConfig, int], EventPublisher]] = {
    "null": NullEventPublisher,
    "zmq": ZmqEventPublisher,
}


def register_publisher(
    name: str, factory: Callable[[KvEventsConfig, int], EventPublisher], *, replace: bool = False
) -> None:
    """Make ``factory(config, dp_rank)`` the publisher for ``publisher: name`` configs."""
    existing = _FACTORIES.get(name)
    if existing is not None and existing is not factory and not replace:
        raise ValueError(
            f"KV-event publisher {name!r} is already registered ({existing!r}); "
            "pass replace=True to override it"
        )
    _FACTORIES[name] = factory


def _factory(name: str) -> Callable[[KvEventsConfig, int], EventPublisher]:
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ArgumentError(
            "publisher", f"unknown KV-event publisher {name!r}; valid: {', '.join(_FACTORIES)}"
        )
    return factory


def check_publisher_config(config: KvEventsConfig) -> None:
    """Refuse a config its publisher could not be built from, building nothing: an unknown
    ``publisher``, or what the publisher's own ``check_config`` refuses (``ArgumentError``
    naming the config key)."""
    check = getattr(_factory(config.publisher), "check_config", None)
    if check is not None:
        check(config)


def create_publisher(config: Any, dp_rank: int = 0) -> EventPublisher:
    """The publisher a config asks for (None or a falsy config gives the ``null`` publisher)."""
    config = parse_kv_events_config(config)
    return _factory("null" if config is None else config.publisher)(config, dp_rank)
