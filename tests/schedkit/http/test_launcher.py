"""The ``http_server`` component's checks, before any process starts."""

from __future__ import annotations

import re

import pytest

from schedkit.http.config import parse_address
from schedkit.http.launcher import HttpServer


def test_a_non_loopback_address_is_refused_without_allow_remote():
    with pytest.raises(ValueError, match="not a loopback address"):
        HttpServer(address="0.0.0.0:8000", scheduler_endpoint="ipc:///nowhere")


def test_an_unknown_or_bad_limit_is_named():
    with pytest.raises(ValueError, match="valid keys"):
        HttpServer(address="127.0.0.1:0", scheduler_endpoint="x", limits={"max_bodies": 1})
    with pytest.raises(ValueError, match="max_body_bytes"):
        HttpServer(address="127.0.0.1:0", scheduler_endpoint="x", limits={"max_body_bytes": 0})


@pytest.mark.parametrize("text", ["127.0.0.1:http", "host:70000", "127.0.0.1:-1"])
def test_bad_addresses_say_what_is_valid(text):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(text)


def test_a_port_alone_is_on_loopback():
    assert parse_address("8000") == ("127.0.0.1", 8000)
    assert parse_address("[::1]:0") == ("::1", 0)


@pytest.mark.parametrize(
    ("keys", "admin", "field"),
    [
        ([""], None, "api_keys[0]"),
        (["good", "with space"], None, "api_keys[1]"),
        (["caf\u00e9"], None, "api_keys[0]"),
        ([], "", "admin_api_key"),
    ],
)
def test_a_key_no_client_could_send_is_refused(keys, admin, field):
    """An empty key once dropped silently left every route open."""
    match = rf"{re.escape(field)}: an API key is 1 or more printable ASCII characters"
    with pytest.raises(ValueError, match=match):
        HttpServer(
            address="127.0.0.1:0", scheduler_endpoint="x", api_keys=keys, admin_api_key=admin
        )


@pytest.mark.parametrize("value", [float("inf"), 1e6])
def test_a_time_limit_is_at_most_a_day(value):
    with pytest.raises(ValueError, match=r"header_timeout"):
        HttpServer(address="127.0.0.1:0", scheduler_endpoint="x", limits={"header_timeout": value})
