"""Where a schedkit command sends its logs while it runs: ``logs_to_stderr()``.

A command (``schedkit ...``'s ``main``, a fleet worker's ``worker_main``) logs through
structlog, whose configuration is process-wide. Run as a program, the process ends with the
command; called in-process (a test, a notebook, a caller embedding a worker in a thread) the
configuration it set would outlive it, and its loggers would keep writing to whatever
``sys.stderr`` was then (a test's capture, closed since). So the command sets structlog's
logger factory for as long as it runs and puts back the one it found.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import structlog

__all__ = ["logs_to_stderr", "restore_structlog", "structlog_state"]


def _stderr_logger(*_: Any) -> structlog.PrintLogger:
    return structlog.PrintLogger(sys.stderr)  # the stderr of the moment a logger is made


def structlog_state() -> tuple[bool, dict[str, Any]]:
    """structlog's configuration now: whether it was configured, and its settings (the
    processor list copied, so that changes made to it in place later do not reach it)."""
    config = structlog.get_config()
    config["processors"] = list(config["processors"])
    return structlog.is_configured(), config


def restore_structlog(state: tuple[bool, dict[str, Any]]) -> None:
    """Put back a configuration ``structlog_state`` returned (unconfigured: the defaults)."""
    configured, config = state
    structlog.reset_defaults()
    if configured:
        structlog.configure(**config)


@contextlib.contextmanager
def logs_to_stderr() -> Iterator[None]:
    """structlog writes to stderr inside, so that stdout carries only what a command prints
    (tables, JSON); the logger factory from before is put back on the way out (structlog's
    defaults, if it was not configured and nothing else changed meanwhile). Only the factory:
    what another thread configured meanwhile (a log capture) stays, and nested or concurrent
    uses (workers on threads) unwind to the setup found first."""
    configured, config = structlog_state()
    structlog.configure(logger_factory=_stderr_logger)
    try:
        yield
    finally:
        now = structlog.get_config()
        if now["logger_factory"] is _stderr_logger:  # not replaced since
            now["logger_factory"] = config["logger_factory"]
            if not configured and now == config:
                structlog.reset_defaults()
            else:
                structlog.configure(logger_factory=config["logger_factory"])
