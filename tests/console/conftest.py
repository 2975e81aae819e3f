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
