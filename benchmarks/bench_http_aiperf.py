"""A real load generator from the package index, NVIDIA's ``aiperf``, pointed at ``schedkit serve
--http`` with its synthetic random-token dataset: streamed ``/v1/completions``.

Offline: ``aiperf`` builds its prompts with a byte-level Hugging Face tokenizer made here (one
token per UTF-8 byte, ids equal to the bytes, as the server's built-in tokenizer counts them),
placed in a private Hugging Face cache as ``schedkit/bytes`` so that it loads with
``HF_HUB_OFFLINE=1`` and no model hub is asked for anything; output tokens are the server's
counts (``--use-server-token-count``). Prints ``aiperf``'s own summary table.

Usage: ``python benchmarks/bench_http_aiperf.py --aiperf PATH`` where PATH is the ``aiperf``
executable of an environment with ``pip install aiperf`` (it needs its own: its dependencies
are many).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from schedkit.testing.serving import start_http_serve, stop_serve

MODEL = "schedkit/bytes"
SNAPSHOT = "0" * 40


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-to-character table of byte-level BPE tokenizers (GPT-2's)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_tokenizer(hf_home: Path) -> Path:
    """A byte-level tokenizer (id = byte) as a Hugging Face cache entry; its directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = _bytes_to_unicode()
    tokenizer = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    repo = hf_home / "hub" / f"models--{MODEL.replace('/', '--')}"
    snapshot = repo / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    tokenizer.save(str(snapshot / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768}
    (snapshot / "tokenizer_config.json").write_text(json.dumps(config))
    return snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiperf", required=True, help="the aiperf executable")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        hf_home = Path(tmp) / "hf"
        write_tokenizer(hf_home)
        server, url, _ = start_http_serve("--served-model-name", MODEL)
        try:
            env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
            env["TRANSFORMERS_OFFLINE"] = "1"
            command = [args.aiperf, "profile", "--model", MODEL, "--tokenizer", MODEL]
            command += ["--url", url, "--endpoint-type", "completions", "--streaming"]
            command += ["--synthetic-input-tokens-mean", str(args.input_tokens)]
            command += ["--output-tokens-mean", str(args.output_tokens)]
            # Output tokens as the server counts them: the simulated model's ids above 255 are
            # words of several bytes, which a byte tokenizer would count byte by byte.
            command += ["--extra-inputs", "ignore_eos:true", "--use-server-token-count"]
            command += ["--request-count", str(args.requests)]
            command += ["--concurrency", str(args.concurrency), "--ui-type", "none"]
            command += ["--artifact-dir", str(Path(tmp) / "artifacts")]
            print(
                f"aiperf against schedkit serve --http: {args.requests} streamed requests, "
                f"{args.concurrency} at once, ~{args.input_tokens} prompt tokens, "
                f"{args.output_tokens} new"
            )
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            lines = result.stdout.splitlines()
            title = [
                i for i, line in enumerate(lines) if line.strip() == "NVIDIA AIPerf | LLM Metrics"
            ]
            if result.returncode != 0 or not title:
                print(f"aiperf failed (status {result.returncode}):")
                print("\n".join((result.stdout + result.stderr).splitlines()[-30:]))
                return 1
            end = next(i for i in range(title[0], len(lines)) if lines[i].startswith("└"))
            print("\n".join(lines[title[0] : end + 1]))
        finally:
            stop_serve(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
