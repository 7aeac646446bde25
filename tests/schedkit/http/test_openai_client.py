"""The official ``openai`` client against a real ``schedkit serve --http``: completions and chat
completions, streamed and not, with usage; refusals arrive as the client's own error types."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture
def client(http_server):
    _, url = http_server
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["schedkit-sim"]


def test_completion_with_usage(client):
    done = client.completions.create(model="schedkit-sim", prompt="Hello, world", max_tokens=7)
    assert done.object == "text_completion"
    assert done.choices[0].finish_reason == "length"
    assert done.choices[0].text
    # The built-in tokenizer: one token per UTF-8 byte.
    assert done.usage.prompt_tokens == len(b"Hello, world")
    assert done.usage.completion_tokens == 7
    assert done.usage.total_tokens == len(b"Hello, world") + 7


def test_completion_of_token_ids_and_of_a_list_of_prompts(client):
    by_ids = client.completions.create(model="schedkit-sim", prompt=[5, 6, 7, 8], max_tokens=3)
    assert by_ids.usage.prompt_tokens == 4
    many = client.completions.create(
        model="schedkit-sim", prompt=["first", "second one"], max_tokens=2
    )
    assert sorted(c.index for c in many.choices) == [0, 1]
    assert many.usage.prompt_tokens == len("first") + len("second one")
    assert many.usage.completion_tokens == 4


def test_streamed_completion_ends_with_usage(client):
    stream = client.completions.create(
        model="schedkit-sim",
        prompt="stream me",
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) >= 2  # streamed, not one piece
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == len("stream me")


def test_chat_completion_and_its_stream(client):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    done = client.chat.completions.create(model="schedkit-sim", messages=messages, max_tokens=5)
    assert done.object == "chat.completion"
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content
    # The documented template: "<|role|>\ntext\n" per message, then "<|assistant|>\n".
    template = "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert done.usage.prompt_tokens == len(template)
    assert done.usage.completion_tokens == 5

    stream = client.chat.completions.create(
        model="schedkit-sim",
        messages=messages,
        max_completion_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content
    finished = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finished[-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_the_same_prompt_is_served_from_the_prefix_cache(client):
    prompt = "a shared prefix that is long enough to fill whole pages " * 4
    client.completions.create(model="schedkit-sim", prompt=prompt, max_tokens=2)
    again = client.completions.create(model="schedkit-sim", prompt=prompt, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 2), ("logprobs", 2), ("echo", True), ("stop", ["\n"]), ("best_of", 3)],
)
def test_fields_that_cannot_be_honoured_are_refused_by_name(client, field, value):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="schedkit-sim", prompt="x", max_tokens=2, **{field: value})
    assert caught.value.body["param"] == field
    assert field in caught.value.body["message"]


def test_chat_tools_and_unknown_fields_are_refused(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="schedkit-sim", messages=[{"role": "user", "content": "x"}], tools=tools
        )
    assert caught.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="schedkit-sim", prompt="x", extra_body={"frobnicate": 1})
    assert caught.value.body["param"] == "frobnicate"


def test_wrong_model_too_long_prompt_and_bad_token_ids(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="schedkit-sim", prompt="x" * 40000)
    assert "context" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="schedkit-sim", prompt=[1, 2, 10**6])
    assert "vocabulary" in caught.value.body["message"]


def test_ignore_eos_and_min_tokens_are_accepted(client):
    done = client.completions.create(
        model="schedkit-sim",
        prompt="x",
        max_tokens=4,
        extra_body={"ignore_eos": True, "min_tokens": 4},
    )
    assert done.usage.completion_tokens == 4
