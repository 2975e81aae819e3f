"""A slowed-down engine for interrupt tests: each phase announces itself and takes a while.

`install(setattr_fn, on_phase)` patches discovery, each component load and each denoise step with a
pause, calling `on_phase("discovery" | "load" | "generate")` as each is reached, so a test can deliver
Ctrl+C inside a chosen phase. `stuck_load=True` makes a component load ignore cancellation for a
minute (for the second-Ctrl+C test). Used in-process (monkeypatch.setattr) and by `slow_cli.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import omni_console.engine.engine as engine_module
import omni_console.engine.loading.loader as loader_module
import omni_console.engine.running.runner as runner_module

DISCOVERY_S = 0.3
COMPONENT_S = 0.15
STEP_S = 0.2


def install(setattr_fn: Callable[[Any, str, Any], None], on_phase: Callable[[str], None],
            stuck_load: bool = False) -> None:
    real_discover = engine_module.discover_model
    real_load_component = loader_module.load_component
    real_step_end = runner_module.StepClock.on_step_end

    def discover(*args: Any, **kwargs: Any) -> Any:
        on_phase("discovery")
        time.sleep(DISCOVERY_S)
        return real_discover(*args, **kwargs)

    def load_component(*args: Any, **kwargs: Any) -> Any:
        on_phase("load")
        time.sleep(60 if stuck_load else COMPONENT_S)
        return real_load_component(*args, **kwargs)

    def on_step_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        on_phase("generate")
        time.sleep(STEP_S)
        return real_step_end(self, *args, **kwargs)

    setattr_fn(engine_module, "discover_model", discover)
    setattr_fn(loader_module, "load_component", load_component)
    setattr_fn(runner_module.StepClock, "on_step_end", on_step_end)
