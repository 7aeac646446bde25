"""OpenAI routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``.

Responses and stream chunks have the shapes OpenAI's API (and vLLM, SGLang) send: ``id``,
``object``, ``created``, ``model``, ``choices`` and ``usage`` (with
``prompt_tokens_details.cached_tokens``); a stream is Server-Sent Events ending with
``data: [DONE]``, and with ``stream_options.include_usage`` a last chunk with empty ``choices``
carries the usage.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request

from schedkit.components.io.io_struct import SamplingParamsInput
from schedkit.http.engine_client import RequestState
from schedkit.http.generation import DONE, Call, EventStream, Generator, read_json
from schedkit.http.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    chat_prompt,
    error_body,
    refused_fields,
)
from schedkit.http.responses import JsonResponse, json_response

__all__ = ["OpenAIRoutes", "error_response", "json_response"]

_encode = msgspec.json.Encoder().encode
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_FINISH = {"length": "length", "stop": "stop"}
# OpenAI's default max_tokens for completions; chat completions default to what the context
# leaves, as vLLM does.
COMPLETION_DEFAULT_MAX_TOKENS = 16


def finish_reason(state: RequestState) -> str:
    """The OpenAI finish reason of a finished request; ApiError for an aborted one."""
    if state.error is not None:
        raise ApiError(503, f"request not served: {state.error}")
    kind = state.finish["type"]
    if kind not in _FINISH:
        raise ApiError(400, f"request aborted: {state.finish.get('message', kind)}")
    return _FINISH[kind]


def usage(states: list[RequestState]) -> dict:
    """The ``usage`` object of finished requests."""
    prompt = sum(s.prompt_tokens for s in states)
    completion = sum(s.completion_tokens for s in states)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in states)},
    }


class OpenAIRoutes:
    """The three OpenAI routes over one ``Generator``."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.model = generator.config.model.name

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model:
            raise ApiError(
                404,
                f"The model `{model}` does not exist; this server serves `{self.model}`",
                "model",
            )

    def _params(self, body, max_new_tokens: int) -> SamplingParamsInput:
        return SamplingParamsInput(
            max_new_tokens=max_new_tokens,
            stop_token_ids=body.stop_token_ids or [],
            ignore_eos=body.ignore_eos,
            stream=body.stream,
            min_new_tokens=body.min_tokens,
        )

    def _start(self, request: Call, body, prompts: list[str | list[int]], default: int | None):
        gen = self.generator
        refused = refused_fields(body)
        if refused is not None:
            raise refused
        self._check_model(body.model)
        requested = getattr(body, "max_completion_tokens", None) or body.max_tokens
        jobs = []
        for i, prompt in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            if isinstance(body, ChatCompletionRequest):
                param = "messages"
            ids = gen.token_ids(prompt, param)
            max_new = gen.max_new_tokens(requested, len(ids), default)
            gen.check_min_new_tokens(body.min_tokens, max_new, "min_tokens", "max_tokens")
            jobs.append((ids, max_new))
        key = request.scope["schedkit.key"]
        states = []
        try:
            for ids, max_new in jobs:
                states.append(gen.submit(key, ids, self._params(body, max_new)))
        except ApiError:
            for state in states:
                gen.engine.abort(state)
            raise
        return states

    async def completions(self, request: Call) -> JsonResponse | EventStream:
        """``POST /v1/completions``."""
        states, stream, usage_chunk = self._submitted(
            request, await read_json(request, _completion_decoder, self.generator.config)
        )
        return await self._respond(request, states, stream, usage_chunk, chat=False)

    async def chat_completions(self, request: Call) -> JsonResponse | EventStream:
        """``POST /v1/chat/completions`` (the chat template: ``protocol.chat_prompt``)."""
        states, stream, usage_chunk = self._submitted(
            request, await read_json(request, _chat_decoder, self.generator.config)
        )
        return await self._respond(request, states, stream, usage_chunk, chat=True)

    def _submitted(
        self, request: Call, body: CompletionRequest | ChatCompletionRequest
    ) -> tuple[list[RequestState], bool, bool]:
        """Submit the body's prompts: their states, whether to stream, whether a usage chunk
        ends the stream. The decoded body (prompt lists of Python ints, ~36 bytes a token) is
        let go here: a request waiting in the queue holds only its encoded message."""
        if isinstance(body, ChatCompletionRequest):
            prompts: list[str | list[int]] = [
                chat_prompt(body.messages, body.add_generation_prompt)
            ]
            default = None
        else:
            prompts, default = body.prompts(), COMPLETION_DEFAULT_MAX_TOKENS
        states = self._start(request, body, prompts, default)
        options = body.stream_options
        return states, body.stream, options is not None and options.include_usage

    async def models(self, request: Request) -> JsonResponse:
        """``GET /v1/models``."""
        model = self.generator.config.model
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": model.name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "schedkit",
                        "root": model.name,
                        "max_model_len": model.context_length,
                    }
                ],
            }
        )

    async def _respond(
        self, request: Call, states, stream: bool, include_usage: bool, *, chat: bool
    ) -> JsonResponse | EventStream:
        gen = self.generator
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{states[0].rid}"
        created = int(time.time())
        if stream:
            events = self._events(states, rid, created, chat, include_usage)
            return gen.stream(request, states, events)
        await gen.finish(request, states)
        tokenizer = gen.tokenizer
        choices = []
        for i, state in enumerate(states):
            reason = finish_reason(state)
            text = tokenizer.decode(state.take())
            if chat:
                message = {"role": "assistant", "content": text}
                choices.append(
                    {"index": i, "message": message, "logprobs": None, "finish_reason": reason}
                )
            else:
                choices.append(
                    {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
                )
        return json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": self.model,
                "choices": choices,
                "usage": usage(states),
            }
        )

    async def _events(
        self, states: list[RequestState], rid: str, created: int, chat: bool, include_usage: bool
    ) -> AsyncIterator[bytes]:
        head = _encode(
            {
                "id": rid,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": self.model,
            }
        )[:-1]
        tokenizer = self.generator.tokenizer
        for index, state in enumerate(states):
            decoder = tokenizer.incremental()
            if chat:
                delta = {"role": "assistant", "content": ""}
                first = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
                yield b"data: " + head + b',"choices":[' + _encode(first) + b"]}\n\n"
                prefix = b'"choices":[{"index":%d,"delta":{"content":' % index
            else:
                prefix = b'"choices":[{"index":%d,"text":' % index
            while True:
                await state.wait()
                done = state.done
                ids = state.take()
                if (done and state.error is not None) or (
                    done and state.finish["type"] not in _FINISH
                ):
                    try:
                        finish_reason(state)
                    except ApiError as exc:
                        yield b"data: " + _encode(error_body(exc)) + b"\n\n" + DONE
                    return
                text = decoder.decode(ids, final=done)
                reason = b'"%s"' % _FINISH[state.finish["type"]].encode() if done else b"null"
                if text or done:
                    tail = b"}" if chat else b""
                    yield (
                        b"data: "
                        + head
                        + b","
                        + prefix
                        + _encode(text)
                        + tail
                        + b',"logprobs":null,"finish_reason":'
                        + reason
                        + b"}]}\n\n"
                    )
                if done:
                    break
        if include_usage:
            yield b"data: " + head + b',"choices":[],"usage":' + _encode(usage(states)) + b"}\n\n"
        yield DONE


def error_response(error: ApiError, headers: dict | None = None) -> JsonResponse:
    """The response for an ApiError."""
    return json_response(error_body(error), error.status, headers)
