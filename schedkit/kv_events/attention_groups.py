"""Which KV events a prefix index follows when the engine has several KV-cache groups.

vLLM (0.33) tags each event with the KV-cache group its pages belong to (``group_idx``); a
``BlockStored`` also says the group's attention kind (``kv_cache_spec_kind``), and tiered
events where the pages live (``locality``). A hybrid model (full attention beside sliding
window or Mamba layers) stores the same page hash in several groups and evicts it from each on
its own, so an index that ignored the group would drop a prefix page the full-attention group
still holds as soon as the sliding-window group lets it go. The rules are Dynamo's KV router's
(``lib/kv-router/src/zmq_wire``): follow an event when

- its ``locality`` is absent or ``"LOCAL"`` (``"REMOTE"`` and anything else are not this
  rank's pages), and
- its kind is a main-attention one (full, MLA, sink-full attention), or, without a kind, its
  group was learned to be main attention from an earlier ``BlockStored``, or it names no group,
  or it names group 0 before any kind of that group was learned.

Events of SGLang and older vLLM carry none of these fields and are all followed.
"""

from __future__ import annotations

from schedkit.kv_events.event_structs import BlockRemoved, BlockStored

__all__ = ["MAIN_ATTENTION_KINDS", "MAX_GROUPS", "AttentionGroups"]

MAIN_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
# Groups whose kind is remembered per rank (a model has a handful); a group learned past it is
# treated as not learned.
MAX_GROUPS = 64


class AttentionGroups:
    """The kinds learned per (rank, group) and the decision for each event (``follows``)."""

    __slots__ = ("_main",)

    def __init__(self) -> None:
        self._main: dict[int, dict[int, bool]] = {}  # rank -> {group_idx: main attention}

    def follows(self, event: BlockStored | BlockRemoved, rank: int) -> bool:
        """Whether an index of prefix pages applies ``event`` (see the module docstring)."""
        locality = event.locality
        if locality is not None and locality != "LOCAL":
            return False
        group = event.group_idx
        kind = event.kv_cache_spec_kind if type(event) is BlockStored else None
        if kind is not None:
            main = kind in MAIN_ATTENTION_KINDS
            if group is not None:
                learned = self._main.setdefault(rank, {})
                if group in learned or len(learned) < MAX_GROUPS:
                    learned[group] = main
            return main
        if group is None:
            return True
        main = self._main.get(rank, {}).get(group)
        return group == 0 if main is None else main
