"""What the newest vLLM (0.33.0, and its main branch) publishes for a hybrid model, encoded
with vLLM's own declarations (``engine_structs``) and every optional field it has populated:
two KV-cache groups (0: full attention, 1: a 128-token sliding window) holding the same
pages, a LoRA request's extra keys, a session, a CPU offload tier and a remote page."""

from __future__ import annotations

import msgspec

from tests.schedkit.kv_events.engine_structs import (
    VllmMainBatch,
    VllmMainBlockRemoved,
    VllmNewestAllBlocksCleared,
    VllmNewestBatch,
    VllmNewestBlockRemoved,
    VllmNewestBlockStored,
)

# vLLM's int hashes are the low 64 bits of its SHA-256 page hashes, unsigned.
H1, H2, H3, REMOTE = 2**64 - 5, 2**63 + 11, 17, 2**64 - 1
PAGE = 4


def stored(hashes, parent, group: int, kind: str, **fields) -> VllmNewestBlockStored:
    """A BlockStored of a LoRA request in ``group``, every optional field set."""
    fields.setdefault("medium", "GPU")
    fields.setdefault("locality", "LOCAL")
    return VllmNewestBlockStored(
        hashes,
        parent,
        [7] * PAGE * len(hashes),
        PAGE,
        1,
        lora_name="sql-lora",
        extra_keys=[("sql-lora",)] * len(hashes),
        group_idx=group,
        kv_cache_spec_kind=kind,
        kv_cache_spec_sliding_window=128 if kind == "sliding_window" else None,
        session_id="chat-7",
        lookahead_token_ids=[[8]] * len(hashes),
        **fields,
    )


def hybrid_payloads(rank: int = 0) -> list[bytes]:
    """Four batches. The pages a prefix index must end with: H1, H2, H3 (group 0 holds them;
    group 1 lets H1 and H2 go, which an index ignoring groups would take for group 0's)."""
    batches = [
        VllmNewestBatch(
            1.0,
            [
                stored([H1, H2], None, 0, "full_attention"),
                stored([H1, H2], None, 1, "sliding_window"),
            ],
            rank,
        ),
        VllmNewestBatch(
            2.0,
            [
                VllmNewestBlockRemoved([H1], "GPU", group_idx=1, locality="LOCAL"),
                stored([H3], H2, 0, "full_attention"),
            ],
            rank,
        ),
        VllmNewestBatch(
            3.0,
            [
                stored([H1], None, 0, "full_attention", medium="CPU", ownership="kvcr"),
                stored([REMOTE], H3, 0, "full_attention", locality="REMOTE"),
            ],
            rank,
        ),
        VllmMainBatch(
            4.0,
            [
                VllmMainBlockRemoved(
                    [H2], "GPU", group_idx=1, locality="LOCAL", remaining_copy_counts=[0]
                ),
                VllmMainBlockRemoved([REMOTE], "GPU", 0, "REMOTE", remaining_copy_counts=[1]),
            ],
            rank,
        ),
    ]
    return [msgspec.msgpack.encode(batch) for batch in batches]


def cleared_payload(rank: int = 0) -> bytes:
    """vLLM's AllBlocksCleared batch."""
    return msgspec.msgpack.encode(VllmNewestBatch(5.0, [VllmNewestAllBlocksCleared()], rank))


def bytes_hash_payload(rank: int = 0, *, parent_only: bool = False) -> bytes:
    """A batch of vLLM run with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: SHA-256 page hashes as
    bytes (with ``parent_only``, only the parent is)."""
    hashes: list = [3] if parent_only else [b"\xab" * 32]
    event = stored(hashes, b"\xcd" * 32 if parent_only else None, 0, "full_attention")
    return msgspec.msgpack.encode(VllmNewestBatch(1.0, [event], rank))
