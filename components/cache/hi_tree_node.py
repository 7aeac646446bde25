"""The host-memory tier's node and arguments: ``HiTreeNode`` (a radix node that may hold a
host copy of its KV), the write policies and the default transfer figures."""

from __future__ import annotations

import attrs

from schedkit.components.cache.tree_node import TreeNode

__all__ = [
    "H100_PCIE5_HOST_BANDWIDTH",
    "LLAMA3_8B_KV_BYTES_PER_TOKEN",
    "WRITE_POLICIES",
    "HiTreeNode",
    "check_positive",
    "check_write_policy",
]

WRITE_POLICIES = ("write_through", "write_back")
# Llama-3.1-8B in 16-bit: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes.
LLAMA3_8B_KV_BYTES_PER_TOKEN = 131072
# Host-to-device copy rate achieved over PCIe Gen5 x16 (64 GB/s raw) on an H100.
H100_PCIE5_HOST_BANDWIDTH = 50e9


class HiTreeNode(TreeNode):
    """A node of the host-tier cache: one that may also hold its KV in host memory
    (``host_value``, ``backuped``, ``protect_host`` / ``release_host``, kept on ``TreeNode``
    as in SGLang, where every node has them)."""

    __slots__ = ()


def check_write_policy(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value not in WRITE_POLICIES:
        raise ValueError(
            f"unknown hicache_write_policy {value!r}; valid: {', '.join(WRITE_POLICIES)}"
        )


def check_positive(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")
