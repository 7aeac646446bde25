"""Print the figures the documentation quotes, each under its name, from real runs.

    python docs/figures.py              # every figure
    python docs/figures.py run swa      # some of them

Names: run (the default `schedkit run wiring.yaml` table), mooncake (the sample trace),
lpm-fcfs (the two policies over five seeds, 32 conversations/s), swa (the sliding-window
overlay's pool sizes),
custom-policy (examples/custom_policy against lpm), presets (the model and GPU presets),
preset-run (the default workload with the llama3-8b / h100 preset), calibrate (a fit of
steps the preset made),
json-keys (the `--json` keys of `schedkit run`), wire-format (the serve messages), protocols
(the protocol of each wiring key).
Each figure is a block of text printed as the docs show it; the docs test compares every
block marked `<!-- figures: NAME -->` in the docs with what this prints (wall-clock and
memory figures masked). Runs take a few seconds each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WIRING = ROOT / "wiring.yaml"
FCFS = {"components": {"policy": {"type": "fcfs", "args": {"tree_cache": None}}}}
LPM_FCFS_RATE = 32.0  # conversations/s: a queue forms (at the default 16 it mostly does not)


def _summary(*overlays, workload=None, seed: int = 0, rate: float | None = None):
    from schedkit import build, load_wiring
    from schedkit.sim.driver import drive
    from schedkit.workloads.workload import synthetic

    with build(load_wiring(WIRING, *overlays)) as assembly:
        return drive(assembly, workload or synthetic("chat", 400, rate, seed))


def _cli_run(*args: str) -> str:
    """``schedkit run`` in a process of its own, so that its wall time and memory are its own."""
    command = [sys.executable, "-m", "schedkit.cli", "run", str(WIRING), *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def run() -> str:
    return _cli_run().rstrip("\n")


def mooncake() -> str:
    trace = ROOT / "examples/traces/mooncake_sample.jsonl"
    table = _cli_run("--workload", str(trace), "--format", "mooncake").splitlines()
    keep = ("requests done", "TTFT", "prefix-cache", "simulated | wall")
    return "\n".join(line for line in table if line.startswith(keep))


def lpm_fcfs() -> str:
    rows = [
        "| policy | seed | prefix-cache hit rate | output tok/s (simulated) | TTFT p50 (ms) "
        "| TTFT p99 (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for seed in range(5):
        for name, overlays in (("lpm", ()), ("fcfs", (FCFS,))):
            s = _summary(*overlays, seed=seed, rate=LPM_FCFS_RATE)
            rows.append(
                f"| {name} | {seed} | {s.prefix_cache_hit_rate:.1%} | "
                f"{s.output_throughput:.0f} | {s.ttft_p50 * 1e3:.1f} | {s.ttft_p99 * 1e3:.0f} |"
            )
    return "\n".join(rows)


def swa() -> str:
    rows = [
        "| tree cache | swa_capacity (tokens) | prefix-cache hit rate | TTFT p50 (ms) |",
        "|---|---|---|---|",
    ]
    full = _summary()
    rows.append(
        f"| radix_cache | - | {full.prefix_cache_hit_rate:.1%} | {full.ttft_p50 * 1e3:.1f} |"
    )
    for capacity in (8192, 32768, 65536):
        overlay = {
            "components": {
                "tree_cache": {
                    "type": "swa_radix_cache",
                    "args": {"sliding_window_size": 256, "swa_capacity": capacity},
                }
            }
        }
        s = _summary(overlay)
        rows.append(
            f"| swa_radix_cache | {capacity:,} | {s.prefix_cache_hit_rate:.1%} | "
            f"{s.ttft_p50 * 1e3:.1f} |"
        )
    return "\n".join(rows)


def custom_policy() -> str:
    sys.path.insert(0, str(ROOT / "examples/custom_policy"))
    example = ROOT / "examples/custom_policy"
    rows = [
        "| setting | policy | output tok/s | TTFT p50 / p90 / p99 (ms) | ITL p50 (ms) "
        "| prefix-cache hit rate | simulated s |",
        "|---|---|---|---|---|---|---|",
    ]
    busy = example / "busy.yaml"
    limit = yaml.safe_load(busy.read_text())["components"]["scheduler"]["args"]
    settings = (
        ("default", [], None),
        (f"busy ({limit['max_running_requests']} running)", [busy], None),
        ("all at once", [], float("inf")),
    )
    for setting, overlays, rate in settings:
        for policy, extra in (("lpm", []), ("shortest_uncached_first", [example / "policy.yaml"])):
            s = _summary(*overlays, *extra, rate=rate)
            rows.append(
                f"| {setting} | {policy} | {s.output_throughput:.1f} | {s.ttft_p50 * 1e3:.0f} / "
                f"{s.ttft_p90 * 1e3:.0f} / {s.ttft_p99 * 1e3:.0f} | {s.itl_p50 * 1e3:.2f} | "
                f"{s.prefix_cache_hit_rate:.1%} | {s.simulated_seconds:.2f} |"
            )
    return "\n".join(rows)


def preset_run() -> str:
    from schedkit import load_wiring
    from schedkit.runner import presets as p

    preset, _ = p.preset_overlay(load_wiring(WIRING), "llama3-8b", "h100")
    pool = preset["components"]["allocator"]["args"]["size"]
    rows = [
        "| wiring | KV pool (tokens) | prefix-cache hit rate | TTFT p50 / p99 (ms) |",
        "|---|---|---|---|",
    ]
    for name, overlays, size in (
        ("default", (), 65536),
        ("--model llama3-8b --gpu h100", (preset,), pool),
    ):
        s = _summary(*overlays)
        rows.append(
            f"| {name} | {size:,} | {s.prefix_cache_hit_rate:.1%} | "
            f"{s.ttft_p50 * 1e3:.0f} / {s.ttft_p99 * 1e3:.0f} |"
        )
    return "\n".join(rows)


def calibrate() -> str:
    """``schedkit calibrate`` on 300 steps of each mode that the llama3-8b / h100 preset's
    cost model gives random batches, with 1% noise; then the coefficients that made them."""
    import math
    import random
    import tempfile

    from schedkit.core.schedule_batch import ForwardMode, Req, SamplingParams, ScheduleBatch
    from schedkit.runner.calibrate import TERMS
    from schedkit.runner.model_runner import SimulatedModelRunner
    from schedkit.runner.presets import GPUS, MODELS, runner_args

    truth = runner_args(MODELS["llama3-8b"], GPUS["h100"])
    runner, rng = SimulatedModelRunner(**truth), random.Random(0)

    def req(rid: str, prompt: int, outputs: int = 0) -> Req:
        params = SamplingParams(max_new_tokens=10)
        return Req(
            rid=rid, origin_input_ids=[1] * prompt, output_ids=[2] * outputs, sampling_params=params
        )

    lines = ["mode,batch_size,new_tokens,attention_pairs,context_tokens,step_time_ms"]
    for i in range(300):
        size = rng.randint(1, 4)
        prefix = [rng.choice([0, rng.randint(1, 8000)]) for _ in range(size)]
        new = [int(math.exp(rng.uniform(math.log(8), math.log(4096)))) for _ in range(size)]
        reqs = [req(f"p{i}-{j}", p + n) for j, (p, n) in enumerate(zip(prefix, new, strict=True))]
        batch = ScheduleBatch(
            reqs=reqs, forward_mode=ForwardMode.EXTEND, prefix_lens=prefix, extend_lens=new
        )
        ms = runner.prefill_cost(batch) * 1e3 * (1 + rng.gauss(0, 0.01))
        pairs = sum(n * p + n * (n + 1) // 2 for p, n in zip(prefix, new, strict=True))
        lines.append(f"prefill,{size},{sum(new)},{pairs},,{ms:.6f}")
        size = rng.randint(1, 256)
        length = int(math.exp(rng.uniform(math.log(50), math.log(8000))))
        reqs = [req(f"d{i}-{j}", length, 5) for j in range(size)]
        ms = runner.decode_cost(reqs) * 1e3 * (1 + rng.gauss(0, 0.01))
        context = sum(len(r.origin_input_ids) + len(r.output_ids) for r in reqs)
        lines.append(f"decode,{size},,,{context},{ms:.6f}")
    with tempfile.TemporaryDirectory() as where:
        steps = Path(where) / "steps.csv"
        steps.write_text("\n".join(lines) + "\n")
        command = [
            sys.executable,
            "-m",
            "schedkit.cli",
            "calibrate",
            str(steps),
            "--step-overhead-us",
            "126",
            "--request-overhead-us",
            "4.4",
        ]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    fitted = "\n\n".join(out.split("\n\n")[:2]).strip()
    names = [name for terms in TERMS.values() for name, _ in terms]
    made = ", ".join(f"{name} {truth[name]:.4g} s" for name in names)
    return f"{fitted}\n\nmade by: {made}"


def presets() -> str:
    from schedkit.runner import presets as p

    rows = [
        "| model | GPU | TP | KV pool (tokens) | prefill_fixed | prefill_per_token "
        "| attention_coeff | decode_fixed | decode_per_seq | decode_per_kv_token |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model_name, model in p.MODELS.items():
        tps = (model.default_tp, 8) if model.default_tp > 1 else (1,)
        for gpu_name, gpu in p.GPUS.items():
            for tp in tps:
                args = p.runner_args(model, gpu, tp)
                pool = p.kv_pool_tokens(model, gpu, tp, 16)
                rows.append(
                    f"| {model_name} | {gpu_name} | {tp} | {pool:,}"
                    f" | {args['prefill_fixed'] * 1e3:.2f} ms"
                    f" | {args['prefill_per_token'] * 1e6:.1f} us"
                    f" | {args['attention_coeff'] * 1e9:.2f} ns"
                    f" | {args['decode_fixed'] * 1e3:.2f} ms"
                    f" | {args['decode_per_seq'] * 1e6:.1f} us"
                    f" | {args['decode_per_kv_token'] * 1e9:.1f} ns |"
                )
    return "\n".join(rows)


def json_keys() -> str:
    from schedkit.sim.run_summary import JSON_KEYS

    rows = ["| key | unit | what it is |", "|---|---|---|"]
    rows += [f"| `{key}` | {unit} | {meaning} |" for key, unit, meaning in JSON_KEYS.values()]
    return "\n".join(rows)


def wire_format() -> str:
    import msgspec

    from schedkit.components.io import io_struct

    rows = ["| `kind` | direction | fields (type, default) |", "|---|---|---|"]
    messages = (
        (io_struct.GenerateReqInput, "client -> server"),
        (io_struct.ControlReq, "client -> server"),
        (io_struct.BatchTokenIDOutput, "server -> client"),
        (io_struct.BatchEmbeddingOutput, "server -> client"),
        (io_struct.ControlReply, "server -> client"),
        (io_struct.ErrorReply, "server -> client"),
        (io_struct.SamplingParamsInput, "inside generate"),
        (io_struct.RequestTimes, "inside token_ids"),
    )
    for struct, direction in messages:
        info = msgspec.inspect.type_info(struct)
        fields = []
        for field in info.fields:
            text = f"`{field.name}`: {_type_text(field.type)}"
            if field.default is not msgspec.NODEFAULT:
                text += f" = {field.default!r}"
            elif field.default_factory is not msgspec.NODEFAULT:
                text += f" = {field.default_factory()!r}"
            fields.append(text)
        tag = f"`{info.tag}`" if info.tag else f"({struct.__name__})"
        rows.append(f"| {tag} | {direction} | {'; '.join(fields)} |")
    return "\n".join(rows)


def _type_text(t) -> str:
    import msgspec

    name = type(t).__name__.removesuffix("Type").lower().replace("none", "null")
    if isinstance(t, msgspec.inspect.UnionType):
        return " or ".join(_type_text(x) for x in t.types)
    if isinstance(t, msgspec.inspect.ListType):
        bound = f" (at most {t.max_length:,})" if t.max_length is not None else ""
        return f"list[{_type_text(t.item_type)}]{bound}"
    if isinstance(t, msgspec.inspect.LiteralType):
        return " / ".join(repr(v) for v in t.values)
    if isinstance(t, msgspec.inspect.IntType):
        bounds = [
            f">= {t.ge}" if t.ge is not None else "",
            f"<= {t.le}" if t.le is not None else "",
            f"< {t.lt}" if t.lt is not None else "",
        ]
        extra = ", ".join(b for b in bounds if b)
        return f"int ({extra})" if extra else "int"
    if isinstance(t, msgspec.inspect.StrType) and t.max_length is not None:
        return f"str (at most {t.max_length} chars)"
    if isinstance(t, (msgspec.inspect.StructType, msgspec.inspect.DataclassType)):
        return t.cls.__name__
    if isinstance(t, msgspec.inspect.DictType):
        return "map"
    return name


def protocols() -> str:
    from schedkit.assembly.validate import protocol_members
    from schedkit.core.protocols import COMPONENT_PROTOCOLS

    rows = [
        "| wiring key | protocol | what it is for | members the assembly uses |",
        "|---|---|---|---|",
    ]
    for key, protocol in COMPONENT_PROTOCOLS.items():
        purpose = " ".join(protocol.__doc__.split("\n\n")[0].split())
        members = ", ".join(f"`{m}`" for m in protocol_members(protocol))
        rows.append(f"| `{key}` | `{protocol.__name__}` | {purpose} | {members} |")
    return "\n".join(rows)


_OWN = ("run", "mooncake")  # figures of a `schedkit run` process of their own

FIGURES: dict[str, Callable[[], str]] = {
    "run": run,
    "mooncake": mooncake,
    "lpm-fcfs": lpm_fcfs,
    "swa": swa,
    "custom-policy": custom_policy,
    "presets": presets,
    "calibrate": calibrate,
    "preset-run": preset_run,
    "json-keys": json_keys,
    "wire-format": wire_format,
    "protocols": protocols,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("names", nargs="*", choices=[[], *FIGURES], help="figures (default all)")
    args = parser.parse_args()
    # Free loopback ports for the KV events of every run (another scheduler may hold 5557).
    os.environ.setdefault("SCHEDKIT_KV_EVENTS_ENDPOINT", "tcp://127.0.0.1:0")
    os.environ.setdefault("SCHEDKIT_KV_REPLAY_ENDPOINT", "tcp://127.0.0.1:0")
    import structlog

    structlog.configure(logger_factory=lambda *_: structlog.PrintLogger(sys.stderr))
    names = args.names or list(FIGURES)
    # The `schedkit run` figures first: a child's peak memory starts from this process's peak
    # at the fork, so they must come before this process has run anything itself.
    texts = {name: FIGURES[name]() for name in sorted(names, key=lambda n: n not in _OWN)}
    for name in names:
        print(f"== {name}")
        print(texts[name])


if __name__ == "__main__":
    main()
