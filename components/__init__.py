"""schedkit's component library: every module here registers its components on import.

The package is advertised under the ``schedkit.components`` entry-point group, so loading the
registry imports all of it.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
