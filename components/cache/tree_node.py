"""The parts of a radix tree both prefix caches share: keys with their namespace, nodes, match
results, and comparing a key with a node's tokens in whole pages.

Token runs (``Tokens``) are plain lists of ints or packed, 4 bytes a token (``array('I')``, as
a request's prompt arrives): a node keeps its key in the form its insert gave it, so a packed
prompt is stored, compared, hashed and freed without making an int object per token.
"""

from __future__ import annotations

import itertools
from array import array
from typing import Any, TypeAlias

import attrs

__all__ = [
    "MatchResult",
    "RadixKey",
    "Tokens",
    "TreeNode",
    "as_list",
    "match_len",
    "slot_list",
    "tokens_of",
]

Tokens: TypeAlias = "list[int] | array"


def tokens_of(key: Any) -> Tokens:
    """``key``'s tokens as a cache stores them: a plain list or an ``array('I')`` as given,
    any other sequence (a ``RadixKey`` included) as a new list."""
    kind = type(key)
    if kind is list or (kind is array and key.typecode == "I"):
        return key
    return list(key)


def slot_list(value: Any) -> list[int]:
    """KV slots given to a cache as a list of ints: a list as is, anything with ``tolist()``
    (a tensor, an array) through it, another sequence of ints as a new list."""
    if type(value) is list:
        return value
    tolist = getattr(value, "tolist", None)
    return tolist() if tolist is not None else list(value)


def as_list(tokens: Tokens) -> list[int]:
    """``tokens`` as a list of ints (a list is returned as is)."""
    return tokens if type(tokens) is list else tokens.tolist()


class RadixKey(list):
    """Token ids together with the namespace they are cached in (``extra_key``,
    ``cache_salt``): keys in different namespaces never share a node.

    As SGLang's ``RadixKey``, indexing and slicing give a ``RadixKey`` in the same namespace
    (an index: a one-token key) and ``repr`` shows the first 10 tokens. The caches work on
    the plain token list (``token_ids``).
    """

    __slots__ = ("cache_salt", "extra_key")

    def __init__(
        self, token_ids: Any = (), extra_key: str | None = None, cache_salt: str | None = None
    ) -> None:
        super().__init__(token_ids)
        self.extra_key = extra_key
        self.cache_salt = cache_salt

    def __getitem__(self, index: Any) -> RadixKey:
        tokens = list.__getitem__(self, index)
        if not isinstance(index, slice):
            tokens = [tokens]
        return RadixKey(tokens, self.extra_key, self.cache_salt)

    def __repr__(self) -> str:
        preview = list.__getitem__(self, slice(10))
        more = "..." if len(self) > 10 else ""
        return f"{type(self).__name__}(extra_key={self.extra_key!r}, token_ids={preview}{more})"

    @property
    def token_ids(self) -> list[int]:
        """The tokens as a plain list (a copy)."""
        return list.__getitem__(self, slice(None))

    @property
    def namespace(self) -> tuple[str | None, str | None] | None:
        """``(extra_key, cache_salt)``, or None when both are absent."""
        if self.extra_key is None and self.cache_salt is None:
            return None
        return (self.extra_key, self.cache_salt)


class _NodeCounter(type):
    """The metaclass of ``TreeNode``: ``TreeNode.counter`` reads and sets the id the next node
    gets (SGLang's tests reset it), while nodes draw ids from ``TreeNode._ids`` (an
    ``itertools.count``) without writing to the class on every node."""

    @property
    def counter(cls) -> int:
        """The id the next node gets."""
        upcoming = next(TreeNode._ids)
        TreeNode._ids = itertools.count(upcoming)
        return upcoming

    @counter.setter
    def counter(cls, value: int) -> None:
        TreeNode._ids = itertools.count(value)


class TreeNode(metaclass=_NodeCounter):
    """One edge of the radix tree: a run of whole pages of tokens and their KV slots.

    ``key`` is a list of token ids, or an ``array('I')`` when the tokens were inserted packed.
    ``ckey`` is the node's key in its parent's ``children``. ``digests`` holds the pages'
    32-byte chain digests end to end and ``hashes`` their published hashes (None with events
    off); ``hash_value`` shows the digests as SGLang's per-page hex strings. ``value`` is None
    once the node has left the tree (evicted, or dropped by ``reset``). ``host_value`` holds
    the slots of a host-memory copy (host-tier cache only), kept from host eviction while
    ``host_ref_counter`` is above 0. ``id`` numbers nodes in creation order (process-wide, from
    ``TreeNode.counter`` as SGLang's); nodes compare (``<``) by last access time, as SGLang's.

    ``TreeNode()`` with no arguments is SGLang's empty node (no key, no value, no parent, time
    and id from the counter); the caches build theirs positionally.
    """

    _ids = itertools.count()

    __slots__ = (
        "children",
        "ckey",
        "creation_time",
        "digests",
        "hashes",
        "hit_count",
        "host_ref_counter",
        "host_value",
        "id",
        "key",
        "last_access_time",
        "lock_ref",
        "namespace",
        "parent",
        "priority",
        "value",
    )

    def __init__(
        self,
        key: Tokens | None = None,
        value: list[int] | None = None,
        parent: Any = None,
        namespace: Any = None,
        t: int | None = None,
        *,
        id: int | None = None,
        priority: int = 0,
    ):
        self.key = key
        self.value: list[int] | None = value
        self.parent = parent
        self.namespace = namespace
        self.ckey: object = None
        self.children: dict = {}
        self.lock_ref = 0
        self.hit_count = 0
        self.priority = priority
        self.digests: bytes | None = None
        self.hashes: list[int] | None = None
        self.host_value: list[int] | None = None
        self.host_ref_counter = 0
        number = next(TreeNode._ids)
        self.id = number if id is None else id
        self.last_access_time = self.creation_time = number if t is None else t

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time

    @property
    def evicted(self) -> bool:
        """True once the node holds no device KV (left the cache, or host-only)."""
        return self.value is None

    @property
    def backuped(self) -> bool:
        """Whether the node's KV has a copy in host memory."""
        return self.host_value is not None

    def protect_host(self) -> None:
        """Keep the host copy from host eviction until ``release_host``."""
        self.host_ref_counter += 1

    def release_host(self) -> None:
        """Undo one ``protect_host``; RuntimeError (SGLang's) if none is outstanding."""
        if self.host_ref_counter <= 0:
            raise RuntimeError(f"release_host on {self!r}, whose host copy is not protected")
        self.host_ref_counter -= 1

    @property
    def hash_value(self) -> list[str] | None:
        """The pages' chain digests as SGLang's ``hash_value``: one 64-digit hex string per
        page (None with events off)."""
        digests = self.digests
        if digests is None:
            return None
        return [digests[i : i + 32].hex() for i in range(0, len(digests), 32)]

    @hash_value.setter
    def hash_value(self, hashes: list[str] | None) -> None:
        if hashes is None:
            self.digests = None
            return
        try:
            digests = [bytes.fromhex(h) for h in hashes]
        except (TypeError, ValueError):
            digests = []
        if len(digests) != len(hashes) or any(len(d) != 32 for d in digests):
            raise ValueError(
                f"hash_value takes one SHA-256 digest per page as 64 hex digits, got {hashes!r}"
            )
        self.digests = b"".join(digests)

    def get_last_hash_value(self) -> str | None:
        """The last page's ``hash_value``, None when the node has no hashed page."""
        digests = self.digests
        return digests[-32:].hex() if digests else None

    def __repr__(self) -> str:
        if self.key is None:
            return f"{type(self).__name__}(key=None)"
        more = "..." if len(self.key) > 8 else ""
        return f"{type(self).__name__}(key={as_list(self.key[:8])}{more})"


@attrs.frozen
class MatchResult:
    """The longest cached prefix of a key: its KV slots and the tree node that ends it.

    ``swa_indices`` is set by the sliding-window cache only: one sliding-window slot per
    matched token, None where that token's sliding-window KV was evicted. ``host_hit_length``
    and ``last_host_node`` are set by the host-tier cache only: the matched tokens past
    ``device_indices`` whose KV is in host memory, and the node that ends them; for the other
    caches ``last_host_node`` is ``last_node``, as SGLang's. ``last_device_node`` (SGLang's name
    for ``last_node``) and ``best_match_node`` (``last_host_node``) read as SGLang's fields.
    """

    device_indices: list[int]
    last_node: TreeNode
    swa_indices: list[int | None] | None = None
    _host_node: TreeNode | None = attrs.field(default=None, alias="last_host_node")
    host_hit_length: int = 0

    @property
    def last_device_node(self) -> TreeNode:
        """The node that ends the device-resident match (``last_node``)."""
        return self.last_node

    @property
    def last_host_node(self) -> TreeNode:
        """The node that ends the match including host-only pages (``last_node`` without a
        host tier)."""
        node = self._host_node
        return self.last_node if node is None else node

    @property
    def best_match_node(self) -> TreeNode:
        """Where a load-back starts: ``last_host_node``, as SGLang's caches without component
        validators set it."""
        return self.last_host_node

    @property
    def prefix_len(self) -> int:
        """The number of matched tokens."""
        return len(self.device_indices)


def match_len(node_key: Tokens, key: Tokens, pos: int, page_size: int) -> int:
    """How many leading tokens of ``node_key`` equal ``key[pos:]``, in whole pages (both of
    one kind: lists, or packed arrays)."""
    n = min(len(node_key), len(key) - pos)
    if node_key[:n] == key[pos : pos + n]:
        return n - n % page_size
    # Bisect for the first difference with slice comparisons (C loops), not token by token.
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if node_key[lo:mid] == key[pos + lo : pos + mid]:
            lo = mid
        else:
            hi = mid
    return lo - lo % page_size
