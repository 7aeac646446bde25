"""The serving routes around generation, with the shapes SGLang and vLLM send: health, model
and server info, load, cache and generation control, abort, and ``/metrics`` (the scheduler's
Prometheus exposition relayed)."""

from __future__ import annotations

import asyncio
import urllib.request
from importlib.metadata import version
from typing import Literal

import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from schedkit.components.io.io_struct import SamplingParamsInput
from schedkit.http.config import HttpConfig
from schedkit.http.engine_client import EngineClient
from schedkit.http.generation import read_json
from schedkit.http.openai_routes import json_response
from schedkit.http.protocol import ApiError

__all__ = ["ControlRoutes"]

HEALTH_TIMEOUT = 20.0


class PauseBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /pause_generation``."""

    mode: Literal["retract", "in_place"] = "retract"


class AbortBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /abort_request``: one rid, or every request (``abort_all``, admin only)."""

    rid: str = ""
    abort_all: bool = False


_pause_decoder = msgspec.json.Decoder(PauseBody)
_abort_decoder = msgspec.json.Decoder(AbortBody)


class ControlRoutes:
    """Health, info, load and control routes over one engine client."""

    def __init__(self, config: HttpConfig, engine: EngineClient) -> None:
        self.config = config
        self.engine = engine

    async def health(self, request: Request) -> Response:
        """``GET /health``: 200 when the scheduler answers a load query, else 503."""
        try:
            reply = await self.engine.control("get_loads", timeout=HEALTH_TIMEOUT)
        except (TimeoutError, ConnectionError):
            return Response(status_code=503)
        return Response(status_code=200 if reply.ok else 503)

    async def health_generate(self, request: Request) -> Response:
        """``GET /health_generate``: 200 once a one-token request comes back, else 503."""
        params = SamplingParamsInput(max_new_tokens=1)
        try:
            state = self.engine.submit("health", [0], params)
        except Exception:  # a full queue: not healthy enough to take a request now
            return Response(status_code=503)
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT):
                await state.wait_done()
        except TimeoutError:
            self.engine.abort(state)
            return Response(status_code=503)
        return Response(status_code=200 if state.error is None else 503)

    async def model_info(self, request: Request) -> Response:
        """``GET /get_model_info``."""
        model = self.config.model
        return json_response(
            {
                "model_path": model.name,
                "tokenizer_path": model.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            }
        )

    async def _loads(self) -> dict:
        try:
            reply = await self.engine.control("get_loads")
        except (TimeoutError, ConnectionError):
            raise ApiError(503, "the scheduler did not answer a load query") from None
        return reply.loads or {}

    async def server_info(self, request: Request) -> Response:
        """``GET /get_server_info``: settings (keys left out), the scheduler's load, version."""
        config = msgspec.to_builtins(self.config)
        config.pop("api_keys", None)
        config.pop("scheduler_admin_token", None)
        config.pop("admin_api_key", None)
        model = config.pop("model")
        return json_response(
            {
                **config,
                "model_path": model["name"],
                "served_model_name": model["name"],
                "tokenizer_path": model["tokenizer_path"],
                "context_length": model["context_length"],
                "vocab_size": model["vocab_size"],
                "internal_states": [await self._loads()],
                "version": version("schedkit"),
            }
        )

    async def get_load(self, request: Request) -> Response:
        """``GET /get_load``: SGLang's per-rank load (requests here and in the scheduler)."""
        loads = await self._loads()
        queued = self.engine.admission.queued
        waiting = loads.get("num_waiting_reqs", 0) + queued
        return json_response(
            [
                {
                    "dp_rank": loads.get("dp_rank") or 0,
                    "num_reqs": loads.get("num_running_reqs", 0) + waiting,
                    "num_waiting_reqs": waiting,
                    "num_tokens": loads.get("num_total_tokens", 0),
                }
            ]
        )

    async def vllm_load(self, request: Request) -> Response:
        """``GET /load``: vLLM's count of requests the server holds."""
        return json_response({"server_load": len(self.engine.states)})

    async def ping(self, request: Request) -> Response:
        """``GET /ping`` (and POST), as vLLM answers it."""
        return Response(status_code=200)

    async def flush_cache(self, request: Request) -> Response:
        """``POST /flush_cache``: 200 once the cache is empty, 400 while requests run."""
        reply = await self._control("flush")
        return PlainTextResponse(
            "Cache flushed.\n" if reply.ok else "Cache not flushed: requests are running.\n",
            200 if reply.ok else 400,
        )

    async def pause(self, request: Request) -> Response:
        """``POST /pause_generation`` with ``mode`` ``retract`` (default) or ``in_place``."""
        body = (
            await read_json(request, _pause_decoder, self.config)
            if await _has_body(request)
            else PauseBody()
        )
        await self._control("pause", body.mode)
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(self, request: Request) -> Response:
        """``POST /continue_generation``."""
        await self._control("continue")
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort(self, request: Request) -> Response:
        """``POST /abort_request``: the caller's own request by rid; another key's request or
        ``abort_all`` needs the admin key."""
        body = await read_json(request, _abort_decoder, self.config)
        admin = request.scope["schedkit.admin"]
        if body.abort_all:
            if not admin:
                raise ApiError(403, "abort_all needs the admin API key", "abort_all")
            states = list(self.engine.states.values())
        elif not body.rid:
            raise ApiError(400, "give the rid of a request to abort (or abort_all: true)", "rid")
        else:
            state = self.engine.states.get(body.rid)
            if state is None:
                raise ApiError(404, f"no request {body.rid!r} in flight", "rid")
            if state.key != request.scope["schedkit.key"] and not admin:
                raise ApiError(
                    403,
                    "this request was sent with another key; aborting it needs the admin API key",
                    "rid",
                )
            states = [state]
        for state in states:
            self.engine.abort(state)
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics``: the scheduler's Prometheus metrics."""
        port = self.config.metrics_port
        if port is None:
            raise ApiError(404, "metrics are off (the scheduler serves no Prometheus port)")
        try:
            body, content_type = await asyncio.to_thread(_fetch, f"http://127.0.0.1:{port}/metrics")
        except OSError as exc:
            raise ApiError(503, f"the scheduler's metrics did not answer: {exc}") from None
        return Response(body, 200, media_type=content_type)

    async def _control(self, kind: str, mode: str = "retract"):
        try:
            reply = await self.engine.control(kind, mode)
        except (TimeoutError, ConnectionError):
            raise ApiError(503, f"the scheduler did not answer {kind!r}") from None
        if not reply.ok and kind != "flush":
            raise ApiError(400, reply.message or f"{kind} failed")
        return reply


async def _has_body(request: Request) -> bool:
    return (
        request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
    )


def _fetch(url: str) -> tuple[bytes, str]:
    with urllib.request.urlopen(url, timeout=5) as response:  # loopback only
        return response.read(), response.headers.get("content-type", "text/plain")
