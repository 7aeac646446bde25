"""Where a scheduler sits in the parallel layout: tensor, pipeline, data and context ranks."""

from __future__ import annotations

from typing import Any

import attrs

from schedkit.core.component import ArgumentError, component

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

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        for name, rank, size in (
            ("tp", args.tp_rank, args.tp_size),
            ("pp", args.pp_rank, args.pp_size),
        ):
            if size < 1 or not 0 <= rank < size:
                raise ArgumentError(
                    f"{name}_rank", f"{name}_rank must be in [0, {name}_size), got {rank}/{size}"
                )
        dp_rank, dp_size = args.dp_rank, args.dp_size
        if dp_rank is not None and not 0 <= dp_rank < dp_size:
            raise ArgumentError(
                "dp_rank", f"dp_rank must be in [0, dp_size), got {dp_rank}/{dp_size}"
            )
        dp = dp_size if args.enable_dp_attention else 1
        if args.cp_size < 1 or args.tp_size % (dp * args.cp_size):
            raise ArgumentError(
                "tp_size",
                f"tp_size {args.tp_size} is not divisible by attention dp_size {dp} x "
                f"cp_size {args.cp_size}",
            )

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        dp = self.dp_size if self.enable_dp_attention else 1
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
