"""The front end's ASGI application: a guard that checks API keys and the declared body size,
then the generation routes served straight from ASGI, then Starlette's router for the rest.

Starlette rather than FastAPI on top of it: bodies are decoded and checked with msgspec in the
handlers, so FastAPI's models and OpenAPI schema go unused, and its extra middleware cost 27%
more front-end CPU per short request (379 against 298 us, medians of 3 interleaved runs).

Keys: with ``api_keys`` set, every route needs ``Authorization: Bearer KEY`` with one of them
(the admin key is accepted too); with ``admin_api_key`` set, ``/pause_generation``,
``/continue_generation``, ``/flush_cache`` and aborting another key's request need it. The
key a request came with (or, without keys, its connection) is what admission is fair
between.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from schedkit.http.config import HttpConfig
from schedkit.http.control_routes import ControlRoutes
from schedkit.http.engine_client import EngineClient
from schedkit.http.generation import Call, Generator
from schedkit.http.native_routes import NativeRoutes
from schedkit.http.openai_routes import OpenAIRoutes, error_response
from schedkit.http.protocol import ApiError
from schedkit.http.tokenizer import load_tokenizer

__all__ = ["build_app"]

ADMIN_PATHS = frozenset({"/pause_generation", "/continue_generation", "/flush_cache"})


class FastRoutes:
    """ASGI: the generation routes served straight from the guard, without Starlette's
    application, router, request and exception layers (their errors are ApiErrors, answered
    here); every other route goes on to ``app``."""

    def __init__(
        self, app: ASGIApp, routes: dict[str, Callable[[Call], Awaitable[ASGIApp]]]
    ) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = None
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.routes.get(scope["path"])
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(Call(scope, receive))
        except ApiError as error:
            response = error_response(error)
        await response(scope, receive, send)


class Guard:
    """ASGI middleware: API keys, the fairness key, ``Content-Length`` over the limit and a
    compressed body (refused: bodies are read as they come)."""

    def __init__(self, app: ASGIApp, config: HttpConfig) -> None:
        self.app = app
        self.api_keys = [key.encode() for key in config.api_keys]
        self.admin_key = config.admin_api_key.encode() if config.admin_api_key else None
        self.max_body = config.limits.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = None
        length = None
        encoding = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                token = value[7:].strip() if value[:7].lower() == b"bearer " else b""
            elif name == b"content-length":
                length = value
            elif name == b"content-encoding":
                encoding = value
        admin = self.admin_key is not None and token is not None and _same(token, self.admin_key)
        user = admin or not self.api_keys or (token is not None and self._known(token))
        error = None
        if not user:
            error = ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY")
        elif scope["path"] in ADMIN_PATHS and self.admin_key is not None and not admin:
            error = ApiError(403, f"{scope['path']} needs the admin API key")
        elif length is not None and (not length.isdigit() or int(length) > self.max_body):
            error = ApiError(413, f"request body over {self.max_body} bytes (max_body_bytes)")
        elif encoding is not None and encoding.strip().lower() != b"identity":
            shown = encoding.decode("latin-1")[:40]
            message = f"Content-Encoding {shown!r} is not supported; send the body uncompressed"
            error = ApiError(415, message)
        if error is not None:
            await error_response(error, {"connection": "close"})(scope, receive, send)
            return
        if token:
            scope["schedkit.key"] = "key:" + token.decode("latin-1")
        else:
            client = scope.get("client") or ("?", 0)
            scope["schedkit.key"] = f"conn:{client[0]}:{client[1]}"
        scope["schedkit.admin"] = admin or (self.admin_key is None and user)
        await self.app(scope, receive, send)

    def _known(self, token: bytes) -> bool:
        found = False
        for key in self.api_keys:  # every key compared: the time says nothing of which matched
            found |= _same(token, key)
        return found


def _same(token: bytes, key: bytes) -> bool:
    return hmac.compare_digest(token, key)


def _handler(
    method: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await method(request)
        except ApiError as error:
            return error_response(error)

    endpoint.__doc__ = method.__doc__
    return endpoint


def build_app(config: HttpConfig) -> tuple[ASGIApp, EngineClient]:
    """The application for ``config`` and its engine client (started with the app)."""
    engine = EngineClient(
        config.scheduler_endpoint,
        config.limits,
        config.scheduler_admin_token,
        scheduler_shares_keys=config.scheduler_shares_keys,
    )
    model = config.model
    tokenizer = load_tokenizer(model.tokenizer_path, model.vocab_size, model.eos_token_id)
    generator = Generator(config, engine, tokenizer)
    openai = OpenAIRoutes(generator)
    native = NativeRoutes(generator)
    control = ControlRoutes(config, engine)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        engine.start()
        try:
            yield
        finally:
            engine.close()

    app = Starlette(lifespan=lifespan)
    routes: list[tuple[str, Callable, list[str]]] = [
        ("/v1/completions", openai.completions, ["POST"]),
        ("/v1/chat/completions", openai.chat_completions, ["POST"]),
        ("/v1/models", openai.models, ["GET"]),
        ("/generate", native.generate, ["POST", "PUT"]),
        ("/health", control.health, ["GET"]),
        ("/health_generate", control.health_generate, ["GET"]),
        ("/get_model_info", control.model_info, ["GET"]),
        ("/model_info", control.model_info, ["GET"]),
        ("/get_server_info", control.server_info, ["GET"]),
        ("/server_info", control.server_info, ["GET"]),
        ("/get_load", control.get_load, ["GET"]),
        ("/flush_cache", control.flush_cache, ["GET", "POST"]),
        ("/pause_generation", control.pause, ["POST"]),
        ("/continue_generation", control.resume, ["POST"]),
        ("/abort_request", control.abort, ["POST"]),
        ("/load", control.vllm_load, ["GET"]),
        ("/ping", control.ping, ["GET", "POST"]),
        ("/metrics", control.metrics, ["GET"]),
    ]
    for path, method, methods in routes:
        app.router.add_route(path, _handler(method), methods=methods)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = "no such route" if status == 404 else f"method {request.method} not allowed"
        return error_response(ApiError(status, f"{message}: {request.method} {request.url.path}"))

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_found)
    fast = {
        "/v1/completions": openai.completions,
        "/v1/chat/completions": openai.chat_completions,
        "/generate": native.generate,
    }
    return Guard(FastRoutes(app, fast), config), engine
