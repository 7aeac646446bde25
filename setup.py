"""Builds the optional native extensions; everything else is declared in pyproject.toml.

The native page-hash chain, packed token ids' msgpack encoding and the KV allocator's native
slot lists need only a C compiler. Where they cannot be built, installation goes on and
``schedkit.kv_events.page_chain``, ``schedkit.kv_events.packed_ids`` and
``schedkit.components.cache.slot_pages`` use their pure-Python versions (same results, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "schedkit.kv_events._page_chain",
            sources=["schedkit/kv_events/_page_chain.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "schedkit.kv_events._packed_ids",
            sources=["schedkit/kv_events/_packed_ids.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "schedkit.components.cache._slot_pages",
            sources=["components/cache/_slot_pages.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
