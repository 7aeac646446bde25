"""Testing schedkit components and assemblies.

- ``fake(ComponentClass, **attributes)``: a recording double with exactly a component's fields
  and methods, signatures checked (``schedkit.testing.fakes``); ``fake(Protocol)`` the same of
  a protocol, which raises ``UnconfiguredCall`` for a return value it was not given.
- ``isolate(name, source=None, **overrides)``: one component of a wiring (``wiring.yaml`` in
  the working directory, else the shipped one), built with fakes for every neighbour
  (``schedkit.testing.isolation``).
- Ready doubles: ``FakeClock``, ``RecordingOutputSender``, ``CapturingEventPublisher`` (the
  ``capture`` KV-event publisher) and ``capture_logs()`` (``schedkit.testing.doubles``).
- ``FaultyPublisher``: a KV-event publisher that drops, duplicates, holds, reorders, bursts
  and restarts on demand, for testing a router's recovery (``schedkit.testing.faults``).
- ``cache_page_hashes(cache)``: the page hashes a radix cache holds, to compare with what its
  events say (``schedkit.testing.caches``).
- ``start_serve()``, ``free_endpoint()``, ``peak_rss_mib(pid)``: a real ``schedkit serve`` in a
  child process on free loopback ports (``schedkit.testing.serving``).
- ``LeakCheck``: finds assemblies not shut down, threads and ZeroMQ sockets left behind
  (``schedkit.testing.leaks``).
- The pytest plugin (``schedkit.testing.plugin``): the ``make_assembly``, ``fake_component``
  (a protocol fake by wiring key), ``faulty_kv_publisher`` and ``assembly_leak_check``
  fixtures.

Names load on first use, so that the pytest plugin in this package imports nothing heavy.
Guide: docs/testing.md.
"""

from __future__ import annotations

from schedkit._lazy import lazy_attributes

_LAZY = {
    "Call": "schedkit.testing.fakes",
    "fake": "schedkit.testing.fakes",
    "UnconfiguredCall": "schedkit.testing.fakes",
    "Isolated": "schedkit.testing.isolation",
    "isolate": "schedkit.testing.isolation",
    "CapturingEventPublisher": "schedkit.testing.doubles",
    "FakeClock": "schedkit.testing.doubles",
    "RecordingOutputSender": "schedkit.testing.doubles",
    "capture_logs": "schedkit.testing.doubles",
    "cache_page_hashes": "schedkit.testing.caches",
    "FaultyPublisher": "schedkit.testing.faults",
    "LeakCheck": "schedkit.testing.leaks",
    "LeakError": "schedkit.testing.leaks",
    "free_endpoint": "schedkit.testing.serving",
    "peak_rss_mib": "schedkit.testing.serving",
    "start_serve": "schedkit.testing.serving",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
