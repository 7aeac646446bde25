"""``session``: session affinity. Every request of a conversation goes to the worker its first
request went to, as a gateway routing by a session header or cookie does (llm-d's
``session-affinity-scorer``, the SGLang gateway's ``manual`` policy keyed by a routing key).

The conversation key is the request's ``routing_key`` (SGLang's ``Req.routing_key``, the
``routing_key`` of a JSONL trace line), else its ``cache_salt``, else its ``extra_key`` (the
namespaces a client gives a user's or a conversation's cache). A request without one, or whose
worker has left, goes to the worker with the fewest tokens in flight (then the fewest sent so
far), which the key then sticks to. Keys are kept for the ``max_sessions`` most recently seen
conversations (least recently seen leave first). Signals: prefill and decode tokens (for new
conversations).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

import attrs

from schedkit.router.base import Candidates, register_policy

__all__ = ["SessionAffinity"]


@register_policy
@attrs.define(kw_only=True)
class SessionAffinity:
    """A conversation's requests to one worker (see the module docstring)."""

    name: ClassVar[str] = "session"
    signals: ClassVar[tuple[str, ...]] = ("prefill_tokens", "decode_tokens")
    uses_prefix: ClassVar[bool] = False
    uses_pending: ClassVar[bool] = False

    max_sessions: int = attrs.field(default=65_536, validator=attrs.validators.ge(1))
    _sessions: OrderedDict[str, int] = attrs.field(factory=OrderedDict, init=False)

    def choose(self, c: Candidates) -> tuple[int, str]:
        """The conversation's worker, or the least loaded by tokens for a new one."""
        key = c.session
        if key is not None:
            rank = self._sessions.get(key)
            if rank is not None and rank in c.loads.workers and rank in c.ranks:
                self._sessions.move_to_end(key)
                return rank, "session"
        workers = c.loads.workers
        rank = min(c.ranks, key=lambda r: (workers[r].tokens, workers[r].routed))
        if key is not None:
            self._sessions[key] = rank
            self._sessions.move_to_end(key)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return rank, "new_session" if key is not None else "no_session"
