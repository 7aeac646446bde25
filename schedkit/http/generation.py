"""What every generation route shares: reading a bounded body, turning prompts into checked
token ids, following a request to its end while watching for the client leaving, and the
Server-Sent-Events response that streams it.

A client that disconnects has its request aborted (the scheduler frees its KV), streaming or
not; a client that stops reading a stream for ``send_timeout`` seconds is disconnected and its
request aborted the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

import msgspec
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from schedkit.components.io.io_struct import SamplingParamsInput
from schedkit.http.config import HttpConfig
from schedkit.http.engine_client import EngineClient, Overloaded, RequestState
from schedkit.http.protocol import ApiError
from schedkit.http.responses import chunk_writer
from schedkit.http.tokenizer import ByteTokenizer, HfTokenizer

__all__ = ["Call", "EventStream", "Generator", "SendWatch", "read_json"]

DONE = b"data: [DONE]\n\n"


class Call:
    """One HTTP request as the routes read it: its ASGI scope and ``receive`` (a Starlette
    ``Request`` has the same two attributes)."""

    __slots__ = ("receive", "scope")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self.receive = receive


async def read_json(request: Call | Request, decoder: msgspec.json.Decoder, config: HttpConfig):
    """The body decoded by ``decoder``; ApiError 413 past ``max_body_bytes``, 400 for bad JSON
    (naming the place), bad UTF-8 or nesting too deep. (``body_timeout`` is kept by the
    server's protocol, which answers 408 and closes the connection: ``receive`` then reports
    the disconnect.)"""
    limit = config.limits.max_body_bytes
    receive = request.receive
    message = await receive()
    if message["type"] != "http.request":
        raise ApiError(400, "the client disconnected before its body arrived")
    body = message.get("body", b"")
    if message.get("more_body", False):
        chunks, size = [body], len(body)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ApiError(400, "the client disconnected before its body arrived")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body over {limit} bytes (max_body_bytes)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
    elif len(body) > limit:
        raise ApiError(413, f"request body over {limit} bytes (max_body_bytes)")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if "at `$." in text:
            param = text.rsplit("at `$.", 1)[1].rstrip("`")
        elif "unknown field `" in text:
            param = text.split("unknown field `", 1)[1].split("`", 1)[0]
        else:
            param = None
        raise ApiError(400, text, param) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8: {exc}") from None
    except RecursionError:
        raise ApiError(400, "request body nests too deeply") from None


class Generator:
    """Prompts in, finished or streamed requests out, for every generation route."""

    def __init__(
        self, config: HttpConfig, engine: EngineClient, tokenizer: ByteTokenizer | HfTokenizer
    ) -> None:
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.vocab_size = config.model.vocab_size
        self.context_length = config.model.context_length
        self.send_watch = SendWatch(config.limits.send_timeout)

    def token_ids(self, prompt: str | list[int], param: str) -> list[int]:
        """The checked token ids of a prompt: text is tokenized, ids must be in the
        vocabulary, and the prompt must leave room in the context."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        if not ids:
            raise ApiError(400, f"{param} is empty; give at least one token", param)
        if len(ids) >= self.context_length:
            raise ApiError(
                400,
                f"{param} has {len(ids)} tokens; this model's context is {self.context_length} "
                "tokens, and at least one must be left to generate",
                param,
            )
        if not isinstance(prompt, str) and max(ids) >= self.vocab_size:
            raise ApiError(
                400,
                f"{param} holds token id {max(ids)}; ids must be below the vocabulary size "
                f"{self.vocab_size}",
                param,
            )
        return ids

    def max_new_tokens(self, requested: int | None, prompt_tokens: int, default: int | None) -> int:
        """``requested`` (or ``default``, or what the context leaves) checked against the
        context: a prompt plus its output must fit."""
        room = self.context_length - prompt_tokens
        wanted = requested if requested is not None else (default or room)
        if requested is not None and requested > room:
            raise ApiError(
                400,
                f"max_tokens={requested} plus the prompt's {prompt_tokens} tokens exceed this "
                f"model's context of {self.context_length} tokens",
                "max_tokens",
            )
        return min(wanted, room)

    def check_min_new_tokens(self, min_new: int, max_new: int, field: str, max_field: str) -> None:
        """Refuse a minimum output longer than the maximum (SGLang and vLLM refuse it too)."""
        if min_new > max_new:
            raise ApiError(
                400,
                f"{field}={min_new} is more than {max_field}={max_new} (the maximum output, "
                "given or what the context leaves); give a minimum no larger than the maximum",
                field,
            )

    def submit(
        self, key: str, ids: list[int], params: SamplingParamsInput, rid: str | None = None
    ) -> RequestState:
        """Hand a request to the engine client; its refusals (and a closed scheduler
        connection: 503) become ApiErrors."""
        try:
            return self.engine.submit(key, ids, params, rid)
        except Overloaded as exc:
            raise ApiError(exc.status, str(exc)) from None
        except ConnectionError as exc:
            raise ApiError(503, str(exc)) from None
        except ValueError as exc:
            raise ApiError(400, str(exc), "rid") from None

    async def finish(self, request: Call, states: list[RequestState]) -> None:
        """Wait until every request is done; a client that leaves first has them aborted (the
        server's protocol calls ``schedkit.on_disconnect``)."""
        scope = request.scope
        scope["schedkit.on_disconnect"] = partial(self._abort, states)
        try:
            for state in states:
                await state.wait_done()
        finally:
            scope["schedkit.on_disconnect"] = None

    def _abort(self, states: list[RequestState]) -> None:
        for state in states:
            if not state.done:
                self.engine.abort(state)
                state.error = "client disconnected"
                state.wake()

    def stream(
        self, request: Call, states: list[RequestState], events: AsyncIterator[bytes]
    ) -> EventStream:
        """An SSE response over ``events``; the client leaving aborts ``states``."""
        return EventStream(events, partial(self._abort, states), self.send_watch)


class SendWatch:
    """Cuts off streams whose client has not taken a send for ``timeout`` seconds: a sweep
    every ``timeout / 2`` seconds (at most 1 s) over the streams in flight, so that a send
    costs two clock reads instead of a timer of its own."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.streams: set[EventStream] = set()
        self._task: asyncio.Task | None = None

    def add(self, stream: EventStream) -> None:
        """Watch ``stream`` until ``discard``."""
        self.streams.add(stream)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sweep())

    def discard(self, stream: EventStream) -> None:
        """Stop watching ``stream``."""
        self.streams.discard(stream)

    async def _sweep(self) -> None:
        try:
            while self.streams:
                await asyncio.sleep(min(1.0, self.timeout / 2))
                now = time.monotonic()
                for stream in list(self.streams):
                    since = stream.sending_since
                    if since and now - since > self.timeout:
                        stream.stall()
        finally:
            self._task = None


class EventStream:
    """A ``text/event-stream`` response: each item of ``events`` is sent as it comes; when the
    client disconnects or does not take a send within the watch's timeout, ``on_abort`` is
    called and the stream ends."""

    def __init__(
        self, events: AsyncIterator[bytes], on_abort: Callable[[], None], watch: SendWatch
    ) -> None:
        self.events = events
        self.on_abort = on_abort
        self.watch = watch
        self.sending_since = 0.0
        self._task: asyncio.Task | None = None
        self._stalled = False

    def stall(self) -> None:
        """Give up on a client that stopped reading."""
        self._stalled = True
        if self._task is not None:
            self._task.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._task = asyncio.current_task()
        scope["schedkit.on_disconnect"] = self.on_abort
        self.watch.add(self)
        clock = time.monotonic
        try:
            self.sending_since = clock()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                    ],
                }
            )
            self.sending_since = 0.0
            write = chunk_writer(send)
            async for chunk in self.events:
                self.sending_since = clock()
                if write is not None:
                    await write(chunk)
                else:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.sending_since = 0.0
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self._stalled:
                raise
            # Too slow a reader: its request is aborted, and uvicorn closes a connection whose
            # response was left incomplete.
            self.on_abort()
        finally:
            scope["schedkit.on_disconnect"] = None
            self.watch.discard(self)
            await self.events.aclose()
