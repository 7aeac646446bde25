"""Ready test doubles for the scheduler's edges: a clock, an output sender and a KV-event
publisher that keep what they receive after a real encode/decode round trip, and log capture.

``FakeClock`` and ``RecordingOutputSender`` are components, so a wiring can select them
(``type: schedkit.testing.doubles:RecordingOutputSender``). ``CapturingEventPublisher`` is
registered as the KV-event publisher ``capture`` when this module is imported, so that a
wiring selects it with ``kv_events_config: {publisher: capture}`` (add
``plugins: [schedkit.testing.doubles]`` outside pytest).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
from structlog.testing import capture_logs

from schedkit.components.io.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    decode_output,
    encode,
)
from schedkit.core.component import component
from schedkit.core.schedule_batch import FinishReason
from schedkit.kv_events import KvEventsConfig, get_profile, register_publisher
from schedkit.kv_events.structs import EventBatch, KVEventBatch

__all__ = ["CapturingEventPublisher", "FakeClock", "RecordingOutputSender", "capture_logs"]


@component("fake_clock")
class FakeClock:
    """A clock that moves only when told: pass ``clock.now`` wherever a ``now`` callable goes."""

    start: float = 0.0
    time: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.time = self.start

    def now(self) -> float:
        """The current time in seconds."""
        return self.time

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` (>= 0); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward; got advance({seconds})")
        self.time += seconds
        return self.time


@component("recording_output_sender")
class RecordingOutputSender:
    """An output sender that keeps every message as a detokenizer would decode it.

    ``messages`` holds the decoded messages in order, ``outputs[rid]`` the concatenated new
    tokens of a request, ``finished[rid]`` its finish reason. Sending after ``close()`` is an
    error.
    """

    messages: list[BatchTokenIDOutput | BatchEmbeddingOutput] = attrs.field(
        init=False, factory=list
    )
    outputs: dict[str, list[int]] = attrs.field(init=False, factory=dict)
    finished: dict[str, FinishReason] = attrs.field(init=False, factory=dict)
    closed: bool = attrs.field(init=False, default=False)

    def send(self, msg: BatchTokenIDOutput | BatchEmbeddingOutput) -> None:
        """Encode ``msg``, decode it back and record the decoded message."""
        if self.closed:
            raise RuntimeError("send() on a closed RecordingOutputSender")
        msg = decode_output(encode(msg))
        self.messages.append(msg)
        token_ids = msg.output_ids if isinstance(msg, BatchTokenIDOutput) else None
        for i, rid in enumerate(msg.rids):
            if token_ids is not None:
                self.outputs.setdefault(rid, []).extend(token_ids[i])
            if msg.finished_reasons[i] is not None:
                self.finished[rid] = msg.finished_reasons[i]

    def close(self) -> None:
        """Refuse further sends; what was recorded stays readable."""
        self.closed = True


class CapturingEventPublisher:
    """A KV-event publisher that keeps each batch as a subscriber would decode it.

    ``publish`` stamps the DP rank on a batch without one (as the ZeroMQ publisher does),
    encodes it under the config's profile, decodes it back into ``batches`` and returns True;
    an encoding error is raised at once. Every instance is appended to ``instances`` (emptied
    before each test by the schedkit pytest plugin).
    """

    instances: ClassVar[list[CapturingEventPublisher]] = []

    def __init__(self, config: KvEventsConfig | None = None, dp_rank: int = 0) -> None:
        self.config = config or KvEventsConfig(publisher="capture")
        self.dp_rank = dp_rank
        self.batches: list[KVEventBatch] = []
        self.published = 0
        self.dropped = 0
        self.encode_errors = 0
        self.closed = False
        self._profile = get_profile(self.config.profile)
        CapturingEventPublisher.instances.append(self)

    @property
    def queue_depth(self) -> int:
        """Always 0: batches are handled when published."""
        return 0

    @property
    def events(self) -> list[Any]:
        """The events of every captured batch, in order."""
        return [event for batch in self.batches for event in batch.events]

    def publish(self, batch: EventBatch) -> bool:
        """Capture ``batch``; False (and a drop) after shutdown."""
        if self.closed:
            self.dropped += 1
            return False
        if batch.attn_dp_rank is None:
            batch.attn_dp_rank = self.dp_rank
        try:
            payload = self._profile.encode(batch)
        except Exception:
            self.encode_errors += 1
            raise
        self.batches.append(self._profile.decode(payload))
        self.published += 1
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Nothing is queued: True."""
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Refuse further batches."""
        self.closed = True


register_publisher("capture", CapturingEventPublisher, replace=True)
