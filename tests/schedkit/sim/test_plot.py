"""``--plot``: the data the plot is drawn from, the PNG itself (when matplotlib is installed),
and the error that names the extra to install (when it is not)."""

import subprocess
import sys
from pathlib import Path

import pytest

from schedkit.core.schedule_batch import FinishLength, Req
from schedkit.sim import plot
from schedkit.workloads.samples import Tally

ROOT = Path(__file__).resolve().parents[3]


def samples_of(n):
    samples = Tally()
    for i in range(n):
        req = Req(rid=f"r{i}", origin_input_ids=[1], arrival_time=0.0)
        req.scheduled_time, req.first_token_time, req.finish_time = 0.0, 0.01 * (i + 1), 1.0 + i
        req.output_ids = [7, 7, 7]
        req.itl = [0.02, 0.03]
        req.finished_reason = FinishLength(3)
        samples.add(req)
        samples.timeline.add(float(i), i % 5, n - i)
    return samples


def test_plot_data_holds_the_cdfs_and_the_timeline():
    data = plot.plot_data(samples_of(50), max_points=10)
    ttft_x, ttft_y = data["cdf"]["TTFT"]
    assert ttft_x[-1] == pytest.approx(0.5) and ttft_y[-1] == 1.0 and len(ttft_x) == 10
    assert data["cdf"]["ITL"] == ([0.02] * 5 + [0.03] * 5, [i / 10 for i in range(1, 11)])
    assert data["cdf"]["E2E"][0][-1] == 50.0
    assert data["timeline"]["queued"] == [50 - i for i in range(50)]
    assert data["timeline"]["running"][:6] == [0, 1, 2, 3, 4, 0]


def test_without_matplotlib_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if absent
    with pytest.raises(plot.PlotError, match=r"pip install 'schedkit\[plot\]'"):
        plot.require_matplotlib()


def test_run_with_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run.png"
    result = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", "run", str(ROOT / "wiring.yaml"),
         "--num-requests", "40", "--plot", str(out), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {out}" in result.stderr


def test_plot_into_a_missing_directory_is_refused_before_the_run(tmp_path):
    pytest.importorskip("matplotlib")
    missing = tmp_path / "nowhere" / "run.png"
    result = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", "run", str(ROOT / "wiring.yaml"),
         "--num-requests", "5", "--plot", str(missing)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"no such directory {missing.parent}" in result.stderr


def test_run_with_plot_but_no_matplotlib_stops_at_once_naming_the_extra(tmp_path):
    blocked = (
        "import sys; sys.modules['matplotlib'] = None; "
        "from schedkit.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocked, "run", str(ROOT / "wiring.yaml"),
         "--num-requests", "5", "--plot", str(tmp_path / "run.png")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "install the plot extra: pip install 'schedkit[plot]'" in result.stderr
    assert "requests done" not in result.stdout and not (tmp_path / "run.png").exists()


def test_an_extension_matplotlib_cannot_write_is_refused_before_the_run(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(plot.PlotError, match=r"cannot write a \.foo file; valid extensions: .*png"):
        plot.check_plot_target(tmp_path / "run.foo")
    plot.check_plot_target(tmp_path / "run.SVG")  # any case
    plot.check_plot_target(tmp_path / "run")  # no extension: matplotlib's default format
