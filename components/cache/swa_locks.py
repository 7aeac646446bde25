"""Locking in the sliding-window cache: a lock protects full KV up to the root and
sliding-window KV for the last ``sliding_window_size`` tokens only, and its window part can be
released early (``dec_swa_lock_only``); a new leaf may be cut so that a lock protects one
window of it. Mixed into ``SWARadixCache``."""

from __future__ import annotations

from schedkit.components.cache.swa_tree_node import SWATreeNode

__all__ = ["SWALocking"]


class SWALocking:
    """``inc_lock_ref`` / ``dec_lock_ref`` / ``dec_swa_lock_only`` of ``SWARadixCache``.

    Uses the cache's ``root``, ``disable``, ``sliding_window_size``, ``swa_allocator``, its
    full-lock helpers (``_lock``, ``_unlock`` and their checks) and its sliding-window counters
    (``_swa_evictable``, ``_swa_protected``), which ``_lock_swa`` keeps.
    """

    __slots__ = ()

    def inc_lock_ref(self, node: SWATreeNode) -> int | None:
        """Protect ``node``'s path from eviction: full KV up to the root, sliding-window KV for
        the last ``sliding_window_size`` tokens. Returns the token to pass to ``dec_lock_ref``.
        """
        if self.disable or node is self.root:
            return None
        self._check_lockable(node)
        window, root = self.sliding_window_size, self.root
        n, covered = node, 0
        while n is not root and covered < window:
            if n.swa_value is None:
                raise ValueError(
                    f"cannot lock {node!r}: a tombstone lies within its sliding window; lock the "
                    "last_node of a fresh match_prefix"
                )
            covered += len(n.key)
            n = n.parent
        self._lock(node)
        uuid, covered = None, 0
        while covered < window and node is not root:
            self._lock_swa(node, 1)
            covered += len(node.key)
            if covered >= window:
                if node.swa_uuid is None:
                    node.swa_uuid = self._new_uuid()
                uuid = node.swa_uuid
            node = node.parent
        return uuid

    def dec_lock_ref(
        self, node: SWATreeNode, swa_uuid_for_lock: int | None = None, skip_swa: bool = False
    ) -> None:
        """Undo one ``inc_lock_ref(node)``; ``swa_uuid_for_lock`` is what it returned.
        ``skip_swa``: its sliding-window part was released already (``dec_swa_lock_only``)."""
        if self.disable or node is self.root:
            return
        self._check_unlockable(node)
        if skip_swa:
            self._unlock(node)
            return
        root, n = self.root, node
        while n is not root:
            if n.swa_value is None or n.swa_lock_ref <= 0:
                raise ValueError(
                    f"dec_lock_ref({node!r}, swa_uuid_for_lock={swa_uuid_for_lock}) does not "
                    "match a lock; pass the value inc_lock_ref returned"
                )
            if swa_uuid_for_lock is not None and n.swa_uuid == swa_uuid_for_lock:
                break
            n = n.parent
        else:
            if swa_uuid_for_lock is not None:
                raise ValueError(f"swa_uuid_for_lock={swa_uuid_for_lock} is not on {node!r}'s path")
        self._unlock(node)
        while node is not root:
            self._lock_swa(node, -1)
            if swa_uuid_for_lock is not None and node.swa_uuid == swa_uuid_for_lock:
                break
            node = node.parent

    def dec_swa_lock_only(self, node: SWATreeNode, swa_uuid_for_lock: int | None = None) -> None:
        """Release only the sliding-window part of one ``inc_lock_ref(node)`` (SGLang's early
        release once a request decodes past its window); the full lock stays, to be released
        with ``dec_lock_ref(node, swa_uuid_for_lock, skip_swa=True)``. A node left without a
        window lock becomes evictable; a leaf frees its sliding-window KV at once and becomes
        a tombstone (its full KV stays while locked)."""
        if self.disable or node is self.root:
            return
        root, n = self.root, node
        while n is not root:
            if n.swa_value is None or n.swa_lock_ref <= 0:
                raise ValueError(
                    f"dec_swa_lock_only({node!r}, swa_uuid_for_lock={swa_uuid_for_lock}) does "
                    "not match a window lock; pass the value inc_lock_ref returned, once"
                )
            if swa_uuid_for_lock is not None and n.swa_uuid == swa_uuid_for_lock:
                break
            n = n.parent
        while node is not root:
            self._lock_swa(node, -1)
            if node.swa_lock_ref == 0 and not node.children:
                self.swa_allocator.free(node.swa_value)
                self._swa_evictable -= len(node.key)
                node.swa_value = None
            if swa_uuid_for_lock is not None and node.swa_uuid == swa_uuid_for_lock:
                break
            node = node.parent

    def _split_leaf_at_window(self, leaf: SWATreeNode) -> None:
        """Cut an unlocked live leaf longer than the page-aligned window so that its last
        node is exactly that window (SGLang's ``_maybe_split_leaf_for_swa_lock``)."""
        page = self.page_size
        tail = -(-self.sliding_window_size // page) * page
        if leaf.swa_lock_ref or leaf.swa_value is None or len(leaf.key) <= tail:
            return
        self._split(leaf, len(leaf.key) - tail)

    def _lock_swa(self, node: SWATreeNode, delta: int) -> None:
        if node.swa_lock_ref == 0:
            self._swa_evictable -= len(node.key)
            self._swa_protected += len(node.key)
        node.swa_lock_ref += delta
        if node.swa_lock_ref == 0:
            self._swa_evictable += len(node.key)
            self._swa_protected -= len(node.key)
