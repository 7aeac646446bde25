"""The host-memory tier's arguments: the write policies and the default transfer figures."""

from __future__ import annotations

import attrs

__all__ = [
    "H100_PCIE5_HOST_BANDWIDTH",
    "LLAMA3_8B_KV_BYTES_PER_TOKEN",
    "WRITE_POLICIES",
    "check_positive",
    "check_write_policy",
]

WRITE_POLICIES = ("write_through", "write_back")
# Llama-3.1-8B in 16-bit: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes.
LLAMA3_8B_KV_BYTES_PER_TOKEN = 131072
# Host-to-device copy rate achieved over PCIe Gen5 x16 (64 GB/s raw) on an H100.
H100_PCIE5_HOST_BANDWIDTH = 50e9


def check_write_policy(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value not in WRITE_POLICIES:
        raise ValueError(
            f"unknown hicache_write_policy {value!r}; valid: {', '.join(WRITE_POLICIES)}"
        )


def check_positive(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")
