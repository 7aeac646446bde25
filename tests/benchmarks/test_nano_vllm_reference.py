"""The nano-vllm harness loads a checkout's scheduler without its package __init__ or config,
runs it to completion and counts its preemptions; here against a small stand-in tree with
nano-vllm's interface (``postprocess(seqs, token_ids, is_prefill)``)."""

import sys
import types

import pytest

from benchmarks.nano_vllm_reference import (
    NANO_VLLM_COMMIT,
    NanoVllmUnavailable,
    load_nano_vllm,
    run_nano_vllm,
)

FILES = {
    "nanovllm/__init__.py": "raise ImportError('the package init imports torch')\n",
    "nanovllm/config.py": "raise ImportError('config imports transformers')\n",
    "nanovllm/sampling_params.py": (
        "from dataclasses import dataclass\n\n"
        "@dataclass\nclass SamplingParams:\n"
        "    temperature: float = 1.0\n    max_tokens: int = 64\n    ignore_eos: bool = False\n"
    ),
    "nanovllm/engine/sequence.py": (
        "class Sequence:\n    block_size = 256\n\n"
        "    def __init__(self, token_ids, sampling_params):\n"
        "        self.token_ids = list(token_ids)\n"
        "        self.num_prompt_tokens = len(token_ids)\n"
        "        self.max_tokens = sampling_params.max_tokens\n\n"
        "    @property\n    def num_completion_tokens(self):\n"
        "        return len(self.token_ids) - self.num_prompt_tokens\n"
    ),
    "nanovllm/engine/scheduler.py": (
        "from nanovllm.config import Config\n\n"
        "class Scheduler:\n    def __init__(self, config: Config):\n"
        "        self.config = config\n        self.waiting, self.running = [], []\n\n"
        "    def add(self, seq):\n        self.waiting.append(seq)\n\n"
        "    def is_finished(self):\n        return not self.waiting and not self.running\n\n"
        "    def schedule(self):\n        if self.waiting:\n"
        "            batch, self.waiting = self.waiting, []\n"
        "            self.running += batch\n            return batch, True\n"
        "        if len(self.running) > self.config.max_num_seqs:\n"
        "            self.preempt(self.running.pop())\n"
        "        return list(self.running), False\n\n"
        "    def preempt(self, seq):\n"
        "        del seq.token_ids[seq.num_prompt_tokens :]\n        self.waiting.append(seq)\n\n"
        "    def postprocess(self, seqs, token_ids, is_prefill):\n"
        "        for seq, token in zip(seqs, token_ids):\n            seq.token_ids.append(token)\n"
        "            if seq.num_completion_tokens == seq.max_tokens:\n"
        "                self.running.remove(seq)\n"
    ),
}


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for module in ("xxhash", "numpy"):  # what nano-vllm's block manager imports
        monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
    yield tmp_path
    for name in [m for m in sys.modules if m == "nanovllm" or m.startswith("nanovllm.")]:
        del sys.modules[name]


def test_runs_every_sequence_to_its_last_token(checkout):
    nano = load_nano_vllm(checkout)
    prompts = [[1, 2, 3], [4, 5], [6]]
    run = run_nano_vllm(
        nano, prompts, 5, block_size=16, pool_tokens=1024, max_num_seqs=8, max_num_batched_tokens=64
    )
    assert (run.tokens, run.decode_steps, run.preemptions) == (15, 4, 0) and run.cpu >= 0
    assert nano["Sequence"].block_size == 16


def test_preemptions_are_counted(checkout):
    nano = load_nano_vllm(checkout)
    run = run_nano_vllm(
        nano,
        [[1], [2], [3]],
        3,
        block_size=16,
        pool_tokens=64,
        max_num_seqs=2,
        max_num_batched_tokens=8,
    )
    assert run.preemptions >= 1 and run.tokens == 9


def test_an_older_nano_vllm_without_is_prefill_is_named(checkout):
    path = checkout / "nanovllm/engine/scheduler.py"
    path.write_text(path.read_text().replace("token_ids, is_prefill)", "token_ids)"))
    with pytest.raises(NanoVllmUnavailable, match=f"check out commit {NANO_VLLM_COMMIT}"):
        load_nano_vllm(checkout)


def test_a_directory_without_nano_vllm_is_named(tmp_path):
    with pytest.raises(NanoVllmUnavailable, match=r"no nanovllm/engine/scheduler\.py there"):
        load_nano_vllm(tmp_path)


def test_missing_block_manager_dependencies_are_named(checkout, monkeypatch):
    monkeypatch.setitem(sys.modules, "xxhash", None)  # import xxhash raises ImportError
    with pytest.raises(NanoVllmUnavailable, match="pip install xxhash numpy"):
        load_nano_vllm(checkout)


def test_a_scheduler_that_reads_an_unknown_setting_is_reported(checkout):
    path = checkout / "nanovllm/engine/scheduler.py"
    path.write_text(path.read_text().replace("self.config = config", "self.x = config.gpu_count"))
    nano = load_nano_vllm(checkout)
    with pytest.raises(NanoVllmUnavailable, match="gpu_count"):
        run_nano_vllm(
            nano, [[1]], 1, block_size=16, pool_tokens=64, max_num_seqs=1, max_num_batched_tokens=8
        )
