import argparse

import pytest

from schedkit.cli.args import number


@pytest.mark.parametrize("text", ["nan", "-1", "0", "-inf", "inf", "x"])
def test_positive_float_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a number > 0"):
        number(float)(text)


def test_inf_only_where_allowed():
    assert number(float, allow_inf=True)("inf") == float("inf")
    with pytest.raises(argparse.ArgumentTypeError, match="or inf"):
        number(float, allow_inf=True)("-inf")


def test_minimum_inclusive():
    assert number(float, allow_minimum=True)("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match=">= 0"):
        number(float, allow_minimum=True)("-1")


def test_whole_numbers():
    assert number(int)("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="whole number > 0"):
        number(int)("2.5")
