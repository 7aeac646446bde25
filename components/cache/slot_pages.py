"""The allocator's whole-page slot lists, built and recognised natively when the C extension
was built.

A page's slots are one tuple of the allocator's page table (``table[p]`` holds slots
``p * page_size`` to ``p * page_size + page_size - 1``). ``slots_of(table, pages)`` joins the
pages' tuples into one list. ``whole_pages(indices, table, page_size)`` says whether a list of
slots is whole pages listed slot by slot (in any page order): their pages in order if it is,
False if it is not, and None (native version only) if an item that decides it is not a plain
int, which ``whole_pages_py`` then decides. Given ``ids`` (``ids[p] == p``, the allocator's
page numbers), the native version hands out page ``p`` as ``ids[p]`` rather than a new int
object; the Python version gives equal ints. ``NATIVE`` says whether the C extension
``schedkit.components.cache._slot_pages`` (built by ``pip install`` from ``_slot_pages.c``
when a C compiler is present) is in use; the ``_py`` functions are the pure-Python versions it
falls back to, with the same results.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from itertools import repeat
from operator import floordiv, iadd

__all__ = ["NATIVE", "slots_of", "slots_of_py", "whole_pages", "whole_pages_py"]

Table = list[tuple[int, ...]]


def slots_of_py(table: Table, pages: list[int]) -> list[int]:
    """The slots of ``pages`` in order, as one list (each page's tuple appended in C)."""
    return reduce(iadd, map(table.__getitem__, pages), [])


def whole_pages_py(
    indices: list[int], table: Table, page_size: int, ids: list[int] | None = None
) -> list[int] | bool:
    """The pages of ``indices`` in order if it lists whole pages slot by slot, else False."""
    if not indices or len(indices) % page_size:
        return False
    pages = list(map(floordiv, indices[::page_size], repeat(page_size)))
    if min(pages) < 0:
        return False
    try:
        whole = slots_of_py(table, pages)
    except IndexError:  # a slot beyond the pool
        return False
    return pages if indices == whole else False


slots_of: Callable[[Table, list[int]], list[int]]
whole_pages: Callable[..., list[int] | bool | None]
try:
    from schedkit.components.cache._slot_pages import slots_of, whole_pages
except ImportError:  # not built (no C compiler at install): the same results, slower
    NATIVE = False
    slots_of, whole_pages = slots_of_py, whole_pages_py
else:
    NATIVE = True
