"""From a wiring file to a running assembly: the wiring's data types (``wiring``), YAML read
into values with their lines (``yaml_values``), the wiring reader that merges overlays
(``yaml_reader``), validation before anything is built (``validate``), loading with overlays
(``loading``), late binding (``late_binding``) and the dependency-injector container
(``container``: each component's resource in ``component_resources``, ``!call`` arguments
bound to their targets in ``call_binding``). Imports run one way: wiring <- yaml_values <-
yaml_reader, validate <- loading <- container."""
