"""Parallel reads straight into place: exact bytes, conversions, progress, and failures that stop the load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from omni_console.offload import deferred_weights
from omni_console.offload.deferred_weights import DeferredWeights, Source


def _file(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def test_fill_reads_each_range_in_chunks_into_its_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deferred_weights, "CHUNK_BYTES", 64)  # many chunks per tensor, many threads
    values = [torch.randn(37, 5), torch.randn(300)]
    blob = b"pad!" + b"".join(v.numpy().tobytes() for v in values)
    weights = DeferredWeights(threads=4)
    weights.own_fd(fd := _file(tmp_path, blob))
    targets, offset = [], 4
    for v in values:
        t = torch.empty(v.shape)
        weights.add(t, Source(fd, offset, v.numel() * 4, torch.float32, tuple(v.shape)))
        targets.append(t)
        offset += v.numel() * 4
    seen: list[int] = []
    dests = [torch.empty(v.numel() * 4, dtype=torch.uint8) for v in values]
    assert weights.fill(list(zip(targets, dests, strict=True)), seen.append) == offset - 4
    assert sum(seen) == offset - 4 and len(seen) > 2
    for v, d in zip(values, dests, strict=True):
        assert torch.equal(d.view(torch.float32).view(v.shape), v)
    assert weights.pending == 0 and not weights.knows(targets[0])
    weights.close()


def test_materialize_converts_a_stored_dtype_into_the_tensors_own(tmp_path: Path) -> None:
    stored = torch.randn(8, 3).to(torch.bfloat16)
    weights = DeferredWeights(threads=2)
    weights.own_fd(fd := _file(tmp_path, stored.view(torch.uint8).numpy().tobytes()))
    target = torch.nn.Parameter(torch.empty(8, 3, dtype=torch.float32), requires_grad=False)
    weights.add(target, Source(fd, 0, stored.numel() * 2, torch.bfloat16, (8, 3)))
    weights.materialize([target, target])
    assert torch.equal(target, stored.float())
    weights.close()


def test_a_source_that_does_not_fit_its_tensor_is_refused(tmp_path: Path) -> None:
    weights = DeferredWeights()
    with pytest.raises(ValueError, match="does not fit"):
        weights.add(torch.empty(4), Source(0, 0, 12, torch.float32, (3,)))


def test_a_file_shorter_than_promised_fails_the_fill(tmp_path: Path) -> None:
    weights = DeferredWeights(threads=2)
    weights.own_fd(fd := _file(tmp_path, b"\0" * 10))
    target = torch.empty(4)
    weights.add(target, Source(fd, 0, 16, torch.float32, (4,)))
    with pytest.raises(OSError, match="6 bytes early"):
        weights.materialize([target])


def test_an_exception_from_progress_stops_the_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deferred_weights, "CHUNK_BYTES", 16)
    weights = DeferredWeights(threads=1)
    weights.own_fd(fd := _file(tmp_path, b"\1" * 4096))
    target = torch.empty(1024)
    weights.add(target, Source(fd, 0, 4096, torch.float32, (1024,)))
    calls: list[int] = []

    def cancel(nbytes: int) -> None:
        calls.append(nbytes)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        weights.materialize([target], cancel)
    assert len(calls) == 1  # one thread: the first chunk's report stopped the other 255


def test_a_failure_in_one_submission_skips_the_reads_queued_after_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    monkeypatch.setattr(deferred_weights, "CHUNK_BYTES", 16)
    weights = DeferredWeights(threads=1)
    weights.own_fd(fd := _file(tmp_path, b"\1" * 4096))
    short, later = torch.empty(4), torch.empty(512)
    weights.add(short, Source(fd, 4090, 16, torch.float32, (4,)))  # the file ends 10 bytes early
    weights.add(later, Source(fd, 0, 2048, torch.float32, (512,)))
    landed: list[int] = []
    stop = threading.Event()
    with weights.reader_pool() as pool:
        first = weights.submit([(short, torch.empty(16, dtype=torch.uint8))], pool, stop, landed.append)
        second = weights.submit([(later, torch.empty(2048, dtype=torch.uint8))], pool, stop, landed.append)
        with pytest.raises(OSError, match="early"):
            first.wait()
        with pytest.raises(deferred_weights.ReadsStopped):
            second.wait()  # skipped, not read
    assert stop.is_set() and landed == []
    assert weights.knows(short) and weights.knows(later)  # neither counts as filled


def test_siblings_read_on_the_shared_pool_which_its_maker_joins(tmp_path: Path) -> None:
    import threading

    data = torch.arange(64, dtype=torch.float32)
    weights = DeferredWeights(threads=2, share_readers=True)
    sibling = weights.sibling()
    sibling.own_fd(fd := _file(tmp_path, data.numpy().tobytes()))
    target = torch.empty(64)
    sibling.add(target, Source(fd, 0, 256, torch.float32, (64,)))
    before = threading.active_count()
    sibling.materialize([target])
    assert torch.equal(target, data)
    sibling.close()  # a sibling leaves the shared readers running
    with weights.reader_pool() as pool:
        assert pool.submit(lambda: 7).result() == 7
    weights.close()  # the maker joins them
    assert threading.active_count() <= before
    assert not any(t.name.startswith("weights-read") for t in threading.enumerate())
