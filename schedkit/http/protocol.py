"""OpenAI request bodies as the front end accepts them, and the errors it answers with.

Field names follow OpenAI's API and vLLM's extensions (``ignore_eos``, ``min_tokens``,
``stop_token_ids``). A field is either honoured, accepted as having no effect on a simulated
model (sampling knobs: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, the
penalties, ``user``), or refused with an error naming it when set to anything but its default
(``n``, ``best_of``, ``logprobs``, ``echo``, ``suffix``, ``logit_bias``, ``stop`` strings,
``tools``, SGLang's ``regex``/``json_schema``/``lora_path``...). SGLang's extensions that
routers forward at their defaults (``no_stop_trim``, ``skip_special_tokens``,
``separate_reasoning``...) are accepted. Unknown fields are refused.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "ApiError",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "StreamOptions",
    "error_body",
    "refused_fields",
]

TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
MaxPrompts = 256
# Sampling knobs: no effect on the simulated model's tokens, so any valid value is accepted
# (the ranges vLLM and SGLang check; top_k -1 or 0 means the whole vocabulary, as in vLLM).
Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)] | None
Probability = Annotated[float, msgspec.Meta(ge=0, le=1)] | None
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)] | None
TopK = Annotated[int, msgspec.Meta(ge=-1, le=2**31 - 1)] | None
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)] | None
RepetitionPenalty = Annotated[float, msgspec.Meta(gt=0, le=2)] | None
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None


class ApiError(Exception):
    """An error answered as OpenAI does: ``status``, ``message``, ``param`` (the field)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or _KINDS.get(status, "server_error")


_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def error_body(error: ApiError) -> dict:
    """The JSON body of an error response, as OpenAI's API sends it."""
    return {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": error.param,
            "code": error.status,
        }
    }


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    stop_token_ids: Annotated[list[TokenId], msgspec.Meta(max_length=256)] | None = None
    # Accepted, no effect on a simulated model.
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    min_p: Probability = None
    seed: Seed = None
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    repetition_penalty: RepetitionPenalty = None
    user: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    sampling_seed: Seed = None
    # SGLang extensions that routers send with their defaults; no effect without stop strings,
    # special tokens or a reasoning parser.
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    # Refused unless at their defaults.
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | None = None
    lora_path: str | msgspec.Raw | None = None
    session_params: msgspec.Raw | None = None
    return_hidden_states: bool = False
    n: int | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None


class CompletionRequest(_Common, kw_only=True):
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a list of either."""

    prompt: str | Annotated[list[str | TokenId | list[TokenId]], msgspec.Meta(min_length=1)]
    best_of: int | None = None
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each text or token ids; raises ApiError for a mixed list."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        kinds = set(map(type, prompt))  # the decoder gives exact int, str and list
        if kinds == {int}:
            return [prompt]  # type: ignore[list-item]
        if int in kinds:
            raise ApiError(
                400,
                "prompt mixes token ids with text or lists; give text, a list of token ids, "
                "or a list of either",
                "prompt",
            )
        if len(prompt) > MaxPrompts:
            raise ApiError(
                400, f"prompt holds {len(prompt)} prompts; at most {MaxPrompts}", "prompt"
            )
        return list(prompt)  # type: ignore[arg-type]


class TextPart(msgspec.Struct, forbid_unknown_fields=True):
    """A text part of a message's content."""

    type: Literal["text"]
    text: str


class ChatMessage(msgspec.Struct, forbid_unknown_fields=True):
    """One chat message; content is text or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: Annotated[str, msgspec.Meta(max_length=256)] | None = None

    def text(self) -> str:
        """The message's text."""
        content = self.content
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "".join(part.text for part in content)


class ResponseFormat(msgspec.Struct, forbid_unknown_fields=False):
    """``response_format``: only ``text`` is honoured."""

    type: str


class ChatCompletionRequest(_Common, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=4096)]
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    add_generation_prompt: bool = True
    tools: list[msgspec.Raw] | None = None
    tool_choice: str | msgspec.Raw | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    continue_final_message: bool = False
    chat_template_kwargs: msgspec.Raw | None = None


def refused_fields(body: _Common) -> ApiError | None:
    """The first field set to something the front end cannot honour, as an error naming it."""
    checks: list[tuple[str, bool]] = [
        ("n", body.n not in (None, 1)),
        # logprobs=0 asks a completion for the sampled tokens' own log probabilities.
        ("logprobs", body.logprobs is not None and body.logprobs is not False),
        ("top_logprobs", body.top_logprobs not in (None, 0)),
        ("logit_bias", bool(body.logit_bias)),
        ("stop", bool(body.stop)),
        ("regex", body.regex is not None),
        ("ebnf", body.ebnf is not None),
        ("json_schema", body.json_schema is not None),
        ("lora_path", body.lora_path is not None),
        ("session_params", body.session_params is not None),
        ("return_hidden_states", body.return_hidden_states),
        (
            "stream_options.continuous_usage_stats",
            body.stream_options is not None and body.stream_options.continuous_usage_stats,
        ),
    ]
    if isinstance(body, CompletionRequest):
        checks += [
            ("best_of", body.best_of not in (None, 1)),
            ("echo", body.echo),
            ("suffix", bool(body.suffix)),
        ]
    if isinstance(body, ChatCompletionRequest):
        checks += [
            ("tools", bool(body.tools)),
            ("tool_choice", body.tool_choice not in (None, "none")),
            (
                "response_format",
                body.response_format is not None and body.response_format.type != "text",
            ),
            ("continue_final_message", body.continue_final_message),
            ("chat_template_kwargs", body.chat_template_kwargs is not None),
        ]
    for field, refused in checks:
        if refused:
            return ApiError(
                400,
                f"{field} is not supported by this server (a simulated model: one sample per "
                "prompt, no logprobs, no stop strings, no tools); leave it out",
                field,
            )
    return None


def chat_prompt(messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    """The documented chat template: ``<|ROLE|>\\nTEXT\\n`` per message, then
    ``<|assistant|>\\n`` when a reply is to be generated."""
    text = "".join(f"<|{m.role}|>\n{m.text()}\n" for m in messages)
    if add_generation_prompt:
        text += "<|assistant|>\n"
    return text
