"""NVIDIA Dynamo's own router (``python -m dynamo.frontend --router-mode kv`` and
``round-robin``) over its own mocker engine (``python -m dynamo.mocker``), beside schedkit's
``dynamo`` and ``round_robin`` policies over a live schedkit fleet, on the same trace and the
same number of workers.

Rows, interleaved in each of ``--repeat`` rounds, each on fresh processes:

- ``Dynamo kv`` / ``Dynamo round-robin``: ``--workers`` mocker workers in one ``dynamo.mocker``
  process (its vLLM-style engine and default timing model, ``--block-size`` 64, a pool of
  ``--pool-tokens`` / block size blocks: llama3-8b's on the h100 preset) behind one
  ``dynamo.frontend`` with that router mode; discovery through a file store in a temporary
  directory, the TCP request plane and the ZMQ event plane, every address 127.0.0.1 (no etcd,
  no NATS);
- ``schedkit dynamo`` / ``schedkit round_robin``: ``schedkit fleet --http --router ...`` over
  ``--workers`` workers (llama3-8b on the h100 preset), as ``sglang_router_real.py`` runs it.

Every row gets the same token sequences: the trace's text (``sglang_router_real``'s
Mooncake-shaped blocks of letters, or the Azure-shaped trace's fresh letters) is sent to the
schedkit fleet as text (its byte tokenizer makes one token per byte) and to Dynamo as the
same bytes as token ids. The two engines' timing models differ, so each router is compared with
its own round robin.

Printed per row, min / median / max over the rounds: requests completed, prefix-cache hit rate
(cached over prompt tokens, from each response's usage), TTFT p50 and p99 (ms, client side),
output tokens per second and the load imbalance (most requests one worker took over the mean;
Dynamo's from the worker id its frontend returns with each response when asked through
``nvext.extra_fields``, schedkit's from each worker's ``/metrics``).

Dynamo's ZMQ event plane binds its sockets to every address; to keep them off the network run
the script in a network namespace of its own with only loopback, e.g. ``unshare -n sh -c 'ip
link set lo up && python benchmarks/dynamo_mocker_real.py ...'`` (root).

Usage: ``python benchmarks/dynamo_mocker_real.py --dynamo-python PATH [--trace mooncake|azure]
[--requests N] [--rate R] [--repeat N]``, PATH a Python with ``ai-dynamo`` and
``ai-dynamo-runtime`` 1.6.1 installed (``pip install --no-deps ai-dynamo==1.6.1
ai-dynamo-runtime==1.6.1`` and their requirements but ``aisimulate``, which only the planner
imports and whose package downloads its wheel from outside the package index).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from schedkit.testing.serving import free_endpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http_router import percentile
from sglang_router_real import azure_texts, mooncake_texts, run_ours

MODEL = "llama"
VOCAB = 32_000


def dynamo_model_directory(directory: Path) -> Path:
    """A model directory the Dynamo frontend and mocker load without a hub: a word-level
    tokenizer of ``VOCAB`` words (ids 3 on; the prompts are sent as token ids), a chat template
    (the frontend requires one) and a llama3-8b ``config.json`` (the mocker sizes KV bytes from
    it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = directory / "dynamo-model"
    model.mkdir()
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i + 3 for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(model / "tokenizer.json"))
    tokenizer_config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "[UNK]",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1 << 20,
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    }
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": len(vocab),
        "max_position_embeddings": 1 << 20,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (model / "config.json").write_text(json.dumps(config))
    (model / "generation_config.json").write_text('{"bos_token_id": 1, "eos_token_id": 2}')
    return model


async def stream_tokens(client: httpx.AsyncClient, start: float, item: dict) -> dict:
    """Send ``item``'s bytes as token ids at ``start + item["arrival"]``, streamed, asking
    Dynamo's frontend for the serving worker's id: ``ok``, ``sent`` / ``first`` / ``end``
    (perf_counter), ``usage`` and ``worker``."""
    await asyncio.sleep(max(0.0, start + item["arrival"] - time.perf_counter()))
    sent = time.perf_counter()
    body = {
        "model": MODEL,
        "prompt": list(item["text"].encode()),
        "max_tokens": item["out"],
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "nvext": {"extra_fields": ["worker_id"]},
    }
    first, usage, worker = None, None, None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return {"ok": False, "status": response.status_code}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and first is None:
                    first = time.perf_counter()
                ids = (chunk.get("nvext") or {}).get("worker_id")
                if ids and worker is None:
                    worker = ids.get("decode_worker_id")
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except httpx.HTTPError:
        return {"ok": False}
    end = time.perf_counter()
    ok = usage is not None and worker is not None
    return {"ok": ok, "sent": sent, "first": first, "end": end, "usage": usage, "worker": worker}


async def drive_dynamo(url: str, trace: list[dict], speedup: float) -> list[dict]:
    """Send the trace to Dynamo's frontend at its arrival times (divided by ``speedup``)."""
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500)
    items = [{**item, "arrival": item["arrival"] / speedup} for item in trace]
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:
        start = time.perf_counter()
        return await asyncio.gather(*(stream_tokens(client, start, item) for item in items))


def wait_ready(url: str, store: Path, workers: int, deadline_s: float = 300.0) -> None:
    """Wait until ``workers`` generate endpoints are registered in the file store, the frontend
    lists the model and every worker has answered a probe (a 4-token prompt: no full block, so
    nothing cached); raise with the condition not met after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    instances = store / "v1" / "instances"
    while True:
        names = os.listdir(instances) if instances.is_dir() else []
        if sum("generate" in n for n in names) >= workers:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(names)} instances registered in {store}, want {workers}")
        time.sleep(0.2)
    seen: set[int] = set()
    probe = 0
    while len(seen) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(seen)} of {workers} workers answered probes at {url}")
        body = {
            "model": MODEL,
            "prompt": [3 + probe % VOCAB, 4, 5, 6],
            "max_tokens": 1,
            "nvext": {"extra_fields": ["worker_id"]},
        }
        probe += 1
        try:
            answer = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        if answer.status_code != 200:
            time.sleep(0.2)
            continue
        ids = (answer.json().get("nvext") or {}).get("worker_id") or {}
        if ids.get("decode_worker_id") is not None:
            seen.add(ids["decode_worker_id"])


def run_dynamo(args, trace: list[dict], model: Path, mode: str, log) -> dict:
    """The trace through Dynamo's frontend in ``mode`` over fresh mocker workers."""
    with tempfile.TemporaryDirectory(prefix="dynamo-store-") as store:
        env = dict(os.environ)
        env.update(
            DYN_FILE_KV=store,
            DYN_DISCOVERY_BACKEND="file",
            DYN_REQUEST_PLANE="tcp",
            DYN_EVENT_PLANE="zmq",
            DYN_TCP_RPC_HOST="127.0.0.1",
            DYN_EVENT_PLANE_HOST="127.0.0.1",
            DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
            DYN_SYSTEM_HOST="127.0.0.1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        mocker = [args.dynamo_python, "-m", "dynamo.mocker", "--model-path", str(model)]
        mocker += ["--model-name", MODEL, "--num-workers", str(args.workers)]
        mocker += ["--speedup-ratio", str(args.speedup), "--block-size", str(args.block_size)]
        mocker += ["--num-gpu-blocks-override", str(args.pool_tokens // args.block_size)]
        port = int(free_endpoint().rsplit(":", 1)[1])
        frontend = [args.dynamo_python, "-m", "dynamo.frontend", "--router-mode", mode]
        frontend += ["--http-host", "127.0.0.1", "--http-port", str(port)]
        processes = [
            subprocess.Popen(mocker, stdout=log, stderr=subprocess.STDOUT, env=env),
            subprocess.Popen(frontend, stdout=log, stderr=subprocess.STDOUT, env=env),
        ]
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, Path(store), args.workers)
            results = asyncio.run(drive_dynamo(url, trace, args.speedup))
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
    counts: dict[int, int] = {}
    for r in results:
        if r["ok"]:
            counts[r["worker"]] = counts.get(r["worker"], 0) + 1
    per_worker = list(counts.values()) + [0] * (args.workers - len(counts))
    return figures(results, args.speedup, per_worker)


def figures(results: list[dict], speedup: float, counts: list[float]) -> dict:
    """Completed, hit rate (%), TTFT p50/p99 (ms), output tok/s and imbalance of one run."""
    done = [r for r in results if r["ok"]]
    prompt = sum(r["usage"]["prompt_tokens"] for r in done)
    details = [r["usage"].get("prompt_tokens_details") or {} for r in done]
    cached = sum(d.get("cached_tokens") or 0 for d in details)
    ttfts = [(r["first"] - r["sent"]) * 1e3 * speedup for r in done if r["first"] is not None]
    span = (max(r["end"] for r in done) - min(r["sent"] for r in done)) * speedup
    out = sum(r["usage"]["completion_tokens"] for r in done)
    return {
        "completed": len(done),
        "hit": 100 * cached / max(prompt, 1),
        "p50": percentile(ttfts, 0.5),
        "p99": percentile(ttfts, 0.99),
        "tok_s": out / span,
        "imbalance": max(counts) / (sum(counts) / len(counts)) if sum(counts) else float("nan"),
        "per_worker": sorted(counts, reverse=True),
    }


def _spread(values: list[float], digits: int) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return " / ".join(f"{v:,.{digits}f}" for v in (low, mid, high))


LABELS = {
    "dynamo-kv": "Dynamo 1.6.1 kv",
    "dynamo-round-robin": "Dynamo 1.6.1 round-robin",
    "dynamo": "schedkit dynamo",
    "round_robin": "schedkit round_robin",
}


PAIRS = (("dynamo-kv", "dynamo-round-robin"), ("dynamo", "round_robin"))


def print_tables(runs: dict[str, list[dict]], requests: int) -> None:
    """The table of every row (min / median / max over the rounds) and, for each router beside
    its own round robin, its figures over round robin's in the same round."""
    print(
        "| router | completed | hit rate % | TTFT p50 ms | TTFT p99 ms | output tok/s "
        "| load imbalance |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, results in runs.items():
        done = sum(r["completed"] for r in results)
        cells = [f"{done}/{requests * len(results)}", _spread([r["hit"] for r in results], 1)]
        cells += [_spread([r[k] for r in results], 1) for k in ("p50", "p99")]
        cells += [_spread([r["tok_s"] for r in results], 0)]
        cells += [_spread([r["imbalance"] for r in results], 2)]
        print(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    pairs = [(a, b) for a, b in PAIRS if runs.get(a) and runs.get(b)]
    if not pairs:
        return
    print()
    print("| router over its round robin, same round | TTFT p50 | TTFT p99 | output tok/s |")
    print("|---|---|---|---|")
    for a, b in pairs:
        rounds = list(zip(runs[a], runs[b], strict=False))
        cells = [_spread([x[k] / y[k] for x, y in rounds], 3) for k in ("p50", "p99", "tok_s")]
        print(f"| {LABELS[a]} | " + " | ".join(cells) + " |")


def read_rounds(path: Path) -> dict[str, list[dict]]:
    """The rows' figures from a run's standard error (its ``round N: row: {...}`` lines)."""
    runs: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("round "):
            name, figures_ = line.split(": ", 2)[1:]
            runs.setdefault(name, []).append(ast.literal_eval(figures_))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dynamo-python", default=sys.executable)
    parser.add_argument("--trace", choices=("mooncake", "azure"), default="azure")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=None, help="default 8 / 40 per second")
    parser.add_argument("--block", type=int, default=512, help="Mooncake trace block tokens")
    parser.add_argument("--block-size", type=int, default=64, help="the mocker's KV block")
    parser.add_argument("--pool-tokens", type=int, default=None, help="default: the h100's")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rows", default="dynamo-kv,dynamo-round-robin,dynamo,round_robin")
    parser.add_argument(
        "--tables-from", type=Path, default=None, help="print the tables of a run's stderr log"
    )
    args = parser.parse_args(argv)
    if args.tables_from is not None:
        print_tables(read_rounds(args.tables_from), args.requests)
        return 0
    rate = args.rate or (8.0 if args.trace == "mooncake" else 40.0)
    from schedkit import wirings
    from schedkit.assembly.loading import load_wiring
    from schedkit.runner.presets import preset_overlay
    from schedkit.runner.time_scale import faster_model

    with tempfile.TemporaryDirectory(prefix="dynamo-mocker-real-") as tmp:
        directory = Path(tmp)
        from bench_http_router import model_directory

        model = str(model_directory(directory))
        dynamo_model = dynamo_model_directory(directory)
        if args.trace == "mooncake":
            trace = mooncake_texts(args.requests, rate, args.seed, args.block, directory)
        else:
            trace = azure_texts(args.requests, rate, args.seed, directory)
        overlay_args, described = preset_overlay(load_wiring(wirings.path()), "llama3-8b", "h100")
        if args.pool_tokens is None:
            args.pool_tokens = overlay_args["components"]["allocator"]["args"]["size"]
        overlay = directory / "h100.yaml"
        overlay.write_text(json.dumps(faster_model(overlay_args, args.speedup)))
        print(
            f"{args.trace}-shaped trace: {args.requests} requests at {rate:g}/s (seed "
            f"{args.seed}); {args.workers} workers; schedkit: {described}; Dynamo mocker: "
            f"{args.pool_tokens // args.block_size} blocks of {args.block_size}; trace and models "
            f"{args.speedup:g}x faster (latencies x{args.speedup:g}); {args.repeat} rounds, rows "
            "interleaved; figures min / median / max"
        )
        names = [n for n in args.rows.split(",") if n]
        runs: dict[str, list[dict]] = {name: [] for name in names}
        with (directory / "router.log").open("a") as log:
            for round_ in range(args.repeat):
                for name in names:
                    if name.startswith("dynamo-"):
                        run = run_dynamo(args, trace, dynamo_model, name[7:], log)
                    else:
                        run = run_ours(args, trace, model, overlay, name)
                    runs[name].append(run)
                    print(f"round {round_ + 1}: {name}: {run}", file=sys.stderr, flush=True)
    print_tables(runs, args.requests)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
