"""The request edge's limits on requests taken and not yet finished ("waiting"), per client and
in total, with the texts that name the limit a refused request ran into."""

from __future__ import annotations

import attrs

from schedkit.core.component import at_least

__all__ = ["WaitingLimits"]


@attrs.define(slots=True, kw_only=True)
class WaitingLimits:
    """Waiting requests and prompt tokens, per client and in total."""

    per_client_requests: int = attrs.field(validator=at_least(1))
    per_client_tokens: int = attrs.field(validator=at_least(1))
    total_requests: int = attrs.field(validator=at_least(1))
    total_tokens: int = attrs.field(validator=at_least(1))

    def client_full(self, requests: int, tokens: int) -> str | None:
        """Why a client with ``requests``/``tokens`` waiting may not add any request, or None."""
        if requests >= self.per_client_requests:
            return (
                f"this client already has {requests} requests waiting "
                f"(max_waiting_requests_per_client={self.per_client_requests}); "
                "send more once some finish"
            )
        if tokens >= self.per_client_tokens:
            return (
                f"this client already has {tokens} prompt tokens waiting "
                f"(max_waiting_tokens_per_client={self.per_client_tokens}); "
                "send more once some finish"
            )
        return None

    def client_over(self, requests: int, tokens: int, more: int) -> str | None:
        """Why a client with ``requests``/``tokens`` waiting may not add a request of ``more``
        prompt tokens, or None."""
        full = self.client_full(requests, tokens)
        if full is not None:
            return full
        if tokens + more > self.per_client_tokens:
            return (
                f"{more} prompt tokens would bring this client's waiting tokens to "
                f"{tokens + more} (max_waiting_tokens_per_client="
                f"{self.per_client_tokens}); send it once some requests finish"
            )
        return None

    def total_over(self, requests: int, tokens: int, more: int) -> str | None:
        """Why the server with ``requests``/``tokens`` waiting may not add a request of
        ``more`` prompt tokens, or None."""
        if requests >= self.total_requests:
            return (
                f"the server has {requests} requests waiting "
                f"(max_waiting_requests={self.total_requests}); retry later"
            )
        if tokens + more > self.total_tokens:
            return (
                f"{more} prompt tokens would bring the server's waiting tokens to "
                f"{tokens + more} (max_waiting_tokens={self.total_tokens}); retry later"
            )
        return None
