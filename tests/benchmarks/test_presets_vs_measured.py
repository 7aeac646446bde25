"""The llama3-8b / h100 preset stays within 15% of the step times built from measured kernel
times, and its coefficients are the ones the comparison script fits."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from schedkit.runner import presets
from schedkit.runner.model_runner import SimulatedModelRunner

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "presets_vs_measured.py"


def _script():
    spec = importlib.util.spec_from_file_location("presets_vs_measured", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_case_is_within_the_tolerance():
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    cases = re.findall(r"^(prefill|decode) .* (\d+\.\d+)$", result.stdout, re.MULTILINE)
    assert len(cases) == 18
    assert all(0.85 <= float(ratio) <= 1.15 for _, ratio in cases)


def test_the_preset_carries_the_fitted_coefficients_and_the_runner_defaults_them():
    fitted = _script().fitted_coefficients()
    assert fitted == presets.FITTED_COEFFICIENTS
    args = presets.runner_args(presets.model("llama3-8b"), presets.gpu("h100"))
    assert {k: args[k] for k in fitted} == fitted
    runner = SimulatedModelRunner()
    assert {k: getattr(runner, k) for k in fitted} == fitted


def test_the_reference_reproduces_the_published_prefill_figures():
    # 23-24 ms at 1k tokens, 94-100 ms at 4k, 200-224 ms at 8k, 461-557 ms at 16k (FA3-FA2).
    script = _script()
    for prompt, low, high in ((1024, 23, 24), (4096, 94, 101), (8192, 200, 226), (16384, 461, 557)):
        fa3 = sum(script.prefill_reference(prompt)) * 1e3
        fa2 = sum(script.prefill_reference(prompt, script.FA2)) * 1e3
        assert low <= fa3 <= fa2 <= high + 1, (prompt, fa3, fa2)
