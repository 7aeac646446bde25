"""``schedkit fleet``: the summary as a table and as JSON, and refused options."""

from __future__ import annotations

import json
from pathlib import Path

from schedkit.cli import main

WIRING = str(Path(__file__).resolve().parents[3] / "wiring.yaml")
SMALL = ["--synthetic", "shared-prefix", "--num-requests", "40", "--rate", "40"]


def test_offline_json_summary(capsys, monkeypatch):
    args = ["fleet", WIRING, "--offline", "--workers", "3", "--router", "kv", "--json", *SMALL]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    taken = []
    monkeypatch.setattr("schedkit.sim.driver.Stepper.run_decode", lambda *a: taken.append(a))
    assert main([*args, "--num-requests", "6", "--step-by-step"]) == 0
    assert json.loads(capsys.readouterr().out)["fleet"]["requests_done"] == 6
    assert not taken  # every step ran on its own (the figures' equality: test_offline.py)
    assert (data["policy"], data["mode"]) == ("kv", "offline")
    assert [w["name"] for w in data["workers"]] == ["0", "1", "2"]
    assert data["fleet"]["requests_done"] == 40
    assert sum(w["requests_routed"] for w in data["workers"]) == 40
    assert 0 < data["fleet"]["prefix_cache_hit_rate"] < 1
    assert data["load_imbalance"] >= 1.0
    assert data["simulated_s"] > 0


def test_offline_table(capsys):
    assert (
        main(["fleet", WIRING, "--offline", "--workers", "2", "--router", "round_robin", *SMALL])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-2:] == ["round_robin", "(offline)"]
    assert lines[3].split()[-7:] == ["40", "/", "0", "/", "0", "/", "0"]
    for label in ("TTFT p50 / p90 / p99 (ms)", "queue time p50 / p90 / p99 (s)", "throughput"):
        assert any(line.startswith(label) for line in lines), label
    head = lines.index("") + 1
    assert lines[head].split()[:3] == ["worker", "routed", "done"]
    assert [line.split()[:3] for line in lines[head + 1 : head + 3]] == [
        ["0", "20", "20"],
        ["1", "20", "20"],
    ]


def test_bad_workload_file_is_reported(tmp_path, capsys):
    bad = tmp_path / "w.jsonl"
    bad.write_text('{"prompt_len": 0}\n')
    assert main(["fleet", WIRING, "--offline", "--workload", str(bad)]) == 2
    assert f"{bad}:1: 'prompt_len' must be >= 1" in capsys.readouterr().err


def test_live_json_summary(capsys):
    small = ["--synthetic", "shared-prefix", "--num-requests", "20", "--rate", "40"]
    assert main(["fleet", WIRING, "--workers", "2", "--router", "kv", "--json", *small]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "live"
    assert data["simulated_s"] is None
    assert data["fleet"]["requests_done"] == 20
    assert all(w["alive"] and w["peak_rss_mib"] > 0 for w in data["workers"])
    # Queue time live: the router's wait plus each worker's, as the worker reports it.
    fleet = data["fleet"]
    assert fleet["ttft_p90_s"] > 0 and 0 <= fleet["queue_time_p90_s"] <= fleet["ttft_p99_s"]
    assert all(w["load_over_time"]["seconds"] for w in data["workers"])


def test_kv_settings_reach_the_policy_and_others_refuse_them(capsys):
    args = ["fleet", WIRING, "--offline", "--json", *SMALL, "--balance-abs-threshold", "0"]
    assert main([*args, "--balance-rel-threshold", "0"]) == 0
    # Every routing is "imbalanced" unless all loads are equal: the least loaded each time.
    data = json.loads(capsys.readouterr().out)
    assert data["load_imbalance"] < 1.1
    assert (
        main(["fleet", WIRING, "--offline", "--router", "least_loaded", "--cache-threshold", "0.5"])
        == 2
    )
    assert "routing policy 'least_loaded' takes no 'cache_threshold'" in capsys.readouterr().err


def test_closed_loop_admission_output_and_exit_codes(tmp_path, capsys):
    out = tmp_path / "requests.jsonl"
    args = ["fleet", WIRING, "--offline", "--workers", "2", "--json", *SMALL[:4]]
    assert main([*args, "--concurrency", "4", "--output", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["replay"] == "closed loop, 4 clients"
    assert max(w["peak_held_requests"] for w in data["workers"]) <= 4
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 40 and {r["outcome"] for r in records} == {"done"}
    assert all(r["worker"] in (0, 1) and r["ttft_s"] > 0 for r in records)
    # Each worker holds one request at a time and no router queue: the rest are refused,
    # counted per worker, never as latency; refusals asked for exit 0.
    tight = [*args, "--rate", "inf", "--worker-max-requests", "1", "--output", str(out)]
    assert main(tight) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fleet"]["requests_refused"] == 38 and data["fleet"]["requests_done"] == 2
    assert sum(w["requests_refused"] for w in data["workers"]) == 38
    assert all(  # a refusal at a worker's door counts as routed there
        w["requests_routed"] == w["requests_done"] + w["requests_refused"] for w in data["workers"]
    )
    outcomes = [json.loads(line)["outcome"] for line in out.read_text().splitlines()]
    assert outcomes.count("refused") == 38
    # With a router queue they wait there instead, and all finish.
    assert main([*tight, "--router-queue-requests", "100"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fleet"]["requests_done"] == 40 and data["router"]["peak_queued_requests"] > 30


def test_failed_requests_exit_3(tmp_path, capsys):
    trace = tmp_path / "w.jsonl"
    trace.write_text('{"prompt_len": 8}\n{"prompt_len": 70000}\n')  # never fits in the pool
    assert main(["fleet", WIRING, "--offline", "--workload", str(trace)]) == 3
    assert "1 request(s) failed" in capsys.readouterr().err


def test_a_speedup_sweep_prints_a_row_per_run(tmp_path, capsys):
    from schedkit.workloads.traces import write_mooncake_like

    trace = write_mooncake_like(tmp_path / "t.jsonl", 30, rate=8)
    args = ["fleet", WIRING, "--offline", "--workers", "2", "--workload", str(trace)]
    assert main([*args, "--format", "mooncake", "--speedup", "1,4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["speedup", "done"])
    assert [line.split()[:2] for line in lines[head + 1 :]] == [["1", "30"], ["4", "30"]]
    assert main([*args, "--concurrency", "2", "--speedup", "2"]) == 2
    assert "--concurrency replays in a closed loop" in capsys.readouterr().err


def test_router_names_and_settings_are_checked_before_anything_runs(capsys):
    assert main(["fleet", WIRING, "--offline", "--router", "random"]) == 2
    assert "unknown routing policy 'random'; valid: dynamo, kv" in capsys.readouterr().err
    bad = ["--router", "dynamo", "--router-arg", "temprature=0.5"]
    assert main(["fleet", WIRING, "--offline", *bad]) == 2
    assert "'dynamo' takes no 'temprature'; it takes overlap_score_weight" in (
        capsys.readouterr().err
    )


def test_offline_run_with_router_settings(capsys):
    small = ["--synthetic", "shared-prefix", "--num-requests", "12", "--rate", "40"]
    policy = ["--router", "dynamo", "--router-arg", "temperature=0.5", "--workers", "2"]
    assert main(["fleet", WIRING, "--offline", "--json", *policy, *small]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["policy"], data["fleet"]["requests_done"]) == ("dynamo", 12)
