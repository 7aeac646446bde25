import pytest

from schedkit.runner.specs import MODELS, PresetError, gpu, model


@pytest.mark.parametrize(
    ("name", "billions"),
    [("llama3-8b", 8.03), ("llama3-70b", 70.55), ("qwen2.5-7b", 7.62), ("mistral-7b", 7.25)],
)
def test_parameter_counts_match_the_model_cards(name, billions):
    assert MODELS[name].params / 1e9 == pytest.approx(billions, rel=0.005)


@pytest.mark.parametrize(
    ("name", "vocab", "context"),
    [
        ("llama3-8b", 128256, 8192),
        ("llama3-70b", 128256, 8192),
        ("qwen2.5-7b", 152064, 32768),
        ("mistral-7b", 32768, 32768),
    ],
)
def test_vocabulary_and_context_are_the_published_configs(name, vocab, context):
    # vocab_size and max_position_embeddings of each model's config.json
    assert (MODELS[name].vocab, MODELS[name].context_length) == (vocab, context)


def test_unknown_names_say_what_is_valid():
    with pytest.raises(PresetError, match=r"valid models: llama3-8b, llama3-70b, qwen2.5-7b"):
        model("llama-3")
    with pytest.raises(PresetError, match=r"valid GPUs: h100, h200, a100-80g, l40s"):
        gpu("b200")
