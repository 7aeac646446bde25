"""schedkit: compose, wire and test an LLM-serving scheduler from standalone components.

``from schedkit import component`` loads only the component model: the wiring, container and
the rest load on first use, so component modules stay independent of the framework.
"""

from __future__ import annotations

from schedkit._lazy import lazy_attributes
from schedkit.core.component import component, component_name, is_component, registered

_LAZY = {
    "Assembly": "schedkit.assembly.container",
    "ComponentBuildError": "schedkit.assembly.container",
    "build": "schedkit.assembly.container",
    "Ref": "schedkit.assembly.wiring",
    "Wiring": "schedkit.assembly.wiring",
    "WiringError": "schedkit.assembly.wiring",
    "call": "schedkit.assembly.wiring",
    "late": "schedkit.assembly.wiring",
    "load_wiring": "schedkit.assembly.loading",
    "ref": "schedkit.assembly.wiring",
    "Req": "schedkit.core.schedule_batch",
    "SamplingParams": "schedkit.core.schedule_batch",
}

__all__ = ["component", "component_name", "is_component", "registered", *_LAZY]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
