import logging
from pathlib import Path

import pytest
import structlog

from schedkit.cli import main
from schedkit.logs import logs_to_stderr

WIRING = Path(__file__).resolve().parents[2] / "wiring.yaml"


def test_logs_go_to_stderr_inside_and_the_setup_found_comes_back_after(capsys):
    structlog.reset_defaults()
    with logs_to_stderr():
        structlog.get_logger("inside").warning("to.stderr")
    structlog.get_logger("after").warning("to.stdout")  # structlog's own default
    out, err = capsys.readouterr()
    assert "to.stderr" in err and "to.stderr" not in out
    assert "to.stdout" in out and "to.stdout" not in err
    assert not structlog.is_configured()

    quiet = structlog.make_filtering_bound_logger(logging.ERROR)
    structlog.configure(wrapper_class=quiet)
    with pytest.raises(KeyError), logs_to_stderr():
        raise KeyError("a command that fails")
    assert structlog.get_config()["wrapper_class"] is quiet
    assert structlog.get_config()["logger_factory"] is not None


def test_a_command_run_in_process_leaves_the_logging_setup_as_it_found_it(capsys):
    structlog.reset_defaults()
    assert main(["validate", str(WIRING)]) == 0
    assert not structlog.is_configured()

    factory = structlog.PrintLoggerFactory()
    structlog.configure(
        logger_factory=factory, processors=[structlog.processors.KeyValueRenderer()]
    )
    before = structlog.get_config()
    assert main(["validate", str(WIRING)]) == 0
    assert main(["validate", str(WIRING.with_name("no-such-wiring.yaml"))]) == 2
    assert structlog.get_config() == before
    assert "wiring is valid" in capsys.readouterr().out


def test_nested_uses_unwind_to_the_setup_found_first_and_keep_what_others_set_inside():
    structlog.reset_defaults()
    first, second = logs_to_stderr(), logs_to_stderr()  # say, two workers on threads
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # threads end in any order
    assert not structlog.is_configured()
    second.__exit__(None, None, None)
    assert not structlog.is_configured()

    capture = structlog.testing.LogCapture()
    with logs_to_stderr():
        structlog.configure(processors=[capture])  # another thread's log capture, say
    assert structlog.get_config()["processors"] == [capture]
    assert isinstance(structlog.get_config()["logger_factory"], structlog.PrintLoggerFactory)
