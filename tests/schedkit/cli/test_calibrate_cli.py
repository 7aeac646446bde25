import yaml

from schedkit import load_wiring
from schedkit.cli import main
from schedkit.runner.model_runner import SimulatedModelRunner
from tests.schedkit.runner.test_calibrate import measured_csv


def test_calibrate_prints_coefficients_error_and_a_usable_overlay(tmp_path, capsys):
    truth = SimulatedModelRunner(prefill_fixed=0.003, decode_per_seq=6e-5)
    steps = tmp_path / "steps.csv"
    steps.write_text(measured_csv(truth, rows=40, noise=0.0))
    written = tmp_path / "fitted.yaml"
    argv = ["calibrate", str(steps), "--step-overhead-us", "100", "--write", str(written)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "prefill: 40 steps" in out and "decode: 40 steps" in out
    assert "fit: RMSE" in out and "mean error" in out
    assert "held: step_overhead 100 us, request_overhead 0" in out
    printed = yaml.safe_load(out[out.index("# overlay:") :])
    assert printed == yaml.safe_load(written.read_text())
    args = printed["components"]["model_runner"]["args"]
    assert args["step_overhead"] == 1e-4
    # the held 100 us comes off the fixed terms
    assert abs(args["prefill_fixed"] - (0.003 - 1e-4)) < 1e-7
    assert abs(args["decode_per_seq"] - 6e-5) < 1e-9
    wiring = load_wiring("wiring.yaml", written)
    assert wiring.components["model_runner"].args["decode_per_seq"] == args["decode_per_seq"]


def test_calibrate_reports_bad_lines_and_exits_2(tmp_path, capsys):
    steps = tmp_path / "steps.csv"
    steps.write_text("mode,batch_size,step_ms\ndecode,1,2\n")
    assert main(["calibrate", str(steps)]) == 2
    err = capsys.readouterr().err
    assert f"{steps}:1: unknown column 'step_ms'; valid columns: mode, batch_size," in err
    assert "Traceback" not in err


def test_init_writes_the_default_wiring_and_refuses_to_overwrite(tmp_path, capsys):
    target = tmp_path / "wiring.yaml"
    assert main(["init", str(target)]) == 0
    with open("wiring.yaml", encoding="utf-8") as documented:
        assert target.read_text() == documented.read()
    target.write_text("# mine\n")
    assert main(["init", str(target)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert target.read_text() == "# mine\n"
    assert main(["init", str(target), "--example", "serve", "--force"]) == 0
    with open("examples/serve.yaml", encoding="utf-8") as documented:
        assert target.read_text() == documented.read()


def test_commands_use_the_shipped_wiring_when_no_file_is_given(capsys):
    assert main(["validate"]) == 0
    assert "schedkit/wirings/wiring.yaml: 13 components, wiring is valid" in capsys.readouterr().out


def test_a_file_that_cannot_be_written_is_named_without_a_traceback(tmp_path, capsys):
    missing = tmp_path / "no-such-dir"
    steps = tmp_path / "steps.csv"
    steps.write_text(measured_csv(SimulatedModelRunner(), rows=10, noise=0.0))
    for argv in (
        ["init", str(missing / "wiring.yaml")],
        ["calibrate", str(steps), "--write", str(missing / "fitted.yaml")],
        ["run", "--num-requests", "2", "--output", str(missing / "out.jsonl")],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"schedkit {argv[0]}: {missing}/" in err
        assert f"directory {missing} does not exist" in err
