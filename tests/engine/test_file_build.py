"""Issue 35 (flux16): a staged encoder the plan keeps in the page cache or on disk is never whole in host memory at
load. It is built with its weights left in their files (engine/loading/file_build.py), so the process's peak RSS
while it is built and bound to its files stays far under its size; built by its library it would not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from process_peak import reset_peak

from omni_console.engine.loading.file_sources import FileTierLoad
from omni_console.engine.loading.loader import load_component
from omni_console.engine.model_dir.discovery import discover_component
from omni_console.offload.proc_status import status_bytes

MB = 1_000_000


def _write_encoder(root: Path) -> Path:
    """A ~200 MB float32 T5 encoder (random weights), saved as transformers saves it."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=10, num_heads=8,
                      is_encoder_decoder=False, use_cache=False, feed_forward_proj="gated-gelu")
    torch.manual_seed(0)
    T5EncoderModel(config).eval().save_pretrained(root / "text_encoder", safe_serialization=True)
    return root


@pytest.fixture(scope="module")
def big_encoder(tmp_path_factory: pytest.TempPathFactory):
    root = _write_encoder(tmp_path_factory.mktemp("file_build"))
    return discover_component(root, "text_encoder", "transformers", "T5EncoderModel")


def _status(key: str) -> int:
    figure = status_bytes(key)
    assert figure is not None, key
    return figure


def _peak_growth(build) -> tuple[int, object]:
    """How far the peak RSS rose above the RSS before `build()` ran, and what it returned."""
    if not reset_peak():
        pytest.skip("this kernel does not let a process reset its peak RSS")
    before = _status("VmRSS")
    out = build()
    return _status("VmHWM") - before, out


@pytest.mark.parametrize("tier", ["page_cache", "disk"])
def test_a_file_tier_encoder_is_never_whole_in_host_memory_at_load(big_encoder, tier):
    assert big_encoder.nbytes > 190 * MB
    load = FileTierLoad({"text_encoder": tier}, keep_phase=False)
    try:
        def build():
            module = load.build(big_encoder)
            load.after_build(big_encoder, module)
            return module

        grew, module = _peak_growth(build)
        assert not load.read_whole
        found = load.found["text_encoder"]
        # every weight has its file range as its source (nothing is a host copy but what no file holds)
        assert found.matched_bytes == big_encoder.nbytes and found.unmatched == 0
        assert grew < 40 * MB, f"peak RSS rose {grew / MB:.0f} MB building a {big_encoder.nbytes / MB:.0f} MB encoder"
        assert isinstance(module, torch.nn.Module)
    finally:
        load.close()


def test_built_by_its_library_the_same_encoder_is_whole_in_host_memory(big_encoder):
    """The bound above can fail: built by `from_pretrained`, then matched to its files (the load before this one),
    the encoder is whole in host memory once."""
    load = FileTierLoad({"text_encoder": "page_cache"}, keep_phase=False)
    try:
        grew, _ = _peak_growth(lambda: load.after_build(big_encoder, load_component(big_encoder)))
        assert grew > 0.9 * big_encoder.nbytes
    finally:
        load.close()


def test_built_over_its_files_the_encoder_computes_what_its_library_builds(big_encoder):
    load = FileTierLoad({"text_encoder": "page_cache"}, keep_phase=False)
    try:
        module = load.build(big_encoder)
        reference = load_component(big_encoder)
        tokens = torch.tensor([[5, 17, 300, 1]])
        with torch.no_grad():
            expected = reference(tokens).last_hidden_state
            got = module(tokens).last_hidden_state  # still over the mapping: the files' bytes themselves
        assert torch.equal(got, expected)
        assert os.fstat(load._built["text_encoder"].weights.fds[0]).st_size > 0
    finally:
        load.close()
