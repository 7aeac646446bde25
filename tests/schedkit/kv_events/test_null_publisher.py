"""The ``null`` publisher: it counts what it is given, sends nothing, refuses after shutdown."""

from __future__ import annotations

from schedkit.kv_events import NullEventPublisher, create_publisher
from tests.schedkit.kv_events.helpers import batch


def test_null_publisher_counts_and_sends_nothing():
    pub = create_publisher({"publisher": "null"})
    assert isinstance(pub, NullEventPublisher)
    assert pub.publish(batch(0)) and pub.published == 1
    assert pub.flush() and pub.queue_depth == 0
    pub.shutdown()
    pub.shutdown()
    assert pub.publish(batch(1)) is False and pub.dropped == 1
