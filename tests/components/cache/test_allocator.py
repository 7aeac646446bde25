import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.core.component import component_name, is_component


def test_is_a_registered_component():
    assert is_component(TokenToKVPoolAllocator)
    assert component_name(TokenToKVPoolAllocator) == "token_to_kv_pool_allocator"
    with pytest.raises(TypeError):
        TokenToKVPoolAllocator(8)  # keyword-only


def test_alloc_hands_out_distinct_slots_until_empty():
    pool = TokenToKVPoolAllocator(size=8)
    first = pool.alloc(3)
    assert first == [0, 1, 2]
    second = pool.alloc(5)
    assert sorted(first + second) == list(range(8))
    assert pool.available_size() == 0
    assert pool.alloc(1) is None
    assert pool.alloc(0) == []


def test_alloc_returns_none_without_taking_anything_when_short():
    pool = TokenToKVPoolAllocator(size=4)
    assert pool.alloc(5) is None
    assert pool.available_size() == 4


def test_free_returns_slots_for_reuse():
    pool = TokenToKVPoolAllocator(size=4)
    slots = pool.alloc(4)
    pool.free(slots[1:3])
    assert pool.available_size() == 2
    assert sorted(pool.alloc(2)) == slots[1:3]
    pool.free([])
    assert pool.available_size() == 0


def test_double_free_is_rejected_and_changes_nothing():
    pool = TokenToKVPoolAllocator(size=4)
    slots = pool.alloc(2)
    pool.free(slots)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(slots[:1])
    assert pool.available_size() == 4
    assert len(set(pool.alloc(4))) == 4


def test_freeing_a_slot_never_handed_out_is_rejected():
    pool = TokenToKVPoolAllocator(size=4)
    held = pool.alloc(2)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([held[0], 3])
    # The valid part of the rejected call was not freed either.
    assert pool.available_size() == 2


@pytest.mark.parametrize("bad", [[-1], [4], [0, 9]])
def test_slots_outside_the_pool_are_rejected(bad):
    pool = TokenToKVPoolAllocator(size=4)
    pool.alloc(4)
    with pytest.raises(ValueError, match=r"outside the pool: valid slots are 0\.\.3"):
        pool.free(bad)
    assert pool.available_size() == 0


def test_the_same_slot_twice_in_one_call_is_rejected():
    pool = TokenToKVPoolAllocator(size=4)
    pool.alloc(2)
    with pytest.raises(ValueError, match="more than once"):
        pool.free([0, 0])
    assert pool.available_size() == 2


def test_paged_alloc_takes_whole_aligned_pages():
    pool = TokenToKVPoolAllocator(size=12, page_size=4)
    slots = pool.alloc(8)
    assert len(slots) == 8
    for start in range(0, 8, 4):
        page = slots[start : start + 4]
        assert page[0] % 4 == 0
        assert page == list(range(page[0], page[0] + 4))
    assert pool.available_size() == 4
    with pytest.raises(ValueError, match="multiple of page_size=4"):
        pool.alloc(3)


def test_paged_free_of_any_slot_frees_its_page_once():
    pool = TokenToKVPoolAllocator(size=8, page_size=4)
    slots = pool.alloc(8)
    pool.free(slots[:2])  # part of the first page frees the page
    assert pool.available_size() == 4
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(slots[2:3])
    pool.free(slots[4:])
    assert pool.available_size() == 8


def test_clear_frees_everything():
    pool = TokenToKVPoolAllocator(size=6, page_size=2)
    pool.alloc(6)
    pool.clear()
    assert pool.available_size() == 6
    assert sorted(pool.alloc(6)) == list(range(6))


@pytest.mark.parametrize(
    ("size", "page_size", "message"),
    [
        (5, 2, "multiple of page_size=2"),
        (-1, 1, "size must be an integer >= 0"),
        (4, 0, "page_size"),
        (10**20, 1, "size must be at most 67,108,864 slots, got 100,000,000,000,000,000,000"),
    ],
)
def test_bad_sizes_are_rejected(size, page_size, message):
    with pytest.raises(ValueError, match=message):
        TokenToKVPoolAllocator(size=size, page_size=page_size)


def test_large_pool_round_trip():
    pool = TokenToKVPoolAllocator(size=1 << 18, page_size=16)
    first = pool.alloc(1 << 17)
    second = pool.alloc(1 << 17)
    assert len(set(first) | set(second)) == 1 << 18
    pool.free(first)
    pool.free(second)
    assert pool.available_size() == 1 << 18


# Bulk paths: whole pages are recognised without a per-slot loop; everything else goes the
# general way. Either way the result and the errors are the same.


def test_paged_free_accepts_whole_pages_in_any_order_partial_pages_and_any_sequence():
    pool = TokenToKVPoolAllocator(size=32, page_size=4)
    slots = pool.alloc(32)
    pages = [slots[i : i + 4] for i in range(0, 32, 4)]
    pool.free(pages[5] + pages[2])  # whole pages, not in slot order
    assert pool.available_size() == 8
    pool.free(pages[0][1:3] + pages[1][3:])  # parts of pages
    assert pool.available_size() == 16
    pool.free(tuple(pages[3]))  # not a list
    pool.free(range(pages[4][0], pages[4][0] + 4))
    assert pool.available_size() == 24
    assert sorted(pool.alloc(24)) == sorted(s for i in (0, 1, 2, 3, 4, 5) for s in pages[i])


def test_paged_free_of_a_consecutive_run_frees_every_page_it_touches():
    pool = TokenToKVPoolAllocator(size=16, page_size=4)
    slots = pool.alloc(16)
    pool.free(slots[2:7])  # the end of page 0 and the start of page 1
    assert pool.available_size() == 8
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(slots[5:7])  # page 1 is free already
    assert pool.available_size() == 8
    pool.free(slots[8:])
    assert sorted(pool.alloc(16)) == slots


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda p: p[0] + p[0], "more than once"),  # a whole page twice
        (lambda p: p[0] + p[1][:2] + p[1][:2], "more than once"),
        (lambda p: p[0] + [32, 33, 34, 35], r"outside the pool: valid slots are 0\.\.31"),
        (lambda p: [-4, -3, -2, -1], "outside the pool"),
        (lambda p: p[0] + [40], "outside the pool"),
        (lambda p: p[0] + p[7], "not allocated"),  # page 7 was never handed out
    ],
)
def test_rejected_paged_frees_change_nothing(bad, message):
    pool = TokenToKVPoolAllocator(size=32, page_size=4)
    slots = pool.alloc(28)
    pages = [slots[i : i + 4] for i in range(0, 28, 4)] + [list(range(28, 32))]
    state = (list(pool._free_pages), set(pool._held_pages))
    with pytest.raises(ValueError, match=message):
        pool.free(bad(pages))
    assert (pool._free_pages, pool._held_pages) == state
    pool.free(slots)
    assert pool.available_size() == 32


@pytest.mark.parametrize("page_size", [1, 2, 4])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_alloc_and_free_agree_with_a_model_of_held_pages(page_size, data):
    size = 16 * page_size
    pool = TokenToKVPoolAllocator(size=size, page_size=page_size)
    held: set[int] = set()  # the model: pages handed out
    free_order = list(range(15, -1, -1))  # the model: free pages, the next taken from the end
    handed_out: list[list[int]] = []
    for _ in range(data.draw(st.integers(1, 25))):
        action = data.draw(st.sampled_from(["alloc", "free", "free whole"]))
        if action == "alloc":
            n = data.draw(st.integers(0, 6)) * page_size
            slots = pool.alloc(n)
            if n // page_size > 16 - len(held):
                assert slots is None
                continue
            got = {s // page_size for s in slots}
            assert len(slots) == n and len(got) == n // page_size and not got & held
            for i in range(0, n, page_size):  # whole aligned pages
                assert slots[i] % page_size == 0
                assert slots[i : i + page_size] == list(range(slots[i], slots[i] + page_size))
            taken = free_order[len(free_order) - n // page_size :]
            assert [s // page_size for s in slots[::page_size]] == taken[::-1]
            del free_order[len(free_order) - len(taken) :]
            held |= got
            handed_out.append(slots)
        else:
            if action == "free whole" and handed_out:  # what alloc handed out, pages reordered
                whole = handed_out.pop(data.draw(st.integers(0, len(handed_out) - 1)))
                runs = [whole[i : i + page_size] for i in range(0, len(whole), page_size)]
                slots = [s for run in data.draw(st.permutations(runs)) for s in run]
            else:
                slots = data.draw(st.lists(st.integers(-2, size + 2), max_size=8))
            pages = {s // page_size for s in slots}
            valid = (
                len(set(slots)) == len(slots)
                and all(0 <= s < size for s in slots)
                and pages <= held
            )
            if valid:
                pool.free(slots)
                held -= pages
                free_order += dict.fromkeys(s // page_size for s in slots)
            else:
                with pytest.raises(ValueError):
                    pool.free(slots)
        assert pool.available_size() == (16 - len(held)) * page_size
        assert pool._held_pages == held and pool._free_pages == free_order


def test_a_free_stopped_by_an_unhashable_slot_changes_nothing():
    pool = TokenToKVPoolAllocator(size=4)
    slots = pool.alloc(3)
    with pytest.raises(TypeError):
        pool.free([slots[0], slots[1], [slots[2]]])
    assert pool._held_pages == set(slots) and pool.available_size() == 1
    pool.free(slots)
    assert pool.available_size() == 4
