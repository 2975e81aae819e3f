"""The engine's front door: every name `engine.api` exports resolves (and is the one its type-checking
imports name), importing it and planning through it load no torch, and both engines are `EngineHandle`s."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from omni_console.engine import api
from omni_console.engine.api import EngineHandle, RankLayout, open_engine
from omni_console.engine.engine import Engine
from omni_console.engine.ranks.group_engine import GroupEngine


def _typed_and_exported(path: Path, exports: dict[str, tuple[str, ...]]) -> tuple[set, set]:
    tree = ast.parse(path.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    typed = {(f"{'.' * i.level}{i.module}", a.name) for i in block.body if isinstance(i, ast.ImportFrom)
             for a in i.names}
    return typed, {(module, name) for module, names in exports.items() for name in names}


def test_every_exported_name_resolves_and_the_type_checking_imports_name_the_same() -> None:
    typed, exported = _typed_and_exported(Path(api.__file__), api._EXPORTS)
    assert typed == exported | {(".front", name) for name in api.NAMESPACES}
    for name in api.__all__:
        assert getattr(api, name) is not None, name


@pytest.mark.parametrize("name", ["checks", "models", "planner", "probes", "service", "writes"])
def test_every_namespace_name_resolves_and_its_type_checking_imports_name_the_same(name: str) -> None:
    namespace = getattr(api, name)
    assert name in api.NAMESPACES and namespace.__name__ == f"omni_console.engine.front.{name}"
    typed, exported = _typed_and_exported(Path(namespace.__file__), namespace.EXPORTS)
    assert typed == exported
    for each in namespace.__all__:
        assert getattr(namespace, each) is not None, each
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        namespace.nothing_here  # noqa: B018


def test_a_name_is_in_one_namespace_only() -> None:
    """Each name has one home behind the door (`open_engine`: the door's own opener, also in `service`)."""
    homes: dict[str, list[str]] = {}
    for name in api.NAMESPACES:
        for each in getattr(api, name).__all__:
            homes.setdefault(each, []).append(name)
    for each in api._WHERE:
        homes.setdefault(each, []).append("api")
    assert {k: v for k, v in homes.items() if len(v) > 1} == {}
    assert api.service.open_engine is api.open_engine


def test_importing_the_api_and_planning_through_it_load_no_torch(demo_model_dir: Path) -> None:
    code = ("import sys; from omni_console.engine.api import models, planner; "
            f"r = planner.plan_for(models.discover_model({str(demo_model_dir)!r}), planner.build_policy(), None, "
            "device='cpu'); "
            "assert r.forecast is not None and r.reasons == [] and r.ranks is None; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr


def test_both_engines_are_engine_handles(demo_model_dir: Path) -> None:
    one = open_engine(demo_model_dir, device="cpu")
    group = open_engine(demo_model_dir, device="cpu", layout=RankLayout(2, True))
    try:
        assert isinstance(one, Engine) and isinstance(group, GroupEngine)
        for engine, world in ((one, 1), (group, 2)):
            assert isinstance(engine, EngineHandle)
            assert engine.world == world and engine.pipe is None and engine.placement is None
        assert one.live_replan is False and group.live_replan is False
    finally:
        one.close()
        group.close()


def test_plan_for_an_engine_plans_with_its_model_and_device(demo_model_dir: Path) -> None:
    engine = open_engine(demo_model_dir, device="cpu")
    try:
        policy = api.planner.build_policy()
        done = api.planner.plan_for(engine, policy, forecast=False)
        assert done.plan == engine.make_plan(policy) and done.forecast is None and done.overhead is None
        again = api.planner.plan_for(engine, done.plan)  # a plan made already is taken as it is
        assert again.plan is done.plan and again.forecast is not None
    finally:
        engine.close()


def test_plan_for_a_model_needs_a_device_name(demo_model_dir: Path) -> None:
    with pytest.raises(TypeError, match="device"):
        api.planner.plan_for(api.models.discover_model(demo_model_dir), api.planner.build_policy())


def test_the_console_imports_below_it_only_through_the_front_door_type_checking_imports_too() -> None:
    """The import-linter contract skips `if TYPE_CHECKING:` imports (they make no cycle); this reads them all."""
    allowed = {"engine.api", "engine.events", "engine.errors", "offload.units"}
    console = Path(api.__file__).parents[1] / "console"
    seen = []
    for path in sorted(console.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module.removeprefix("omni_console.") if not node.level else node.module
                if module.split(".")[0] in ("engine", "offload") and (node.level or node.module.startswith("omni_")):
                    # `from ..engine import events` imports the module engine.events
                    for each in [f"{module}.{a.name}" for a in node.names] if module in ("engine", "offload") \
                            else [module]:
                        seen.append(each)
                        assert each in allowed, f"{path.name}:{node.lineno} imports {each}"
    assert {"engine.api", "engine.events"} <= set(seen)


def test_plan_for_is_plan_then_budget_then_forecast_then_ranks(demo_model_dir: Path) -> None:
    from omni_console.engine.planning.auto_plan import auto_plan_for
    from omni_console.engine.planning.request_forecast import forecast_for
    from omni_console.engine.ranks.rank_forecast import rank_forecast_for

    model = api.models.discover_model(demo_model_dir)
    size, layout, budget = api.RequestSize(height=64, width=64), RankLayout(2, True), model.nbytes * 2
    done = api.planner.plan_for(model, api.planner.build_policy(), budget, size, "cpu", layout)
    auto = auto_plan_for(api.planner.make_plan(model, api.planner.build_policy()), budget, size, "cpu")
    assert done.plan == auto.plan and done.reasons == auto.reasons and done.overhead == auto.overhead
    # the run's cap, and the host as `run` loads under a budget: live re-plan masters of everything
    assert done.forecast == replace(forecast_for(auto.plan, size, "cpu", live_replan=True), budget=budget)
    assert done.ranks == rank_forecast_for(auto.plan, layout, done.forecast, size, "cpu")
