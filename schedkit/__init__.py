"""schedkit: compose, wire and test an LLM-serving scheduler from standalone components.

``from schedkit import component`` loads only the component model: the wiring, container and
the rest load on first use, so component modules stay independent of the framework.
"""

from __future__ import annotations

import importlib
from typing import Any

from schedkit.component import component, component_name, is_component, registered

_LAZY = {
    "Assembly": "schedkit.container",
    "ComponentBuildError": "schedkit.container",
    "build": "schedkit.container",
    "Ref": "schedkit.wiring",
    "Wiring": "schedkit.wiring",
    "WiringError": "schedkit.wiring",
    "call": "schedkit.wiring",
    "late": "schedkit.wiring",
    "load_wiring": "schedkit.wiring",
    "ref": "schedkit.wiring",
    "Req": "schedkit.schedule_batch",
    "SamplingParams": "schedkit.schedule_batch",
}

__all__ = ["component", "component_name", "is_component", "registered", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'schedkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
