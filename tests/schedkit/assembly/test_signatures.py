"""A method fits a protocol's when every call the protocol allows binds to it."""

import inspect

import pytest

from schedkit.assembly.signatures import call_problem, method_problem, signature_problems


def _sig(function) -> inspect.Signature:
    return inspect.signature(function)


def declared(batch, limit=8, *, include=("core",)): ...


def _positional_only(batch, limit=8, /, *, include=("core",)): ...


@pytest.mark.parametrize(
    "method",
    [
        lambda batch, limit=8, *, include=("core",): None,  # the same
        lambda b, limit=8, *, include=("core",), extra=1: None,  # required one renamed
        lambda *args, **kwargs: None,  # takes anything
        lambda batch, limit=8, more=0, **kwargs: None,  # extra defaulted
    ],
)
def test_methods_every_call_binds_to_fit(method):
    assert method_problem(_sig(declared), _sig(method)) is None


@pytest.mark.parametrize(
    ("method", "problem"),
    [
        (lambda: None, "takes 0 positional argument(s); callers pass up to 2 ('batch' has"),
        (lambda batch, cap=8, *, include=(): None, "names its parameter 2 'cap'; callers may"),
        (lambda batch, limit, *, include=(): None, "requires 'limit', which callers may leave"),
        (lambda batch, limit=8: None, "takes no argument 'include'"),
        (_positional_only, "takes 'limit' by position only; callers may pass it by name"),
        (lambda batch, limit=8, *, include=(), step: None, "requires 'step', which callers do"),
    ],
)
def test_methods_some_call_cannot_bind_to_are_told_why(method, problem):
    assert method_problem(_sig(declared), _sig(method)).startswith(problem)


class _Protocol:
    def report(self, batch): ...

    @property
    def stats(self): ...


class _Static:
    @staticmethod
    def report(batch): ...


class _Class:
    @classmethod
    def report(cls): ...


def test_static_and_class_methods_are_seen_as_an_instance_calls_them():
    assert signature_problems(_Protocol, _Static, ["report", "stats"]) == []
    [problem] = signature_problems(_Protocol, _Class, ["report", "stats"])
    assert problem.startswith("report() takes 0 positional argument(s)")


def test_a_late_call_is_checked_against_the_arity_of_its_field_type():
    from collections.abc import Callable

    assert call_problem(_Static, "report", Callable[[int], None]) is None
    assert call_problem(_Static, "report", Callable[..., None]) is None  # says nothing
    assert "calls it with 2 positional" in call_problem(
        _Static, "report", Callable[[int, int], None] | None
    )
