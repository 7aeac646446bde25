"""EdgeBacklog: messages read and not parsed, taken one per connection in turns."""

from __future__ import annotations

import pytest

from schedkit.components.io.edge_backlog import EdgeBacklog, message_bytes
from schedkit.components.io.zmtp import ZmtpMessage


def message(data: bytes) -> ZmtpMessage:
    return ZmtpMessage(first=data, last=data, parts=1, oversize=0)


def test_connections_take_turns_and_each_keeps_its_order():
    backlog = EdgeBacklog()
    flood, small = object(), object()
    for i in range(3):
        backlog.add(flood, message(b"f%d" % i))
    backlog.add(small, message(b"s0"))
    assert small in backlog and bool(backlog) and backlog.bytes == 8
    taken = []
    while backlog:
        conn, taken_message = backlog.take()
        taken.append((conn is small, taken_message.last))
    assert taken == [(False, b"f0"), (True, b"s0"), (False, b"f1"), (False, b"f2")]


def test_bytes_follow_what_is_held_and_a_closed_connection_is_dropped():
    backlog = EdgeBacklog()
    a, b = object(), object()
    backlog.add(a, message(b"x" * 100))
    backlog.add(a, ZmtpMessage(first=b"", last=b"y" * 10, parts=2, oversize=0))
    backlog.add(b, message(b"z" * 7))
    assert backlog.bytes == 117
    backlog.drop(a)
    assert a not in backlog and backlog.bytes == 7
    assert backlog.take()[1].last == b"z" * 7
    assert not backlog and backlog.bytes == 0
    with pytest.raises(IndexError):
        backlog.take()
    assert message_bytes(ZmtpMessage(first=b"ab", last=b"cde", parts=3, oversize=0)) == 5
