"""schedkit: compose, wire and test an LLM-serving scheduler from standalone components."""

from schedkit.component import component, component_name, is_component

__all__ = ["component", "component_name", "is_component"]
