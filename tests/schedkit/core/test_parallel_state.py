import attrs
import pytest

from schedkit.core.parallel_state import ParallelState


def test_defaults_are_one_rank():
    state = ParallelState()
    assert (state.attn_tp_rank, state.attn_tp_size, state.attn_dp_rank, state.attn_cp_rank) == (
        0,
        1,
        0,
        0,
    )
    assert state.dp_rank is None
    assert state.publishes_kv_events


@pytest.mark.parametrize(
    ("tp_rank", "expected"),
    # tp=4, cp=2 without DP attention: attn_tp_size = 4 // 1 // 2 = 2
    [(0, (0, 0, 0, True)), (1, (1, 0, 0, False)), (2, (0, 1, 0, False)), (3, (1, 1, 0, False))],
)
def test_context_parallel_ranks(tp_rank, expected):
    state = ParallelState(tp_rank=tp_rank, tp_size=4, cp_size=2)
    assert state.attn_tp_size == 2 and state.attn_cp_size == 2
    got = (state.attn_tp_rank, state.attn_cp_rank, state.attn_dp_rank, state.publishes_kv_events)
    assert got == expected


def test_dp_attention_ranks_follow_sglang_formulas():
    # T=8, D=2, C=2: attn_tp_size = 8 // 2 // 2 = 2; attn_dp_rank = tp_rank // (2 * 2)
    ranks = [
        ParallelState(tp_rank=r, tp_size=8, dp_size=2, cp_size=2, enable_dp_attention=True)
        for r in range(8)
    ]
    assert [s.attn_tp_size for s in ranks] == [2] * 8
    assert [s.attn_tp_rank for s in ranks] == [0, 1] * 4
    assert [s.attn_dp_rank for s in ranks] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [s.publishes_kv_events for s in ranks].count(True) == 2  # one per DP rank


def test_pipeline_ranks_other_than_zero_do_not_publish():
    assert not ParallelState(pp_rank=1, pp_size=2).publishes_kv_events


def test_frozen():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ParallelState().tp_rank = 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_rank": 2, "tp_size": 2}, "tp_rank must be in [0, tp_size)"),
        ({"pp_rank": 1}, "pp_rank must be in [0, pp_size)"),
        ({"dp_rank": 2, "dp_size": 2}, "dp_rank must be in [0, dp_size)"),
        ({"tp_size": 4, "cp_size": 3}, "tp_size 4 is not divisible"),
        ({"tp_size": 2, "dp_size": 4, "enable_dp_attention": True}, "not divisible"),
    ],
)
def test_inconsistent_layouts_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        ParallelState(**kwargs)
