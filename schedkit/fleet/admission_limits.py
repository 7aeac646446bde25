"""The caps of a fleet's admission control: what one worker and the router queue may hold, the
timeout to first token, and the summary line that names them."""

from __future__ import annotations

import attrs

__all__ = ["AdmissionLimits", "QueueLimits", "describe_admission"]


def _positive(_: object, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{attribute.name} must be > 0 (or None: no limit), got {value!r}")


@attrs.frozen(kw_only=True)
class QueueLimits:
    """A cap on what one place holds: ``max_requests`` requests and ``max_tokens`` prompt
    tokens (None: no cap)."""

    max_requests: int | None = attrs.field(default=None, validator=_positive)
    max_tokens: int | None = attrs.field(default=None, validator=_positive)

    def admits(self, requests: int, tokens: int, prompt_tokens: int) -> bool:
        """Whether one more request of ``prompt_tokens`` fits beside ``requests`` held
        requests of ``tokens`` prompt tokens."""
        if self.max_requests is not None and requests >= self.max_requests:
            return False
        return self.max_tokens is None or tokens + prompt_tokens <= self.max_tokens

    def never_admits(self, prompt_tokens: int) -> bool:
        """True when a request of ``prompt_tokens`` exceeds the token cap on its own."""
        return self.max_tokens is not None and prompt_tokens > self.max_tokens


@attrs.frozen(kw_only=True)
class AdmissionLimits:
    """The fleet's admission control (see the module docstring)."""

    worker: QueueLimits = QueueLimits()
    router: QueueLimits | None = None
    timeout: float | None = attrs.field(default=None, validator=_positive)

    @property
    def configured(self) -> bool:
        """True when any limit was asked for (refusals are then an expected outcome)."""
        return self != AdmissionLimits()


def _caps(limits: QueueLimits) -> str:
    caps = []
    if limits.max_requests is not None:
        caps.append(f"{limits.max_requests} requests")
    if limits.max_tokens is not None:
        caps.append(f"{limits.max_tokens} prompt tokens")
    return " and ".join(caps) or "no cap"


def describe_admission(limits: AdmissionLimits) -> str:
    """One line for the summary: each worker's cap, the router queue's, the timeout."""
    if not limits.configured:
        return "none"
    parts = [f"each worker holds at most {_caps(limits.worker)}"]
    if limits.router is None:
        parts.append("no router queue")
    else:
        parts.append(f"router queue of at most {_caps(limits.router)}")
    if limits.timeout is not None:
        parts.append(f"timeout {limits.timeout:g} s to first token")
    return "; ".join(parts)
