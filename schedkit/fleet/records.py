"""``schedkit fleet --output FILE.jsonl``: one JSON line per request that ended, whatever its
outcome, with the worker it ended on (null: at the router) and its latencies in seconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

import msgspec

from schedkit.core.schedule_batch import Req
from schedkit.fleet.admission import Outcome

__all__ = ["RecordRequest", "request_record", "request_writer"]

RecordRequest = Callable[[Req, "int | None", Outcome, float], None]


def _since(later: float | None, earlier: float) -> float | None:
    return None if later is None else later - earlier


def request_record(req: Req, worker: int | None, outcome: Outcome, start: float) -> dict:
    """The record of ``req``; ``start`` is its worker's clock at the start of the run (its
    times are on that clock)."""
    arrival = req.arrival_time
    return {
        "rid": req.rid,
        "worker": worker,
        "outcome": outcome,
        "arrival_s": arrival - start,
        "prompt_tokens": len(req.origin_input_ids),
        "output_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "queue_time_s": _since(req.scheduled_time, arrival),
        "ttft_s": _since(req.first_token_time, arrival),
        "e2e_s": _since(req.finish_time, arrival) if outcome == "done" else None,
        "finish": msgspec.to_builtins(req.finished_reason),
    }


def request_writer(out: TextIO, extra: dict | None = None) -> RecordRequest:
    """A ``record(req, worker, outcome, start)`` writing each record, with ``extra``'s keys
    (e.g. the run's speedup in a sweep), as a line to ``out``."""
    encode = msgspec.json.Encoder().encode
    extra = extra or {}

    def record(req: Req, worker: int | None, outcome: Outcome, start: float) -> None:
        line = {**extra, **request_record(req, worker, outcome, start)}
        out.write(encode(line).decode() + "\n")

    return record
