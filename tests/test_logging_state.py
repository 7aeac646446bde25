import logging

import structlog

from tests.logging_state import logging_kept


def test_every_test_runs_with_its_logging_setup_put_back_after(request):
    assert "_logging_kept" in request.fixturenames  # tests/conftest.py's autouse fixture


def test_logging_kept_puts_back_structlog_and_the_stdlib_loggers():
    structlog.reset_defaults()
    named = logging.getLogger("schedkit.tests.kept")
    named.setLevel(logging.INFO)
    root_level, root_handlers = logging.root.level, list(logging.root.handlers)
    with logging_kept():
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
        logging.root.addHandler(logging.NullHandler())
        logging.root.setLevel(logging.DEBUG)
        named.setLevel(logging.CRITICAL)
        named.addHandler(logging.NullHandler())
        named.propagate = False
        logging.disable(logging.WARNING)
    assert not structlog.is_configured()
    assert (logging.root.level, logging.root.handlers) == (root_level, root_handlers)
    assert (named.level, named.handlers, named.propagate) == (logging.INFO, [], True)
    assert named.isEnabledFor(logging.INFO)  # no stale cached answer from inside
    assert logging.root.manager.disable == logging.NOTSET

    structlog.configure(processors=[structlog.processors.KeyValueRenderer()])
    before = structlog.get_config()
    with logging_kept():
        before["processors"].append(structlog.processors.JSONRenderer())  # changed in place
        structlog.reset_defaults()
    after = structlog.get_config()
    assert structlog.is_configured() and len(after["processors"]) == 1
    assert isinstance(after["processors"][0], structlog.processors.KeyValueRenderer)
