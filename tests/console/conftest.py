"""Fixtures of the app pilot tests: a CPU engine on the demo model and the app around it."""

from __future__ import annotations

import pytest
from app_helpers import make_app

from omni_console.engine.engine import Engine


@pytest.fixture
def engine(demo_model_dir):
    engine = Engine(demo_model_dir, device="cpu")
    yield engine
    engine.close()


@pytest.fixture
def app(engine, tmp_path):
    app = make_app(engine, tmp_path)
    yield app
    app.shutdown()


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every Engine.load call (and refuses it): a pre-load check must leave this empty."""
    calls: list[str] = []

    def refuse(self, *args, **kwargs):
        calls.append(str(self.model.path))
        raise AssertionError("Engine.load was called for an input that should be refused before loading")

    monkeypatch.setattr(Engine, "load", refuse)
    return calls
