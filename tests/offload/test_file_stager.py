"""A staged module read from its weight file at each load (offload/file_stager.py): exact bytes, converted as the load
converts them, in several chunks through the bounce ring, and nothing of it kept on the host between loads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from omni_console.offload.deferred_weights import DeferredWeights, Source
from omni_console.offload.file_stager import FileStager
from omni_console.offload.tier_files import FileChanged
from omni_console.offload.tiers import MIN_CHUNK


def _module_and_sources(tmp_path: Path, stored: torch.dtype) -> tuple[torch.nn.Module, DeferredWeights, dict]:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.LayerNorm(512))
    module.register_buffer("steps", torch.arange(7, dtype=torch.float32))  # built, not in the file
    tensors = {k: v.detach().to(stored).contiguous() for k, v in module.state_dict().items() if k != "steps"}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    with torch.no_grad():  # the module holds what a load in float32 makes of the stored bytes
        for k, v in module.state_dict().items():
            if k in tensors:
                v.copy_(tensors[k].to(v.dtype))
    expected = {k: v.detach().clone() for k, v in module.state_dict().items()}
    header = int.from_bytes(path.read_bytes()[:8], "little")
    import json

    meta = json.loads(path.read_bytes()[8 : 8 + header])
    weights = DeferredWeights(1)
    fd = os.open(path, os.O_RDONLY)
    weights.own_fd(fd)
    named = dict(module.state_dict(keep_vars=True))
    for k, entry in meta.items():
        if k == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        weights.add(named[k], Source(fd, 8 + header + begin, end - begin, stored, tuple(entry["shape"])))
    return module, weights, {"expected": expected, "path": path}


@pytest.mark.parametrize("tier", ["page_cache", "disk"])
@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_each_load_reads_the_exact_bytes_and_nothing_stays_on_the_host(tmp_path: Path, tier, stored):
    module, weights, info = _module_and_sources(tmp_path, stored)
    stager = FileStager("enc", module, "cpu", tier=tier, weights=weights, pin=False)
    weights.close()  # the stager keeps its own descriptors
    try:
        assert stager.pinned_bytes == 0 and not stager.host_storages()
        assert stager.held_host_bytes <= 64  # the 7-step buffer no file holds
        assert all(p.numel() == 0 for p in module.parameters())  # between loads: no bytes at all
        assert stager.file_bytes > 2 * MIN_CHUNK  # read in several chunks through the ring
        for _ in range(2):
            stager.load()
            got = module.state_dict()
            for k, v in info["expected"].items():
                assert torch.equal(got[k], v), k
            stager.offload()
        assert all(p.numel() == 0 for p in module.parameters())
    finally:
        stager.close()


def test_a_file_changed_after_the_stager_was_made_fails_its_load_and_leaves_it_unloaded(tmp_path: Path):
    module, weights, info = _module_and_sources(tmp_path, torch.float32)
    stager = FileStager("enc", module, "cpu", tier="page_cache", weights=weights, pin=False)
    weights.close()
    try:
        with info["path"].open("r+b") as handle:
            handle.truncate(info["path"].stat().st_size // 2)
        with pytest.raises(FileChanged):
            stager.load()
        assert not stager.loaded and all(p.numel() == 0 for p in module.parameters())
    finally:
        stager.close()
