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
    """A tree node that may also hold its KV in host memory (``host_value``)."""

    __slots__ = ("host_ref_counter", "host_value")

    def __init__(self, key: list[int], value: list[int] | None, parent, namespace, t: int):
        super().__init__(key, value, parent, namespace, t)
        self.host_value: list[int] | None = None
        self.host_ref_counter = 0

    @property
    def backuped(self) -> bool:
        """Whether the node's KV has a copy in host memory."""
        return self.host_value is not None

    def protect_host(self) -> None:
        """Keep the host copy from host eviction until ``release_host``."""
        self.host_ref_counter += 1

    def release_host(self) -> None:
        """Undo one ``protect_host``."""
        if self.host_ref_counter <= 0:
            raise ValueError(f"release_host on {self!r}, whose host copy is not protected")
        self.host_ref_counter -= 1


def check_write_policy(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value not in WRITE_POLICIES:
        raise ValueError(
            f"unknown hicache_write_policy {value!r}; valid: {', '.join(WRITE_POLICIES)}"
        )


def check_positive(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")
