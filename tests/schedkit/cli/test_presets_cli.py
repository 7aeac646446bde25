import json

import pytest
import yaml

from schedkit.cli import main
from schedkit.runner.presets import GPUS, MODELS, kv_pool_tokens, runner_args
from tests.schedkit.cli.test_cli import _RefLoader


def _config(capsys, *argv):
    assert main(["config", "wiring.yaml", "--resolved", *argv]) == 0
    captured = capsys.readouterr()
    data = yaml.load(captured.out, Loader=_RefLoader)["components"]
    return data, captured.err


def test_config_shows_what_a_preset_sets(capsys):
    data, err = _config(capsys, "--model", "mistral-7b", "--gpu", "h200")
    expected = runner_args(MODELS["mistral-7b"], GPUS["h200"])
    runner = data["model_runner"]["args"]
    assert {k: runner[k] for k in expected} == expected
    pool = kv_pool_tokens(MODELS["mistral-7b"], GPUS["h200"], page_size=16)
    assert data["allocator"]["args"]["size"] == pool
    assert f"KV pool {pool:,} tokens" in err


def test_an_overlay_adjusts_a_preset(capsys, write):
    overlay = write("o.yaml", "components:\n  allocator:\n    args: {size: 4096}\n")
    data, _ = _config(capsys, "--model", "llama3-70b", "--tp", "8", "-o", str(overlay))
    assert data["allocator"]["args"]["size"] == 4096
    assert data["model_runner"]["args"] == {
        **data["model_runner"]["args"],
        **runner_args(MODELS["llama3-70b"], GPUS["h100"], 8),
    }


def test_unknown_preset_names_list_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["config", "wiring.yaml", "--gpu", "b200"])
    assert exit_info.value.code == 2
    assert "valid GPUs: h100, h200, a100-80g, l40s" in capsys.readouterr().err


def test_a_model_that_does_not_fit_is_a_located_problem(capsys):
    assert main(["validate", "wiring.yaml", "--model", "llama3-70b", "--tp", "1"]) == 2
    err = capsys.readouterr().err
    assert "--model/--gpu/--tp: llama3-70b at TP=1 needs 141.1 GB" in err
    assert "Traceback" not in err


def test_run_with_a_preset(capsys):
    argv = ["run", "wiring.yaml", "--model", "qwen2.5-7b", "--gpu", "a100-80g", "--json"]
    assert main([*argv, "--num-requests", "20"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests_done"] == 20
