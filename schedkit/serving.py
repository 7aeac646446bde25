"""Shutting down a serving assembly: what is in flight finishes within a grace period, the
rest is aborted (each request still gets its final output)."""

from __future__ import annotations

import time

import structlog

from schedkit.assembly.container import Assembly

__all__ = ["drain"]

log = structlog.get_logger("schedkit.serve")


def drain(assembly: Assembly, grace: float) -> None:
    """Finish in-flight requests within ``grace`` seconds, then abort what is left."""
    scheduler = assembly["scheduler"]
    scheduler.continue_generation()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and scheduler.step():
        pass
    left = [r.rid for r in scheduler.waiting_queue] + [r.rid for r in scheduler.running_batch.reqs]
    if scheduler.chunked_req is not None:
        left.append(scheduler.chunked_req.rid)
    for rid in left:
        scheduler.abort_request(rid)
    scheduler.on_idle()
    if left:
        log.warning("aborted in-flight requests at shutdown", count=len(left))
