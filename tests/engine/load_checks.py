"""Shared by the load-path test files: two modules hold the same weights, buffers and config; a model
directory with one weights file cut short."""

from __future__ import annotations

from pathlib import Path

import torch


def assert_same_module(direct: torch.nn.Module, plain: torch.nn.Module) -> None:
    ours, theirs = dict(direct.named_parameters()), dict(plain.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype, name
        assert torch.equal(ours[name], t), name
        assert ours[name].requires_grad == t.requires_grad, name  # as from_pretrained leaves it
    buffers, their_buffers = dict(direct.named_buffers()), dict(plain.named_buffers())
    assert buffers.keys() == their_buffers.keys()
    for name, t in their_buffers.items():  # non-persistent ones (rotary tables) are computed, not read
        assert buffers[name].dtype == t.dtype and torch.equal(buffers[name], t), name
    config = getattr(plain.config, "to_dict", lambda: dict(plain.config))()  # transformers or diffusers
    assert getattr(direct.config, "to_dict", lambda: dict(direct.config))() == config
    assert not direct.training


def cut_short(root: Path, folder: str) -> Path:
    """Cut the last 4 KiB off the largest safetensors file in `root/folder` (after discovery, which
    reads only headers, so the load is what meets it); returns that file."""
    file = max((root / folder).glob("*.safetensors"), key=lambda p: p.stat().st_size)
    with open(file, "r+b") as handle:
        handle.truncate(file.stat().st_size - 4096)
    return file
