"""The HTTP front end's settings: where it listens, what it serves and every bound it keeps.

The scheduler process hands them to the front-end process as JSON on its standard input (API
keys never appear on a command line). Each limit is documented in docs/http.md.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["HttpConfig", "Limits", "ModelInfo", "parse_address"]

Positive = Annotated[int, msgspec.Meta(ge=1)]
# At most a day: a limit is finite (an infinite one would hold a connection for ever).
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0, le=86400)]


class Limits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one client, one connection or all of them together can make the server hold."""

    max_body_bytes: Positive = 8 << 20
    max_header_bytes: Positive = 16 << 10
    max_connections: Positive = 2048
    header_timeout: PositiveSeconds = 10.0
    body_timeout: PositiveSeconds = 30.0
    keep_alive_timeout: PositiveSeconds = 5.0
    send_timeout: PositiveSeconds = 30.0
    # Requests handed to the scheduler and not finished; the rest wait here, queued per key.
    max_forwarded_requests: Positive = 256
    max_forwarded_tokens: Positive = 1 << 20
    # Forwarded requests of one key not finished: a flood from one key cannot make the
    # scheduler's running batch (and so every step) arbitrarily large for the others.
    max_forwarded_per_key: Positive = 64
    # ...and at most this many more requests and prompt tokens than the key with the fewest
    # in flight (a key with none in flight always may send one): while another key's request
    # runs, a flood's new prefills (each a step before that request's next token) wait.
    max_key_lead: Positive = 16
    max_key_lead_tokens: Positive = 2048
    # Forwarded requests the scheduler has not admitted into a batch yet, and their prompt
    # tokens: past either, new ones wait here (where admission is fair) instead of in the
    # scheduler's queue, whose policy knows nothing of keys and whose prefill steps another
    # key's request would share.
    max_scheduler_waiting: Positive = 64
    max_scheduler_waiting_tokens: Positive = 1024
    load_poll_seconds: PositiveSeconds = 0.01
    max_queued_per_key: Positive = 1024
    max_queued: Positive = 8192
    # Prompt tokens queued here, held as encoded messages (1-5 bytes a token): at most ~80 MiB.
    max_queued_tokens: Positive = 1 << 24
    retry_after_seconds: Positive = 1


class ModelInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the front end says about the model and needs for tokenizing."""

    name: str = "schedkit-sim"
    vocab_size: Positive = 32000
    eos_token_id: int | None = None
    context_length: Positive = 32768
    tokenizer_path: str | None = None


class HttpConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything the front-end process needs: its address, the scheduler's internal ZeroMQ
    endpoint, the scheduler's Prometheus port, keys (any of ``api_keys`` is a user's key),
    model and limits."""

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 30000
    scheduler_endpoint: str = ""
    # The token the scheduler's zmq_server wants on pause, continue and flush.
    scheduler_admin_token: str | None = None
    metrics_port: int | None = None
    api_keys: list[str] = []
    admin_api_key: str | None = None
    model: ModelInfo = ModelInfo()
    limits: Limits = Limits()
    allow_remote: bool = False
    # The scheduler shares its batch between keys, lightest first (``client_of``): a key's
    # request with nothing in flight may then skip the scheduler's waiting budgets.
    scheduler_shares_keys: bool = False


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``PORT`` alone, on 127.0.0.1) as a pair; raises ValueError naming
    what would be valid."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(
            f"expected HOST:PORT with a port in 0-65535, e.g. 127.0.0.1:30000; got {text!r}"
        )
    return host, int(port)
