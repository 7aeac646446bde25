"""Fixtures for the KV-event tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def closing():
    """Register publishers and subscribers; they are shut down after the test."""
    objects = []
    yield lambda obj: objects.append(obj) or obj
    for obj in reversed(objects):
        if hasattr(obj, "shutdown"):
            obj.shutdown(timeout=1.0)
        else:
            obj.close()
