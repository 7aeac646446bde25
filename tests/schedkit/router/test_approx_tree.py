"""The gateway's approximate tree, over page hashes: what ``tree.rs``'s own tests check."""

from __future__ import annotations

from schedkit.router.approx_tree import ApproxTree

PAGE = 4


def test_sizes_count_each_tenants_pages_once():
    tree = ApproxTree(PAGE)
    tree.insert([1, 2], 0)
    tree.insert([1, 3], 0)  # shares page 1
    tree.insert([9], 1)
    assert tree.sizes == {0: 3 * PAGE, 1: PAGE}
    assert len(tree) == 4


def test_match_names_a_holder_of_the_deepest_page():
    tree = ApproxTree(PAGE)
    tree.insert([1, 2, 3], 0)
    tree.insert([1, 2], 1)
    assert tree.match([1, 2, 3, 4], frozenset({0, 1})) == (3, 0)
    assert tree.match([1, 2, 7], frozenset({0, 1})) == (2, 0)  # the first still holding it
    assert tree.match([1, 2, 3], frozenset({1})) == (2, 1)  # only live tenants count
    assert tree.match([5], frozenset({0, 1})) == (0, -1)


def test_eviction_takes_least_recently_used_leaves_until_each_tenant_fits():
    tree = ApproxTree(PAGE)
    tree.insert([1, 2], 0)  # oldest leaf: 2
    tree.insert([1, 3], 0)
    tree.insert([4], 0)  # newest
    tree.insert([1, 2], 1)
    tree.evict(max_size=2 * PAGE)
    # Tenant 0 has 4 pages (1, 2, 3, 4) and leaves 2, 3, 4: the oldest leaves go, 2 then 3,
    # until it fits; page 1 (stamped 0, reached on the way) is a leaf now but 2 pages fit.
    assert tree.sizes[0] == 2 * PAGE
    assert tree.match([4], frozenset({0})) == (1, 0)
    assert tree.match([1, 3], frozenset({0})) == (1, 0)
    assert tree.match([1, 2], frozenset({1})) == (2, 1)  # tenant 1 fits: untouched
    tree.evict(max_size=0)
    assert tree.sizes == {0: 0, 1: 0}
    assert len(tree) == 0  # empty nodes leave


def test_remove_tenant_leaves_no_empty_nodes():
    tree = ApproxTree(PAGE)
    tree.insert([1, 2, 3], 0)
    tree.insert([1, 5], 1)
    tree.remove_tenant(0)
    assert 0 not in tree.sizes
    assert len(tree) == 2
    assert tree.match([1, 2, 3], frozenset({0, 1})) == (1, 1)
