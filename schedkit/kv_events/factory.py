"""Publishers by name: a ``kv_events_config``'s ``publisher`` key picks the factory that
builds its publisher (``zmq`` and ``null`` built in; tests and the fleet register more)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedkit.kv_events.config import EventPublisher, KvEventsConfig, parse_kv_events_config
from schedkit.kv_events.zmq_publisher import NullEventPublisher, ZmqEventPublisher

__all__ = ["create_publisher", "register_publisher"]


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


def create_publisher(config: Any, dp_rank: int = 0) -> EventPublisher:
    """The publisher a config asks for (None or a falsy config gives the ``null`` publisher)."""
    config = parse_kv_events_config(config)
    name = "null" if config is None else config.publisher
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown KV-event publisher {name!r}; valid: {', '.join(_FACTORIES)}")
    return factory(config, dp_rank)
