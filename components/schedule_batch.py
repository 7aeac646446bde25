"""Moved to ``schedkit.core.schedule_batch``; this name stays importable for one release."""

from schedkit.core.schedule_batch import *  # noqa: F403
from schedkit.core.schedule_batch import __all__  # noqa: F401
