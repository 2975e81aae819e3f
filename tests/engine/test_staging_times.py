"""Each staging event carries its copy's own time, not the time a batch of them was published at."""

from __future__ import annotations

from omni_console.offload.copy_ledger import CopyLedger
from omni_console.offload.events import EventBus, StagingEvent
from omni_console.offload.transfer_timing import Measured, TransferClock


def test_copies_resolved_together_are_published_with_each_copys_time():
    """On CUDA the copies of a step are resolved together (query/drain); each event keeps its copy's time."""
    bus = EventBus()
    sub = bus.subscribe()
    ledger = CopyLedger(cuda=True, bus=bus)  # the streamer's accounting and publishing of resolved copies
    ledger.absorb([Measured("copy", "transformer.0", 10, 0.01, False, 100.0),
                  Measured("copy", "transformer.1", 10, 0.01, False, 100.5)])
    assert [e.t for e in sub.drain() if isinstance(e, StagingEvent)] == [100.0, 100.5]


def test_a_cpu_measurement_is_stamped_when_its_copy_ends():
    clock = TransferClock(cuda=False)
    first = clock.start()
    clock.finish(first, "copy", "a", 1)
    second = clock.start()
    clock.finish(second, "copy", "b", 1)
    a, b = clock.poll()
    assert a.t < b.t
