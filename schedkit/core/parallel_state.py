"""Where a scheduler sits in the parallel layout: tensor, pipeline, data and context ranks."""

from __future__ import annotations

import attrs

from schedkit.core.component import component

__all__ = ["ParallelState"]


@component("parallel_state", frozen=True)
class ParallelState:
    """A frozen value object with every rank and size a scheduler component may read.

    Given the layout (tensor-parallel rank and size, pipeline rank, data-parallel size,
    context-parallel size, DP attention on or off) it derives the attention ranks the way
    SGLang does: with DP attention of size D over TP size T and context-parallel size C,
    ``attn_tp_size = T // D // C``, ``attn_tp_rank = tp_rank % attn_tp_size`` and
    ``attn_dp_rank = tp_rank // (attn_tp_size * C)`` (0 without DP attention).
    ``dp_rank`` is the data-parallel rank of a scheduler run per DP rank (None when unset).
    """

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    dp_rank: int | None = None
    dp_size: int = 1
    cp_size: int = 1
    enable_dp_attention: bool = False

    attn_tp_rank: int = attrs.field(init=False)
    attn_tp_size: int = attrs.field(init=False)
    attn_cp_rank: int = attrs.field(init=False)
    attn_cp_size: int = attrs.field(init=False)
    attn_dp_rank: int = attrs.field(init=False)
    attn_dp_size: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        for name, rank, size in (
            ("tp", self.tp_rank, self.tp_size),
            ("pp", self.pp_rank, self.pp_size),
        ):
            if size < 1 or not 0 <= rank < size:
                raise ValueError(f"{name}_rank must be in [0, {name}_size), got {rank}/{size}")
        if self.dp_rank is not None and not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"dp_rank must be in [0, dp_size), got {self.dp_rank}/{self.dp_size}")
        dp = self.dp_size if self.enable_dp_attention else 1
        if self.cp_size < 1 or self.tp_size % (dp * self.cp_size):
            raise ValueError(
                f"tp_size {self.tp_size} is not divisible by attention dp_size {dp} x "
                f"cp_size {self.cp_size}"
            )
        attn_tp_size = self.tp_size // dp // self.cp_size
        derived = {
            "attn_tp_size": attn_tp_size,
            "attn_tp_rank": self.tp_rank % attn_tp_size,
            "attn_cp_size": self.cp_size,
            "attn_cp_rank": (self.tp_rank // attn_tp_size) % self.cp_size,
            "attn_dp_size": dp,
            "attn_dp_rank": (
                self.tp_rank // (attn_tp_size * self.cp_size) if self.enable_dp_attention else 0
            ),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @property
    def publishes_kv_events(self) -> bool:
        """True on the one rank per DP rank that records and publishes KV events."""
        return self.attn_tp_rank == 0 and self.attn_cp_rank == 0 and self.pp_rank == 0
