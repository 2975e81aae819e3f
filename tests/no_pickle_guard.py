"""A fixture that makes every unpickling entry point raise: a test under it fails on any pickle parse."""

from __future__ import annotations

import pickle

import pytest
import torch


class Unpickled(AssertionError):
    """Raised by every patched unpickling entry point."""


def _forbidden(name: str):
    def refuse(*args, **kwargs):
        raise Unpickled(f"{name} called")
    return refuse


class _ForbiddenUnpickler:
    def __init__(self, *args, **kwargs):
        raise Unpickled("pickle.Unpickler constructed")


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "load", _forbidden("torch.load"))
    monkeypatch.setattr(torch.serialization, "load", _forbidden("torch.serialization.load"))
    monkeypatch.setattr(pickle, "load", _forbidden("pickle.load"))
    monkeypatch.setattr(pickle, "loads", _forbidden("pickle.loads"))
    monkeypatch.setattr(pickle, "Unpickler", _ForbiddenUnpickler)
