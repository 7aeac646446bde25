import pytest

from schedkit.fleet.workers import LiveWorkers
from tests.schedkit.fleet.test_live import WIRING


@pytest.mark.parametrize(
    ("base", "addresses"),
    [
        ("127.0.0.1:30100", ["127.0.0.1:30100", "127.0.0.1:30101", "127.0.0.1:30102"]),
        ("127.0.0.1:0", ["127.0.0.1:0"] * 3),
        ("[::1]:8000", ["[::1]:8000", "[::1]:8001", "[::1]:8002"]),
    ],
)
def test_each_worker_front_end_listens_on_the_base_port_plus_its_rank(base, addresses):
    settings = {"address": base, "api_keys": ["k"]}
    workers = LiveWorkers(WIRING, 3, worker_http=settings, cap_workers=False)
    try:
        found = [workers._http_settings(rank) for rank in range(3)]
    finally:
        workers.close()
    assert [s["address"] for s in found] == addresses
    assert all(s["api_keys"] == ["k"] for s in found)


def test_without_worker_http_no_worker_gets_a_front_end():
    workers = LiveWorkers(WIRING, 2, cap_workers=False)
    try:
        assert workers._http_settings(0) is None
    finally:
        workers.close()
