"""The order tests/parallel.py gives the suite's tests on xdist workers."""

from pathlib import Path

from tests import parallel

BESIDE = "tests/schedkit/core/test_schedule_batch.py"  # every test beside others
MIXED = "tests/schedkit/router/test_directions.py"  # the offline ones beside, the live one alone
ALONE = "tests/schedkit/fleet/test_live.py"


def test_files_all_beside_others_then_mixed_then_alone_each_beside_others_first():
    nodeids = [
        f"{ALONE}::test_a",
        f"{MIXED}::test_live_kv_router_matches_or_beats_round_robin",
        f"{MIXED}::test_no_policy_overloads_a_worker",
        f"{BESIDE}::test_b",
        f"{MIXED}::test_cache_aware_routers_match[kv]",
        f"{ALONE}::test_c",
        f"{BESIDE}::test_a",
    ]
    order = [nodeids[index] for index in parallel.run_order(nodeids)]
    assert order == [
        f"{BESIDE}::test_b",
        f"{BESIDE}::test_a",
        f"{MIXED}::test_no_policy_overloads_a_worker",
        f"{MIXED}::test_cache_aware_routers_match[kv]",
        f"{MIXED}::test_live_kv_router_matches_or_beats_round_robin",
        f"{ALONE}::test_a",
        f"{ALONE}::test_c",
    ]
    assert [parallel.file_first(nodeids[i]) for i in (3, 1, 0)] == [0, 1, 2]


def test_every_entry_names_a_test_file_and_a_test_in_it():
    root = Path(__file__).resolve().parents[1]
    for entry in parallel.BESIDE_OTHERS:
        file, _, name = entry.partition("::")
        assert (root / file).is_file(), entry
        assert not name or f"def {name}" in (root / file).read_text(), entry
