"""From a wiring file to a running assembly: the wiring's data types (``wiring``), the YAML
reader (``yaml_reader``), validation before anything is built (``validate``), loading with
overlays (``loading``), late binding (``late_binding``) and the dependency-injector container
(``container``). Imports run one way: wiring <- yaml_reader, validate <- loading <- container."""
