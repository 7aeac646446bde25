import socket

import pytest

from schedkit.endpoints import tcp_address


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("tcp://127.0.0.1:5557", (socket.AF_INET, "127.0.0.1", "5557")),
        ("tcp://[::1]:0", (socket.AF_INET6, "::1", "0")),
        ("tcp://localhost:*", (socket.AF_INET, "localhost", "*")),
    ],
)
def test_tcp_address_splits_family_host_and_port(endpoint, expected):
    assert tcp_address(endpoint) == expected
