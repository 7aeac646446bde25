"""Builds the optional native page-hash chain; everything else is declared in pyproject.toml.

The extension needs only a C compiler. Where it cannot be built, installation goes on and
``schedkit.kv_events.page_chain`` uses its pure-Python version (same values, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "schedkit.kv_events._page_chain",
            sources=["schedkit/kv_events/_page_chain.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
