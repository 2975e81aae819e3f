"""The aligned reads of a file-tier block cover every tensor's bytes, at the slot offsets the copies use."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from omni_console.offload.file_spans import Extent, chunks, plan_runs
from omni_console.offload.tiers import PAGE

extents = st.lists(st.builds(Extent, st.integers(0, 2), st.integers(0, 1 << 22), st.integers(1, 1 << 20)),
                   min_size=1, max_size=12)


@given(extents, st.sampled_from([PAGE, 4 * PAGE, 64 * PAGE]))
def test_runs_bring_every_byte_to_its_slot_offset(es: list[Extent], chunk: int):
    runs, where, used = plan_runs(es)
    reads = [c for r in runs for c in chunks(r, chunk)]
    assert all(r.start % PAGE == 0 and r.length % PAGE == 0 and r.slot_offset % PAGE == 0 for r in reads)
    assert sum(r.length for r in runs) == used
    # what each slot byte holds: (file, file offset); every extent's bytes must be there, needed by a read
    slot: dict[int, tuple[int, int]] = {}
    for r in reads:
        assert 0 < r.needed <= r.length
        for k in range(0, r.needed, 997):
            slot[r.slot_offset + k] = (r.file, r.start + k)
        slot[r.slot_offset + r.needed - 1] = (r.file, r.start + r.needed - 1)
    for e, at in zip(es, where, strict=True):
        for k in (0, e.nbytes - 1):
            assert slot.get(at + k, (e.file, e.offset + k)) == (e.file, e.offset + k)
        assert any(r.slot_offset <= at and at + e.nbytes <= r.slot_offset + r.needed for r in runs)
