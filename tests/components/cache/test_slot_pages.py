"""The allocator's native slot lists against the pure-Python ones, on random inputs."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedkit.components.cache import slot_pages
from schedkit.components.cache.allocator import TokenToKVPoolAllocator

try:
    from schedkit.components.cache import _slot_pages as native
except ImportError:  # pragma: no cover - checked by test_the_extension_is_built_with_a_compiler
    native = None

needs_native = pytest.mark.skipif(native is None, reason="the C extension is not built")

PAGE_SIZE = 4
TABLE = TokenToKVPoolAllocator(size=32 * PAGE_SIZE, page_size=PAGE_SIZE)._page_slots
IDS = list(range(32))


def slot_lists():
    """Whole pages in any order, then perhaps one slot changed (another int, an equal int
    object of its own, a float, a bool, a huge or negative int) or the list cut short."""
    pages = st.lists(st.integers(0, 31), min_size=1, max_size=6)
    change = st.one_of(
        st.none(),
        st.integers(-5, 40),
        st.sampled_from(["copy", 1.0, True, 2**70, -(2**70)]),
    )
    return st.tuples(pages, change, st.integers(0, 23), st.booleans())


def build(pages, change, at, cut):
    indices = slot_pages.slots_of_py(TABLE, pages)
    at %= len(indices)
    if change == "copy":
        indices[at] = int(str(indices[at]))  # the same value, another int object
    elif change is not None:
        indices[at] = change
    if cut:
        indices = indices[:-1]
    return indices


@needs_native
@settings(max_examples=120, deadline=None)
@given(slot_lists())
def test_native_whole_pages_answers_as_the_python_version(case):
    indices = build(*case)
    native_answer = native.whole_pages(indices, TABLE, PAGE_SIZE)
    if native_answer is None:  # left to the Python version: an item is not a plain int
        assert any(type(i) is not int for i in indices)
    else:
        assert native_answer == slot_pages.whole_pages_py(indices, TABLE, PAGE_SIZE)
    assert native.whole_pages(indices, TABLE, PAGE_SIZE, IDS) == native_answer  # with ids


@needs_native
def test_native_whole_pages_gives_the_page_id_objects():
    """Pages past the small-int cache come back as the given id objects, not new ints."""
    pool = TokenToKVPoolAllocator(size=400 * PAGE_SIZE, page_size=PAGE_SIZE)
    ids = list(range(400))
    pages = [300, 399, 257, 0]
    indices = slot_pages.slots_of_py(pool._page_slots, pages)
    got = native.whole_pages(indices, pool._page_slots, PAGE_SIZE, ids)
    assert got == pages and all(page is ids[page] for page in got)
    assert native.whole_pages(indices, pool._page_slots, PAGE_SIZE)[0] is not ids[300]
    short = ids[:350]  # an ids list too short for page 399: a new int for it
    got = native.whole_pages(indices, pool._page_slots, PAGE_SIZE, short)
    assert got == pages and got[0] is ids[300] and got[1] is not ids[399]


@needs_native
@given(st.lists(st.integers(0, 31), max_size=8))
def test_native_slots_of_joins_the_pages_as_the_python_version(pages):
    assert native.slots_of(TABLE, pages) == slot_pages.slots_of_py(TABLE, pages)


@needs_native
def test_native_slots_of_refuses_a_page_outside_the_table():
    with pytest.raises(IndexError):
        native.slots_of(TABLE, [32])


def test_the_extension_is_built_with_a_compiler():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the pure-Python slot lists are expected")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers: the pure-Python slot lists are expected")
    assert native is not None and slot_pages.NATIVE


def test_the_allocator_frees_the_same_pages_with_either_version(monkeypatch):
    """The allocator's free with the Python versions swapped in: the same pages come back in
    the same order, and the same slot lists are refused."""
    import schedkit.components.cache.allocator as allocator

    def run():
        pool = TokenToKVPoolAllocator(size=16 * PAGE_SIZE, page_size=PAGE_SIZE)
        first, second = pool.alloc(3 * PAGE_SIZE), pool.alloc(5 * PAGE_SIZE)
        pool.free(second[PAGE_SIZE:] + second[:PAGE_SIZE])
        with pytest.raises(ValueError, match="same slot more than once"):
            pool.free([*first[:-1], first[0]])
        pool.free(first)
        return pool.alloc(16 * PAGE_SIZE)

    expected = run()
    monkeypatch.setattr(allocator, "slots_of", slot_pages.slots_of_py)
    monkeypatch.setattr(allocator, "whole_pages", slot_pages.whole_pages_py)
    assert run() == expected
