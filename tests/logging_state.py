"""``logging_kept()``: the process's logging setup (structlog's configuration, the stdlib
loggers) put back as it was when the block began. tests/conftest.py wraps every test in it,
so that a test that configures logging (or runs a command's ``main()`` in-process) leaves
none of it to the tests after it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from schedkit.logs import restore_structlog, structlog_state

__all__ = ["logging_kept"]

_LoggerState = tuple[int, list, list, bool, bool]


def _state(logger: logging.Logger) -> _LoggerState:
    return (
        logger.level,
        list(logger.handlers),
        list(logger.filters),
        logger.propagate,
        logger.disabled,
    )


def _stdlib_state() -> tuple[int, dict[logging.Logger, _LoggerState]]:
    """The level ``logging.disable`` set and the state of the root logger and of every
    logger made so far."""
    manager = logging.root.manager
    loggers = [logging.root, *manager.loggerDict.values()]
    return manager.disable, {
        logger: _state(logger) for logger in loggers if isinstance(logger, logging.Logger)
    }


def _restore_stdlib(saved: tuple[int, dict[logging.Logger, _LoggerState]]) -> None:
    """Put back what ``_stdlib_state`` saw (loggers made since keep their own setup)."""
    disable, loggers = saved
    if logging.root.manager.disable != disable:
        logging.disable(disable)
    for logger, state in loggers.items():
        if _state(logger) == state:
            continue
        level, handlers, filters, propagate, disabled = state
        logger.handlers[:] = handlers
        logger.filters[:] = filters
        logger.propagate, logger.disabled = propagate, disabled
        logger.setLevel(level)  # also clears the loggers' cached level checks


@contextlib.contextmanager
def logging_kept() -> Iterator[None]:
    """Inside, logging may be configured at will; on the way out it is as it was."""
    structlog_saved, stdlib_saved = structlog_state(), _stdlib_state()
    try:
        yield
    finally:
        restore_structlog(structlog_saved)
        _restore_stdlib(stdlib_saved)
