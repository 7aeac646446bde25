"""What fits in the next batch, after SGLang's ``schedule_policy.PrefillAdder`` and
``ScheduleBatch.retract_decode``: the scheduler's KV slots (``kv_slots``: pool plus evictable
cache), the new-token ratio that keeps room for running requests' remaining output
(``new_token_ratio``), one prefill pass's admission (``prefill_adder``), and a decode step's
slots and retractions (``decode_slots``). This module names them all in one place."""

from __future__ import annotations

from schedkit.components.scheduler.decode_slots import retract_decode, take_decode_slots
from schedkit.components.scheduler.kv_slots import KVSlots
from schedkit.components.scheduler.new_token_ratio import (
    CLIP_MAX_NEW_TOKENS,
    RETRACT_DECODE_STEPS,
    NewTokenRatio,
    remaining_new_tokens,
)
from schedkit.components.scheduler.prefill_adder import PrefillAdder

__all__ = [
    "CLIP_MAX_NEW_TOKENS",
    "RETRACT_DECODE_STEPS",
    "KVSlots",
    "NewTokenRatio",
    "PrefillAdder",
    "remaining_new_tokens",
    "retract_decode",
    "take_decode_slots",
]
