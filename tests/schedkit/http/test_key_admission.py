"""Admission alone, without a connection: what goes out, in which order, and what the load
reports let through."""

from __future__ import annotations

import pytest

from schedkit.http.config import Limits
from schedkit.http.key_admission import KeyAdmission
from schedkit.http.request_state import Overloaded, RequestState


def _admission(**limits) -> tuple[KeyAdmission, list[bytes], list[int]]:
    sent: list[bytes] = []
    polls: list[int] = []
    admission = KeyAdmission(
        Limits(**limits),
        scheduler_shares_keys=False,
        send=sent.append,
        on_queued=lambda: polls.append(len(sent)),
    )
    return admission, sent, polls


def _state(rid: str, key: str, tokens: int = 1) -> RequestState:
    return RequestState(rid, key, rid.encode(), tokens)


def test_a_freed_slot_goes_to_the_queued_key_with_fewest_in_flight():
    admission, sent, polls = _admission(max_forwarded_requests=2)
    states = [_state(f"a{i}", "a") for i in range(3)] + [_state("b0", "b"), _state("b1", "b")]
    for state in states:
        admission.admit(state)
    assert sent == [b"a0", b"a1"] and admission.queued == 3
    assert states[0].message == b"" and states[2].message == b"a2"  # sent once, then dropped
    assert polls == [2, 2, 2]  # each pass that leaves requests queued asks for polling
    admission.finished(states[0])  # a: 1 in flight, b: 0
    assert sent[-1] == b"b0"
    admission.finished(states[1])  # a: 0, b: 1
    assert sent[-1] == b"a2"
    admission.unqueue(states[4])
    assert admission.queued == 0 and not admission.has_queued
    assert (admission.forwarded, admission.forwarded_tokens) == (2, 2)


def test_a_load_report_counts_the_requests_sent_after_it_was_made():
    admission, sent, _ = _admission(max_scheduler_waiting=2)
    first, second, third = _state("r0", "a", 5), _state("r1", "b", 7), _state("r2", "c", 1)
    admission.admit(first)
    counted = admission.sent
    admission.admit(second)
    admission.admit(third)
    assert sent == [b"r0", b"r1"] and admission.sent == (2, 12)
    # The scheduler admitted r0 before it reported; r1 was not counted yet: it still waits,
    # and the budget it leaves lets the queued r2 go.
    admission.loaded({"num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0}, counted)
    assert sent[-1] == b"r2"
    assert (admission.scheduler_waiting, admission.scheduler_waiting_tokens) == (2, 8)
    # An output's report counts what was sent before the previous output arrived.
    admission.output_arrived(None)
    admission.output_arrived({"num_waiting_reqs": 1, "num_waiting_uncached_tokens": 1})
    assert (admission.scheduler_waiting, admission.scheduler_waiting_tokens) == (1, 1)


def test_queued_prompt_tokens_are_bounded():
    """Requests wait here as encoded messages: their prompt tokens, not only their count, are
    held to a bound (one request always may wait)."""
    admission, sent, _ = _admission(max_forwarded_requests=1, max_queued_tokens=100)
    admission.admit(_state("first", "a", 10))
    big = _state("big", "a", 150)
    admission.admit(big)  # over the bound alone: it may wait, alone
    with pytest.raises(Overloaded) as refused:
        admission.admit(_state("more", "b", 1))
    assert refused.value.status == 503
    assert "150 prompt tokens queued (max_queued_tokens=100)" in str(refused.value)
    assert (admission.queued, admission.queued_tokens) == (1, 150)
    admission.unqueue(big)
    assert (admission.queued, admission.queued_tokens) == (0, 0)
    admission.admit(_state("now", "b", 60))
    admission.admit(_state("then", "c", 40))
    assert admission.queued_tokens == 100 and sent == [b"first"]
    with pytest.raises(Overloaded):
        admission.admit(_state("over", "d", 1))
