"""SGLang's native ``/generate``: text or ``input_ids``, ``sampling_params``, ``stream``, ``rid``,
answered with ``text``, ``output_ids`` and ``meta_info`` as SGLang sends them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated

import msgspec

from schedkit.components.io.io_struct import SamplingParamsInput
from schedkit.http.engine_client import RequestState
from schedkit.http.generation import DONE, Call, EventStream, Generator, read_json
from schedkit.http.protocol import (
    ApiError,
    Penalty,
    Probability,
    RepetitionPenalty,
    TokenId,
    TopK,
    TopP,
)
from schedkit.http.responses import JsonResponse, json_response

__all__ = ["NativeRoutes"]

_encode = msgspec.json.Encoder().encode


class NativeSamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """SGLang's ``sampling_params``, the fields this server honours or accepts."""

    max_new_tokens: Annotated[int, msgspec.Meta(ge=1)] = 128
    min_new_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    stop_token_ids: Annotated[list[TokenId], msgspec.Meta(max_length=256)] | None = None
    ignore_eos: bool = False
    # Accepted, no effect on a simulated model; in the ranges SGLang's SamplingParams.verify
    # checks (top_k: -1 or at least 1).
    temperature: Annotated[float, msgspec.Meta(ge=0)] | None = None
    top_p: TopP = None
    top_k: TopK = None
    min_p: Probability = None
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    repetition_penalty: RepetitionPenalty = None
    # Refused unless at their defaults.
    n: int = 1
    stop: str | list[str] | None = None


class GenerateBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /generate``: ``text`` or ``input_ids``, one request."""

    text: str | None = None
    input_ids: list[TokenId] | None = None
    sampling_params: NativeSamplingParams = NativeSamplingParams()
    stream: bool = False
    rid: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    return_logprob: bool = False


_generate_decoder = msgspec.json.Decoder(GenerateBody)


class NativeRoutes:
    """``/generate`` over one ``Generator``."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.engine = generator.engine
        self.config = generator.config

    async def generate(self, request: Call) -> JsonResponse | EventStream:
        """``POST /generate``."""
        gen = self.generator
        state, stream = self._submitted(
            request, await read_json(request, _generate_decoder, self.config)
        )
        start = time.perf_counter()
        if stream:
            return gen.stream(request, [state], self._events(state, start))
        await gen.finish(request, [state])
        if state.error is not None:
            raise ApiError(503, f"request not served: {state.error}")
        output_ids = state.take()
        return json_response(
            {
                "text": gen.tokenizer.decode(output_ids),
                "output_ids": output_ids,
                "meta_info": self._meta(state, start),
            }
        )

    def _submitted(self, request: Call, body: GenerateBody) -> tuple[RequestState, bool]:
        """Check and submit the body: its state and whether to stream (the decoded body, its
        ids as Python ints, is let go here: a queued request holds only its message)."""
        gen = self.generator
        params = body.sampling_params
        if (body.text is None) == (body.input_ids is None):
            raise ApiError(400, "give exactly one of text and input_ids", "text")
        if params.top_k == 0:
            raise ApiError(
                400,
                "sampling_params.top_k must be -1 (the whole vocabulary) or at least 1, got 0",
                "sampling_params.top_k",
            )
        for field, refused in (
            ("return_logprob", body.return_logprob),
            ("sampling_params.n", params.n != 1),
            ("sampling_params.stop", bool(params.stop)),
        ):
            if refused:
                raise ApiError(400, f"{field} is not supported by this server; leave it out", field)
        ids = gen.token_ids(body.text if body.text is not None else body.input_ids, "input_ids")
        max_new = gen.max_new_tokens(params.max_new_tokens, len(ids), None)
        gen.check_min_new_tokens(
            params.min_new_tokens,
            max_new,
            "sampling_params.min_new_tokens",
            "sampling_params.max_new_tokens",
        )
        sampling = SamplingParamsInput(
            max_new_tokens=max_new,
            min_new_tokens=params.min_new_tokens,
            stop_token_ids=params.stop_token_ids or [],
            ignore_eos=params.ignore_eos,
            stream=body.stream,
        )
        return gen.submit(request.scope["schedkit.key"], ids, sampling, body.rid), body.stream

    def _meta(self, state: RequestState, start: float) -> dict:
        return {
            "id": state.rid,
            "finish_reason": state.finish,
            "prompt_tokens": state.prompt_tokens,
            "completion_tokens": state.completion_tokens,
            "cached_tokens": state.cached_tokens,
            "e2e_latency": time.perf_counter() - start,
        }

    async def _events(self, state: RequestState, start: float) -> AsyncIterator[bytes]:
        # SGLang streams the text and ids so far in every chunk.
        decoder = self.generator.tokenizer.incremental()
        output_ids: list[int] = []
        text = ""
        while True:
            await state.wait()
            done = state.done
            if state.error is not None:
                error = {"error": {"message": f"request not served: {state.error}"}}
                yield b"data: " + _encode(error) + b"\n\n" + DONE
                return
            ids = state.take()
            output_ids += ids
            text += decoder.decode(ids, final=done)
            meta = (
                self._meta(state, start)
                if done
                else {
                    "id": state.rid,
                    "finish_reason": None,
                    "prompt_tokens": state.prompt_tokens,
                    "completion_tokens": len(output_ids),
                }
            )
            yield (
                b"data: "
                + _encode({"text": text, "output_ids": output_ids, "meta_info": meta})
                + b"\n\n"
            )
            if done:
                break
        yield DONE
