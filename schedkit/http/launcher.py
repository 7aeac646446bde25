"""The ``http_server`` component: starts the HTTP front-end process next to the scheduler and
stops it at shutdown.

The front end connects to the scheduler's ``zmq_server`` (``scheduler_endpoint``, normally
``!ref request_receiver.bound_endpoint``) as one client; ``schedkit serve --http HOST:PORT``
adds this component to the wiring. Its settings reach the child as JSON on its standard input,
so API keys never appear in a process listing.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any

import attrs
import msgspec

from schedkit.assembly.wiring import Ref
from schedkit.core.component import ArgumentError, at_least, component
from schedkit.http.config import HttpConfig, Limits, ModelInfo, parse_address

__all__ = ["HttpServer", "front_end_overlay"]


def front_end_overlay(http_args: dict, admin_token: str, model_name: str) -> dict:
    """The wiring overlay that adds the front end to a scheduler whose ``request_receiver`` is
    a ``zmq_server``: metrics on (Prometheus on a free loopback port, relayed at ``/metrics``),
    the receiver's ``admin_token`` (the front end's pause, continue and flush need it) and the
    ``http_server`` with ``http_args`` (address, keys, limits, ...), connected to the
    receiver, with the model runner's vocabulary and end-of-sequence id."""

    def ref(target: str, *attributes: str) -> Ref:
        return Ref("ref", target, attributes)

    server_args = {
        **http_args,
        "scheduler_endpoint": ref("request_receiver", "bound_endpoint"),
        "scheduler_admin_token": admin_token,
        "metrics_port": ref("metrics_reporter", "collector", "prometheus_port"),
        "vocab_size": ref("model_runner", "vocab_size"),
        "eos_token_id": ref("model_runner", "eos_token_id"),
    }
    return {
        "components": {
            "metrics_reporter": {
                "args": {"enable_metrics": True, "prometheus_port": 0, "model_name": model_name}
            },
            "request_receiver": {"args": {"admin_token": admin_token}},
            "http_server": {"type": "http_server", "args": server_args},
        }
    }


def _check_key(argument: str, name: str, key: object) -> None:
    """An API key is what a client can send after ``Bearer ``: printable ASCII without spaces
    (an empty key would leave every route open, and the server would say nothing)."""
    if not isinstance(key, str) or not key or not all("!" <= c <= "~" for c in key):
        raise ArgumentError(
            argument,
            f"{name}: an API key is 1 or more printable ASCII characters without spaces, "
            f"got {key!r}",
        )


def _address(instance: object, attribute: attrs.Attribute, value: str) -> None:
    parse_address(value)


@component("http_server")
class HttpServer:
    """The OpenAI-compatible front end as a child process (see docs/http.md); ``url`` is where
    it listens (port 0 picks a free one)."""

    address: str = attrs.field(default="127.0.0.1:30000", validator=_address)
    scheduler_endpoint: str
    scheduler_admin_token: str | None = attrs.field(default=None, repr=False)
    metrics_port: int | None = None
    api_keys: list[str] = attrs.Factory(list)
    admin_api_key: str | None = None
    allow_remote: bool = False
    model_name: str = "schedkit-sim"
    vocab_size: int = attrs.field(default=32000, validator=at_least(256))
    eos_token_id: int | None = None
    context_length: int = attrs.field(default=32768, validator=at_least(2))
    tokenizer_path: str | None = None
    limits: dict[str, int | float] = attrs.Factory(dict)
    # Whether the scheduler shares its batch between keys (``client_of``; docs/http.md).
    scheduler_shares_keys: bool = False
    startup_timeout: float = 30.0
    url: str = attrs.field(init=False, default="")
    _process: subprocess.Popen | None = attrs.field(init=False, default=None, repr=False)

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too): a
        loopback address unless ``allow_remote``, and limits the front end knows."""
        try:
            host, _ = parse_address(args.address)
        except ValueError as exc:
            raise ArgumentError("address", str(exc)) from None
        if not args.allow_remote and host not in ("127.0.0.1", "localhost", "::1"):
            raise ArgumentError(
                "address",
                f"refusing to listen on {args.address!r}: not a loopback address; use "
                "127.0.0.1, or set allow_remote: true (--http-allow-remote) to listen on others",
            )
        for i, key in enumerate(args.api_keys):
            _check_key("api_keys", f"api_keys[{i}]", key)
        if args.admin_api_key is not None:
            _check_key("admin_api_key", "admin_api_key", args.admin_api_key)
        try:
            msgspec.convert(args.limits, Limits)
        except msgspec.ValidationError as exc:
            raise ArgumentError(
                "limits", f"limits: {exc}; valid keys: {', '.join(Limits.__struct_fields__)}"
            ) from None

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        host, port = parse_address(self.address)
        limits = msgspec.convert(self.limits, Limits)
        config = HttpConfig(
            host=host,
            port=port,
            scheduler_endpoint=self.scheduler_endpoint,
            scheduler_admin_token=self.scheduler_admin_token,
            metrics_port=self.metrics_port,
            api_keys=list(self.api_keys),
            admin_api_key=self.admin_api_key,
            model=ModelInfo(
                name=self.model_name,
                vocab_size=self.vocab_size,
                eos_token_id=self.eos_token_id,
                context_length=self.context_length,
                tokenizer_path=self.tokenizer_path,
            ),
            limits=limits,
            allow_remote=self.allow_remote,
            scheduler_shares_keys=self.scheduler_shares_keys,
        )
        self._process = process = subprocess.Popen(
            [sys.executable, "-m", "schedkit.http"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        process.stdin.write(msgspec.json.encode(config))
        process.stdin.close()
        self.url = self._wait_ready(process)

    def _wait_ready(self, process: subprocess.Popen) -> str:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            readable, _, _ = select.select([process.stdout], [], [], 0.1)
            if readable:
                line = process.stdout.readline()
                if line:
                    return json.loads(line)["http"]
            if process.poll() is not None:
                raise ValueError(
                    f"the HTTP front end on {self.address} exited with status "
                    f"{process.returncode} (its error is printed above)"
                )
        self.close()
        raise ValueError(f"the HTTP front end did not start within {self.startup_timeout:g} s")

    @property
    def exited(self) -> bool:
        """True once the front-end process has ended (before ``close()``)."""
        return self._process is not None and self._process.poll() is not None

    @property
    def pid(self) -> int | None:
        """The front-end process id."""
        return None if self._process is None else self._process.pid

    def close(self) -> None:
        """Stop the front end (SIGTERM, then SIGKILL after 5 s)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
