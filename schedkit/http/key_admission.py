"""Admission from the front end to the scheduler, fair between API keys.

Requests handed to the scheduler and not yet finished ("forwarded") are bounded in number and
prompt tokens (``Limits.max_forwarded_*``), and per key: at most ``max_forwarded_per_key``,
and at most ``max_key_lead`` more than the key with the fewest in flight, so that one key's
flood can neither make the running batch, and with it every step, arbitrarily large for the
others, nor keep adding prefill steps in front of each token of another key's request. Those
the scheduler has not admitted into a batch yet are bounded in number and prompt tokens
(``max_scheduler_waiting``, ``max_scheduler_waiting_tokens``; estimated from the load the
scheduler attaches to outputs and from ``get_loads`` polled every ``load_poll_seconds`` while
requests are queued here, plus what was forwarded since): the scheduler's own queue stays
short, so its policy cannot put a small request behind a flood, and the prefill step a small
request joins holds few of the flood's prompt tokens. When the scheduler shares its batch
between keys (``scheduler_shares_keys``, as ``schedkit serve --http`` wires it), a request of a
key with none in flight goes past those two budgets at once (one per key; the forwarded bounds
still hold): the scheduler admits the lightest key first, so another key's waiting flood cannot
hold that request back, and held here until the step in progress reports, it would miss the
next step too. The rest wait here in one queue per key, and a freed slot goes to the queued
key with the fewest requests in flight. Queues are bounded per key and in total.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import islice

from schedkit.http.config import Limits
from schedkit.http.request_state import Overloaded, RequestState

__all__ = ["KeyAdmission"]

# Queued keys compared for each freed slot.
_SCAN = 32


class KeyAdmission:
    """Which requests go to the scheduler now and which wait here, one queue per key.

    ``send`` puts a request's message on the scheduler connection; ``on_queued`` is called
    after each pass that leaves requests queued (the engine client then polls the scheduler's
    load, which no output reports while its queue empties).
    """

    def __init__(
        self,
        limits: Limits,
        *,
        scheduler_shares_keys: bool,
        send: Callable[[bytes], None],
        on_queued: Callable[[], None],
    ) -> None:
        self.limits = limits
        self.scheduler_shares_keys = scheduler_shares_keys
        self.forwarded = 0
        self.forwarded_tokens = 0
        self.queued = 0
        self.queued_tokens = 0
        # What the scheduler has not admitted yet: its last report plus what was sent since.
        self.scheduler_waiting = 0
        self.scheduler_waiting_tokens = 0
        # Requests and prompt tokens forwarded so far, and those counts when the last output
        # arrived: a load report counts only what the scheduler had read when it was made.
        self._sent = (0, 0)
        self._sent_at_output = (0, 0)
        self._queues: dict[str, deque[RequestState]] = {}
        self._turns: deque[str] = deque()
        self._in_flight: dict[str, int] = {}
        self._in_flight_tokens: dict[str, int] = {}
        self._send = send
        self._on_queued = on_queued

    @property
    def has_queued(self) -> bool:
        """Whether requests wait here."""
        return bool(self._queues)

    @property
    def sent(self) -> tuple[int, int]:
        """Requests and prompt tokens forwarded so far."""
        return self._sent

    def admit(self, state: RequestState) -> None:
        """Send ``state`` now, or queue it under its key; raises ``Overloaded`` when its key's
        queue or every queue together is full."""
        key = state.key
        # With the scheduler sharing between keys, a key with nothing here or there does not
        # wait behind others' queues.
        newcomer = (
            self.scheduler_shares_keys and key not in self._in_flight and key not in self._queues
        )
        if (newcomer or not self._queues) and self._fits(state):
            self._forward(state)
            return
        limits = self.limits
        queue = self._queues.get(key)
        if queue is not None and len(queue) >= limits.max_queued_per_key:
            raise Overloaded(
                429,
                f"this key has {len(queue)} requests queued (max_queued_per_key="
                f"{limits.max_queued_per_key}); send more once some finish",
            )
        if self.queued >= limits.max_queued:
            raise Overloaded(
                503,
                f"the server has {self.queued} requests queued (max_queued={limits.max_queued})",
            )
        if self.queued and self.queued_tokens + state.prompt_tokens > limits.max_queued_tokens:
            raise Overloaded(
                503,
                f"the server has {self.queued_tokens} prompt tokens queued (max_queued_tokens="
                f"{limits.max_queued_tokens})",
            )
        if queue is None:
            queue = self._queues[key] = deque()
            self._turns.append(key)
        queue.append(state)
        self.queued += 1
        self.queued_tokens += state.prompt_tokens
        self._pump()

    def unqueue(self, state: RequestState) -> None:
        """Take a request that was not forwarded out of its key's queue."""
        queue = self._queues.get(state.key)
        if queue is not None and state in queue:
            queue.remove(state)
            self.queued -= 1
            self.queued_tokens -= state.prompt_tokens
            if not queue:
                del self._queues[state.key]
                self._turns.remove(state.key)

    def _fits(self, state: RequestState) -> bool:
        if self.forwarded == 0:
            return True  # one request always fits (the prompt limit bounds its tokens)
        limits = self.limits
        if (
            self.forwarded >= limits.max_forwarded_requests
            or self.forwarded_tokens + state.prompt_tokens > limits.max_forwarded_tokens
        ):
            return False
        if self.scheduler_shares_keys and state.key not in self._in_flight:
            # A key with nothing in the scheduler goes past its waiting budgets: the scheduler
            # admits the lightest key first, so other keys' waiting requests do not hold it
            # back, and held here it would miss the step after the one in progress too.
            return True
        waiting_tokens = self.scheduler_waiting_tokens
        return (
            self.scheduler_waiting < limits.max_scheduler_waiting
            # A prompt longer than the budget goes once the scheduler's queue is empty.
            and (
                waiting_tokens == 0
                or waiting_tokens + state.prompt_tokens <= limits.max_scheduler_waiting_tokens
            )
            and self._within_lead(state.key)
        )

    def _within_lead(self, key: str) -> bool:
        """Whether ``key`` may send one more request: one with none in flight always may;
        else at most ``max_forwarded_per_key``, and at most ``max_key_lead`` requests and
        ``max_key_lead_tokens`` prompt tokens in flight more than the key with the fewest (so
        that, while a light key's request runs, a flood adds no prefill steps in front of
        each of its tokens)."""
        mine = self._in_flight.get(key, 0)
        if mine == 0:
            return True
        limits = self.limits
        if mine >= limits.max_forwarded_per_key:
            return False
        lead = limits.max_key_lead
        if mine >= lead and mine >= min(self._in_flight.values()) + lead:
            return False
        tokens, lead_tokens = self._in_flight_tokens[key], limits.max_key_lead_tokens
        return tokens < lead_tokens or tokens < min(self._in_flight_tokens.values()) + lead_tokens

    def _forward(self, state: RequestState) -> None:
        state.forwarded = True
        self._in_flight[state.key] = self._in_flight.get(state.key, 0) + 1
        tokens = self._in_flight_tokens
        tokens[state.key] = tokens.get(state.key, 0) + state.prompt_tokens
        self.forwarded += 1
        self.scheduler_waiting += 1
        self.scheduler_waiting_tokens += state.prompt_tokens
        requests, tokens = self._sent
        self._sent = (requests + 1, tokens + state.prompt_tokens)
        self.forwarded_tokens += state.prompt_tokens
        message, state.message = state.message, b""
        self._send(message)

    def _pump(self) -> None:
        """Forward queued requests while they fit, each time from the key with the fewest
        requests in flight among the first ``_SCAN`` keys in turn (the earliest among
        equals; when its request does not fit, the slot waits for it rather than going to a
        key with more in flight)."""
        turns, queues, in_flight = self._turns, self._queues, self._in_flight
        while turns:
            # The first keys in turn only: without API keys each connection is a key, and
            # a scan of every queued one would make admission cost grow with the queue.
            key = min(islice(turns, _SCAN), key=lambda k: in_flight.get(k, 0))
            queue = queues[key]
            if not self._fits(queue[0]):
                break
            state = queue.popleft()
            self.queued -= 1
            self.queued_tokens -= state.prompt_tokens
            turns.remove(key)
            if queue:
                turns.append(key)
            else:
                del queues[key]
            self._forward(state)
        if self._queues:
            self._on_queued()

    def output_arrived(self, load: dict | None) -> None:
        """A step's output came, with the scheduler's load report if it carried one."""
        # A step's report counts the requests read when the step began: about those
        # forwarded before the previous step's output arrived.
        counted, self._sent_at_output = self._sent_at_output, self._sent
        if load is not None:
            self.loaded(load, counted)

    def loaded(self, loads: dict, counted: tuple[int, int]) -> None:
        """Take the scheduler's report of its queue, made once it had read the requests
        counted in ``counted`` (forwarded requests and tokens then): those sent since wait
        too."""
        waiting = loads.get("num_waiting_reqs")
        if isinstance(waiting, int):
            tokens = loads.get("num_waiting_uncached_tokens")
            if not isinstance(tokens, int):
                tokens = 0 if waiting == 0 else self.scheduler_waiting_tokens
            requests_since = self._sent[0] - counted[0]
            tokens_since = self._sent[1] - counted[1]
            self.scheduler_waiting = waiting + requests_since
            self.scheduler_waiting_tokens = tokens + tokens_since
            if self._queues:
                self._pump()

    def finished(self, state: RequestState) -> None:
        """A request ended: its slot and tokens are free for the queued ones."""
        if state.forwarded:
            left = self._in_flight[state.key] - 1
            if left:
                self._in_flight[state.key] = left
                self._in_flight_tokens[state.key] -= state.prompt_tokens
            else:
                del self._in_flight[state.key]
                del self._in_flight_tokens[state.key]
            self.forwarded -= 1
            self.forwarded_tokens -= state.prompt_tokens
        if self._queues:
            self._pump()
