"""The event stream: typed and timestamped, fan-out to every subscriber, bounded, never blocking
the publisher, and honest about what a slow subscriber lost."""

from __future__ import annotations

import threading
import time

from omni_console.engine.events import StepTiming
from omni_console.offload.events import EventBus, LogEvent, StagingEvent


def test_every_subscriber_gets_every_event_in_order_with_timestamps():
    bus = EventBus()
    a, b = bus.subscribe(), bus.subscribe()
    before = time.monotonic()
    for i in range(5):
        bus.publish(StepTiming(request_id=1, step=i + 1, total_steps=5, wall_s=0.1, stall_s=0.0))
    for sub in (a, b):
        events = sub.drain()
        assert [e.step for e in events] == [1, 2, 3, 4, 5]
        assert all(before <= e.t <= time.monotonic() for e in events)
        assert sub.dropped == 0 and len(sub) == 0
    assert bus.published == 5


def test_a_full_subscriber_drops_its_oldest_events_and_counts_them():
    bus = EventBus()
    slow, fast = bus.subscribe(maxlen=3), bus.subscribe()
    for i in range(10):
        bus.publish(LogEvent(level="info", message=str(i)))
    assert [e.message for e in slow.drain()] == ["7", "8", "9"]
    assert slow.dropped == 7
    assert len(fast.drain()) == 10 and fast.dropped == 0  # one slow consumer costs the others nothing


def test_drain_takes_at_most_the_asked_number():
    bus = EventBus()
    sub = bus.subscribe()
    for i in range(4):
        bus.publish(LogEvent(level="info", message=str(i)))
    assert [e.message for e in sub.drain(3)] == ["0", "1", "2"]
    assert [e.message for e in sub.drain()] == ["3"]


def test_publishing_never_waits_for_a_consumer_and_loses_nothing_when_it_keeps_up():
    bus = EventBus()
    sub = bus.subscribe(maxlen=1_000_000)
    received: list[int] = []
    done = threading.Event()

    def consume() -> None:
        while not done.is_set() or len(sub):
            received.extend(e.nbytes for e in sub.drain(1000))

    consumer = threading.Thread(target=consume)
    consumer.start()
    for i in range(20_000):
        bus.publish(StagingEvent(target="b", direction="h2d", nbytes=i, seconds=1e-3))
    done.set()
    consumer.join(10)
    assert received == list(range(20_000)) and sub.dropped == 0


def test_closed_subscription_receives_nothing_more():
    bus = EventBus()
    sub = bus.subscribe()
    sub.close()
    bus.publish(LogEvent(level="info", message="x"))
    assert sub.drain() == []


def test_staging_event_bandwidth():
    assert StagingEvent(target="b", direction="h2d", nbytes=2_000_000_000, seconds=0.5).gbps == 4.0
    assert StagingEvent(target="b", direction="d2h", nbytes=0, seconds=0.0).gbps == 0.0
