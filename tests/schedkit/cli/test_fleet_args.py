"""``schedkit fleet``'s options: values refused by their type, options that do not go
together."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedkit.cli import main

WIRING = str(Path(__file__).resolve().parents[3] / "wiring.yaml")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--workers", "0"], "expected a whole number > 0"),
        (["--router-arg", "no-equals"], "expected KEY=VALUE, got 'no-equals'"),
        (["--cache-threshold", "-1"], "expected a number >= 0"),
    ],
)
def test_bad_options_are_refused(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fleet", WIRING, *option])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_launcher_and_heartbeats_are_for_live_workers(capsys):
    assert main(["fleet", WIRING, "--offline", "--launcher", "ray"]) == 2
    assert "--launcher apply to live workers" in capsys.readouterr().err
    assert main(["fleet", WIRING, "--offline", "--heartbeat-timeout", "2"]) == 2
    assert "--heartbeat-timeout apply to live workers" in capsys.readouterr().err
