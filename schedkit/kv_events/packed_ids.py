"""Token ids kept packed (``array('I')``, 4 bytes a token) in a ``BlockStored``, encoded as the
msgpack array of ints every engine puts on the wire.

A prefix cache that stores a packed prompt records its pages' ``token_ids`` packed, so that
no int object is made per token. ``enc_hook`` is the msgpack encoders' hook for them: it turns
one into ``msgspec.Raw`` holding exactly the bytes msgspec writes for the same ids as a list
(``msgpack_u32``, one native loop when the C extension ``schedkit.kv_events._packed_ids`` was
built by ``pip install``, else ``msgpack_u32_py`` through a list). ``NATIVE`` says which is in
use.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import msgspec

__all__ = ["NATIVE", "enc_hook", "msgpack_u32", "msgpack_u32_py"]

_encode = msgspec.msgpack.Encoder().encode


def msgpack_u32_py(ids: array) -> bytes:
    """The msgpack encoding of an ``array('I')`` as an array of ints (pure Python)."""
    if type(ids) is not array or ids.typecode != "I":
        raise TypeError("msgpack_u32 takes an array('I') of token ids")
    return _encode(ids.tolist())


msgpack_u32: Callable[[array], bytes]
try:
    from schedkit.kv_events._packed_ids import msgpack_u32
except ImportError:  # not built (no C compiler at install): the same bytes, slower
    NATIVE = False
    msgpack_u32 = msgpack_u32_py
else:
    NATIVE = True


def enc_hook(obj: object) -> msgspec.Raw:
    """msgspec's ``enc_hook``: packed token ids as their msgpack array; anything else is
    refused as msgspec refuses it (a TypeError naming the type)."""
    if type(obj) is array and obj.typecode == "I":
        return msgspec.Raw(msgpack_u32(obj))
    raise TypeError(f"Encoding objects of type {type(obj).__name__} is unsupported")
