"""schedkit: compose, wire and test an LLM-serving scheduler from standalone components.

``from schedkit import component`` loads only the component model: the wiring, container and
the rest load on first use, so component modules stay independent of the framework.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

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

try:
    __version__ = _version("schedkit")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "unknown"

__all__ = ["__version__", "component", "component_name", "is_component", "registered", *_LAZY]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
