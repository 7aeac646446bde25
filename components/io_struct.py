"""Moved to ``schedkit.components.io.io_struct``; this name stays importable for one release."""

from schedkit.components.io.io_struct import *  # noqa: F403
from schedkit.components.io.io_struct import __all__  # noqa: F401
