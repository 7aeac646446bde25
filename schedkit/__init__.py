"""schedkit: compose, wire and test an LLM-serving scheduler from standalone components.

``from schedkit import component`` loads only the component model: the wiring, container and
the rest load on first use, so component modules stay independent of the framework.
"""

from __future__ import annotations

from schedkit._lazy import lazy_attributes
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
    "Req": "schedkit.components.schedule_batch",
    "SamplingParams": "schedkit.components.schedule_batch",
}

__all__ = ["component", "component_name", "is_component", "registered", *_LAZY]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
