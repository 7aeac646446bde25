"""Random operation sequences on both radix caches, checked against a replay of their events.

After every step a minimal event consumer must hold exactly the pages the cache holds, KV slots
must be conserved, and sizes and lock counts must agree with a walk of the tree.
"""

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from schedkit.components.cache.allocator import OutOfKVSlotsError
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.cache.radix_tree import EVICTION_POLICIES, RadixKey
from schedkit.components.cache.swa_radix_cache import SWARadixCache
from schedkit.kv_events.hashing import published_page_hashes
from schedkit.kv_events.structs import AllBlocksCleared, BlockRemoved, BlockStored

TOKENS = st.lists(st.integers(0, 2), max_size=10)
NAMESPACES = st.sampled_from([(None, None), (None, "tenant"), ("lora-a", None), ("lora-a", "t")])
SETTINGS = settings(max_examples=60, stateful_step_count=30, deadline=None)


class EventReplay:
    """A consumer's view of one cache: the set of block hashes it has been told are held."""

    def __init__(self, cache_salt=None):
        self.held = set()
        self.cache_salt = cache_salt

    def apply(self, events):
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self.held.clear()
            elif isinstance(event, BlockStored):
                assert len(event.token_ids) == event.block_size * len(event.block_hashes)
                assert event.medium == "GPU" and event.lora_id is None
                assert event.cache_salt == self.cache_salt and event.lora_name is None
                parent = event.parent_block_hash
                for block_hash in event.block_hashes:
                    assert parent is None or parent in self.held, "child announced before parent"
                    assert block_hash not in self.held, "page stored twice"
                    self.held.add(block_hash)
                    parent = block_hash
            else:
                assert isinstance(event, BlockRemoved)
                for block_hash in event.block_hashes:
                    assert block_hash in self.held, "removed a page never stored or removed"
                    self.held.remove(block_hash)


def walk(cache):
    """Every node of the tree with the tokens on the path before it."""
    stack = [(child, []) for child in cache.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        yield node, prefix
        path = prefix + node.key
        stack.extend((child, path) for child in node.children.values())


def path_tokens(cache, node):
    tokens = []
    while node is not cache.root:
        tokens = node.key + tokens
        node = node.parent
    return tokens


class CacheMachine(RuleBasedStateMachine):
    """Rules and invariants common to both caches."""

    def setup(self, cache, namespace):
        self.cache = cache
        self.page_size = cache.page_size
        self.namespace = namespace  # (extra_key, cache_salt) of every key in this run
        self.replay = EventReplay(namespace[1])
        self.locks = []

    def key(self, tokens):
        return RadixKey(tokens, *self.namespace)

    def reference(self):
        """Page-aligned cached prefix (tuple) -> (full slots, sliding-window slots or None)."""
        table = {(): ([], [])}
        for node, prefix in walk(self.cache):
            slots, swa = table[tuple(prefix)]
            node_swa = getattr(node, "swa_value", node.value)
            for end in range(self.page_size, len(node.key) + 1, self.page_size):
                live = node_swa[:end] if node_swa is not None else [None] * end
                table[tuple(prefix + node.key[:end])] = (slots + node.value[:end], swa + live)
        return table

    def cached_prefix_len(self, tokens):
        table = self.reference()
        k = 0
        while k + self.page_size <= len(tokens) and tuple(tokens[: k + self.page_size]) in table:
            k += self.page_size
        return k

    def take_slots(self, pool, n):
        """``n`` fresh slots (whole pages, so possibly some spare at the end), or None."""
        pages = -(-n // self.page_size)
        slots = pool.alloc(pages * self.page_size)
        return None if slots is None else slots[:n]

    @rule(tokens=TOKENS)
    def insert_and_let_the_cache_allocate(self, tokens):
        expected = self.cached_prefix_len(tokens)
        need = len(tokens) - len(tokens) % self.page_size - expected
        room = min(pool.available_size() for pool in self.pools())
        try:
            cached = self.cache.insert(self.key(tokens))
        except OutOfKVSlotsError:
            assert room < need  # it only fails after trying to make room
        else:
            # Making room may evict part of the prefix itself, which is then stored anew.
            assert cached == expected if room >= need else cached <= expected
            assert self.cached_prefix_len(tokens) == len(tokens) - len(tokens) % self.page_size

    @rule(n=st.integers(1, 12))
    def reset_or_evict(self, n):
        if n == 12:
            self.cache.reset()
            self.locks.clear()
            assert self.cache.total_size() == 0
            assert all(pool.available_size() == pool.size for pool in self.pools())
        else:
            self.evict(n)

    @rule(data=st.data())
    def unlock(self, data):
        if self.locks:
            node, token = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
            self.unlock_node(node, token)

    @invariant()
    def replayed_events_match_the_tree(self):
        if not hasattr(self, "cache"):
            return
        self.replay.apply(self.cache.take_events())
        held = set()
        for node, prefix in walk(self.cache):
            assert node.key and len(node.key) % self.page_size == 0
            assert len(node.value) == len(node.key)
            for first, child in node.children.items():
                assert child.parent is node
                page = child.key[: self.page_size]
                page_key = page[0] if self.page_size == 1 else tuple(page)
                if node is self.cache.root and self.namespace != (None, None):
                    page_key = (self.namespace, page_key)
                assert first == page_key
            hashes = published_page_hashes(prefix + node.key, self.page_size, *self.namespace)
            held.update(hashes[len(prefix) // self.page_size :])
        assert self.replay.held == held

    def check_pool(self, pool, held):
        assert len(set(held)) == len(held), "a slot is held twice"
        assert pool.available_size() + len(held) == pool.size
        rest = pool.alloc(pool.available_size())
        assert set(rest).isdisjoint(held), "a held slot is on the free list"
        pool.free(rest)

    def expected_locks(self):
        full, swa = Counter(), Counter()
        for node, token in self.locks:
            in_window = True
            while node is not self.cache.root:
                full[node] += 1
                if in_window and hasattr(node, "swa_lock_ref"):
                    swa[node] += 1
                    in_window = token is None or node.swa_uuid != token
                node = node.parent
        return full, swa


class RadixCacheMachine(CacheMachine):
    @initialize(
        page_size=st.sampled_from([1, 2, 3]),
        pages=st.integers(4, 16),
        namespace=NAMESPACES,
        policy=st.sampled_from(sorted(EVICTION_POLICIES)),
    )
    def init(self, page_size, pages, namespace, policy):
        cache = RadixCache(
            page_size=page_size,
            capacity=pages * page_size,
            enable_kv_cache_events=True,
            eviction_policy=policy,
        )
        self.setup(cache, namespace)

    def pools(self):
        return [self.cache.allocator]

    def evict(self, n):
        before = self.cache.total_size()
        evicted = self.cache.evict(n)
        assert self.cache.total_size() == before - evicted
        if evicted < n:
            assert self.cache.evictable_size() == 0

    def unlock_node(self, node, token):
        self.cache.dec_lock_ref(node)

    @rule(tokens=TOKENS, reuse=st.booleans())
    def insert_a_finished_request(self, tokens, reuse):
        """Match, lock, compute the rest into fresh slots, insert, unlock: as a scheduler does."""
        cache = self.cache
        tokens = self.key(tokens)
        match = cache.match_prefix(tokens)
        cache.inc_lock_ref(match.last_node)
        start = match.prefix_len if reuse else 0
        fresh = self.take_slots(cache.allocator, len(tokens) - start)
        if fresh is None:
            cache.evict(len(tokens))
            fresh = self.take_slots(cache.allocator, len(tokens) - start)
        if fresh is not None:
            expected = self.cached_prefix_len(tokens)
            value = match.device_indices[:start] + fresh
            assert cache.insert(tokens, value, priority=len(tokens) % 3) == expected
        cache.dec_lock_ref(match.last_node)

    @rule(tokens=TOKENS)
    def match(self, tokens):
        table = self.reference()
        expected = self.cached_prefix_len(tokens)
        result = self.cache.match_prefix(self.key(tokens))
        assert result.prefix_len == expected
        assert result.device_indices == table[tuple(tokens[:expected])][0]
        assert path_tokens(self.cache, result.last_node) == tokens[:expected]

    @rule(tokens=TOKENS)
    def lock(self, tokens):
        node = self.cache.match_prefix(self.key(tokens)).last_node
        if node is not self.cache.root:
            self.cache.inc_lock_ref(node)
            self.locks.append((node, None))

    @invariant()
    def slots_sizes_and_locks_agree(self):
        if not hasattr(self, "cache"):
            return
        nodes = [node for node, _ in walk(self.cache)]
        self.check_pool(self.cache.allocator, [s for n in nodes for s in n.value])
        assert self.cache.total_size() == sum(len(n.key) for n in nodes)
        assert self.cache.protected_size() == sum(len(n.key) for n in nodes if n.lock_ref)
        full, _ = self.expected_locks()
        assert {n: n.lock_ref for n in nodes if n.lock_ref} == dict(full)


class SWARadixCacheMachine(CacheMachine):
    @initialize(
        page_size=st.sampled_from([1, 2]),
        pages=st.integers(4, 32),
        swa_pages=st.integers(2, 32),
        window=st.integers(1, 5),
        namespace=NAMESPACES,
        policy=st.sampled_from(sorted(EVICTION_POLICIES)),
    )
    def init(self, page_size, pages, swa_pages, window, namespace, policy):
        self.window = window
        cache = SWARadixCache(
            page_size=page_size,
            sliding_window_size=window,
            capacity=pages * page_size,
            swa_capacity=swa_pages * page_size,
            enable_kv_cache_events=True,
            eviction_policy=policy,
        )
        self.setup(cache, namespace)

    def pools(self):
        return [self.cache.allocator, self.cache.swa_allocator]

    def evict(self, n, swa_n=0):
        cache = self.cache
        before = cache.total_size(), cache.swa_total_size()
        full, swa = cache.evict(n, swa_n)
        assert (cache.total_size(), cache.swa_total_size()) == (before[0] - full, before[1] - swa)
        if full < n:
            assert cache.full_evictable_size() == 0
        if swa < swa_n:
            assert cache.swa_evictable_size() == 0

    @rule(n=st.sampled_from([0, 0, 0, 1, 6]), swa_n=st.integers(1, 8))
    def evict_sliding_window(self, n, swa_n):
        self.evict(n, swa_n)

    def unlock_node(self, node, token):
        self.cache.dec_lock_ref(node, token)

    @rule(tokens=TOKENS, reuse=st.booleans(), dropped_pages=st.integers(0, 5))
    def insert_a_finished_request(self, tokens, reuse, dropped_pages):
        """As for the radix cache, but the request may have freed its first sliding-window pages."""
        cache = self.cache
        tokens = self.key(tokens)
        match = cache.match_prefix(tokens)
        token = cache.inc_lock_ref(match.last_node)
        start = match.prefix_len if reuse else 0
        size = len(tokens) - start
        fresh = self.take_slots(cache.allocator, size)
        fresh_swa = self.take_slots(cache.swa_allocator, size)
        if fresh is None or fresh_swa is None:
            for pool, slots in ((cache.allocator, fresh), (cache.swa_allocator, fresh_swa)):
                if slots:
                    pool.free(slots)
            cache.evict(len(tokens), len(tokens))
            # The lock keeps the prefix's full KV and its window; sliding-window slots before
            # the window may have gone, and the request must not hand them back.
            match = cache.match_prefix(tokens)
            fresh = self.take_slots(cache.allocator, size)
            fresh_swa = self.take_slots(cache.swa_allocator, size)
        if fresh is not None and fresh_swa is not None:
            value = match.device_indices[:start] + fresh
            swa = match.swa_indices[:start] + fresh_swa
            dropped = min(dropped_pages * self.page_size, len(swa))
            released = [s for s in swa[start:dropped] if s is not None]
            if released:
                cache.swa_allocator.free(released)
            swa[:dropped] = [None] * dropped
            expected = self.cached_prefix_len(tokens)
            assert cache.insert(tokens, value, swa, priority=len(tokens) % 3) == expected
        elif fresh or fresh_swa:
            (cache.allocator if fresh else cache.swa_allocator).free(fresh or fresh_swa)
        cache.dec_lock_ref(match.last_node, token)

    @rule(tokens=TOKENS)
    def insert_full_kv_only(self, tokens):
        """As the scheduler does: the request hands over full KV; the cache adds window slots."""
        cache = self.cache
        tokens = self.key(tokens)
        match = cache.match_prefix(tokens)
        token = cache.inc_lock_ref(match.last_node)
        fresh = self.take_slots(cache.allocator, len(tokens) - match.prefix_len)
        if fresh is not None:
            expected = self.cached_prefix_len(tokens)
            assert cache.insert(tokens, match.device_indices + fresh) == expected
        cache.dec_lock_ref(match.last_node, token)

    @rule(tokens=TOKENS)
    def match(self, tokens):
        table = self.reference()
        walkable = self.cached_prefix_len(tokens)
        expected = 0
        for k in range(0, walkable + 1, self.page_size):
            swa = table[tuple(tokens[:k])][1]
            live_tail = next((i for i, s in enumerate(reversed(swa)) if s is None), len(swa))
            if None not in swa or live_tail >= self.window:
                expected = k
        result = self.cache.match_prefix(self.key(tokens))
        assert result.prefix_len == expected
        assert (result.device_indices, result.swa_indices) == table[tuple(tokens[:expected])]
        assert path_tokens(self.cache, result.last_node) == tokens[:expected]

    @rule(tokens=TOKENS)
    def lock(self, tokens):
        node = self.cache.match_prefix(self.key(tokens)).last_node
        if node is not self.cache.root:
            self.locks.append((node, self.cache.inc_lock_ref(node)))

    @invariant()
    def slots_sizes_and_locks_agree(self):
        if not hasattr(self, "cache"):
            return
        cache = self.cache
        nodes = [node for node, _ in walk(cache)]
        live = [n for n in nodes if n.swa_value is not None]
        self.check_pool(cache.allocator, [s for n in nodes for s in n.value])
        self.check_pool(cache.swa_allocator, [s for n in live for s in n.swa_value])
        assert cache.total_size() == sum(len(n.key) for n in nodes)
        assert cache.swa_total_size() == sum(len(n.key) for n in live)
        assert cache.full_protected_size() == sum(len(n.key) for n in nodes if n.lock_ref)
        assert cache.swa_protected_size() == sum(len(n.key) for n in live if n.swa_lock_ref)
        assert all(n.swa_value is not None for n in nodes if not n.children), "tombstone leaf"
        assert all(n.lock_ref for n in nodes if n.swa_lock_ref)
        full, swa = self.expected_locks()
        assert {n: n.lock_ref for n in nodes if n.lock_ref} == dict(full)
        assert {n: n.swa_lock_ref for n in nodes if n.swa_lock_ref} == dict(swa)


TestRadixCacheEvents = RadixCacheMachine.TestCase
TestRadixCacheEvents.settings = SETTINGS
TestSWARadixCacheEvents = SWARadixCacheMachine.TestCase
TestSWARadixCacheEvents.settings = SETTINGS
