"""ConsoleSession without Textual: the console's phases, what each key may do in each, and the engine's
plan and state as its events say them (issue 24). The app only relays these to the screen, so the
words below are the ones an operator reads in a toast."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

from omni_console.console.session import READ_ONLY, ConsoleSession
from omni_console.engine.events import EngineStateChanged, PlanReady
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy


def plan_of(policy, model="the model"):
    return SimpleNamespace(policy=policy, model=model)


def make(live_replan: bool = False) -> ConsoleSession:
    policy = build_policy({}, 2)
    editor = SimpleNamespace(policy=policy, plan=plan_of(policy))
    return ConsoleSession(editor, live_replan=live_replan, engine_state="discovered", prompt="a cat")


def state(old: str, new: str, reason: str = "", rank: int | None = None) -> EngineStateChanged:
    return EngineStateChanged(old=old, new=new, reason=reason, rank=rank)


def loaded(session: ConsoleSession, policy=None) -> PlanReady:
    """Drive a load to the live phase the way the app does: start, the engine's events, the outcome."""
    session.load_started()
    ready = PlanReady(plan=plan_of(policy or session.policy), steps=28, height=1024, width=1024)
    session.follow([state("discovered", "loading"), ready, state("loading", "ready")])
    session.load_succeeded(1.5)
    return ready


def test_a_load_moves_plan_loading_live_and_each_phase_allows_its_keys():
    session = make()
    assert session.allows("load", on_plan_screen=True) is True and session.refuse_load() is None
    assert session.allows("generate", on_plan_screen=True) is None  # greyed, not hidden
    assert session.allows("cancel", on_plan_screen=True) is False and not session.may_cancel()
    session.load_started()
    assert session.phase == "loading" and session.may_cancel()
    assert session.allows("cancel", on_plan_screen=True) is True and session.allows("edit", on_plan_screen=True) is None
    assert session.refuse_load() == ("busy (loading)", "warning")
    assert session.refuse_budget() == (READ_ONLY, "warning")
    ready = PlanReady(plan=plan_of(session.policy), steps=28, height=1024, width=1024)
    session.follow([state("discovered", "loading"), ready, state("loading", "ready")])
    assert session.planned is ready and session.engine_state == "ready"
    session.load_succeeded(1.5)
    assert (session.phase, session.load_seconds) == ("live", 1.5)
    assert session.allows("generate", on_plan_screen=False) is True and session.allows("unload", on_plan_screen=False)
    assert session.refuse_load() == ("already loaded or busy; u unloads first", "warning")
    assert session.allows("edit", on_plan_screen=False) is None  # loaded without live re-plan: read-only
    session.unload_started()
    assert session.refuse_unload() == ("nothing loaded", "warning")
    session.unload_failed()
    assert session.phase == "live"
    session.unload_started()
    session.follow([state("ready", "unloaded")])
    session.unloaded()
    assert session.phase == "plan" and session.planned is None and session.engine_state == "unloaded"


def test_a_request_blocks_u_not_g_until_its_outcome_and_is_remembered_per_model():
    session = make()
    assert session.refuse_generate() == ("load the model first (l)", "warning")
    loaded(session)
    request = GenerateRequest(prompt="a red fox", steps=3, height=64, width=64, seed=7)
    session.request_started(request, "/models/demo", "the size")
    assert session.generating and session.may_cancel()
    assert session.refuse_generate() is None  # g while a request runs queues the next (the engine's service)
    assert session.refuse_unload() == ("a request is running or queued; esc cancels it, the queue panel's X "
                                       "clears the rest", "warning")
    assert session.last_requests == {"/models/demo": request} and session.prompt == "a red fox"
    assert session.request_size == "the size"
    session.request_ended("RuntimeError: boom")
    assert not session.generating and session.last_error == "RuntimeError: boom" and session.last_output is None
    session.request_started(request, "/models/demo", "the size")
    session.request_ended(output=Path("out/1.png"), queued=True)  # another request still waits
    assert session.generating and session.refuse_unload() is not None
    session.request_ended(output=Path("out/1.png"))
    assert session.last_output == Path("out/1.png") and session.last_error == "RuntimeError: boom"
    assert session.refuse_generate() is None and session.refuse_unload() is None


def test_a_failed_load_reports_the_engines_reason_and_a_new_load_forgets_it():
    session = make()
    session.load_started()
    session.follow([state("discovered", "loading"), state("loading", "failed", "OSError: disk full")])
    assert session.load_failed(RuntimeError("wrapped")) == "OSError: disk full"
    assert session.phase == "plan" and session.last_error == "OSError: disk full"
    session.load_started()
    session.follow([state("failed", "loading")])
    assert session.last_error is None and session.failure is None
    assert session.load_failed(RuntimeError("no engine event")) == "RuntimeError: no engine event"


def test_only_this_processs_engine_speaks_for_the_plan_and_state():
    session = make()
    loaded(session)
    mine = session.planned
    other = PlanReady(plan=plan_of(build_policy({}, 5)), rank=1)
    session.follow([other, state("ready", "running", rank=0), state("running", "failed", "rank 1 died", rank=1)])
    assert session.planned is mine and session.engine_state == "ready" and session.failure is None


def test_live_edits_follow_the_engines_plan_and_a_refused_replan_returns_to_it():
    session = make(live_replan=True)
    ready = loaded(session)
    assert session.allows("edit", on_plan_screen=False) is True and session.refuse_budget() is None
    edited = build_policy({}, 4)
    session.editor.policy, session.editor.plan = edited, plan_of(edited)
    assert session.running_policy == ready.plan.policy != edited  # the status line names what runs
    session.replan_refused()
    assert session.policy == ready.plan.policy and session.plan is ready.plan
    replanned = PlanReady(plan=plan_of(edited))
    session.follow([replanned])
    assert session.running_policy == edited


def test_the_editor_plans_on_the_engines_model_once_its_plan_ready_says_it(demo_model_dir):
    """A first forward that ran the block lists in another order changes the engine's model; the editor
    (planning on the UI thread, no engine object) follows it from the engine's PlanReady."""
    from dataclasses import replace

    from omni_console.console.policy_edits import PolicyEditor
    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.engine.planning.plan import make_plan

    model = discover_model(demo_model_dir)
    editor = PolicyEditor(model, build_policy({}, 0))
    session = ConsoleSession(editor, live_replan=True, engine_state="discovered", prompt="a cat")
    dit = model.dits[0]
    assert len(dit.block_lists) == 2
    observed = replace(dit, block_lists=tuple(reversed(dit.block_lists)), order_observed=True)
    corrected = replace(model, components=tuple(observed if c.name == dit.name else c for c in model.components))
    assert editor.edit("layers", 1).kept and session.plan.blocks[0].attr == dit.block_lists[0].attr
    session.follow([PlanReady(plan=make_plan(corrected, session.policy), rank=1)])  # a rank's: not ours
    assert editor.edit("layers", 1).kept and session.plan.blocks[0].attr == dit.block_lists[0].attr
    session.follow([PlanReady(plan=make_plan(corrected, session.policy))])
    assert editor.edit("layers", 1).kept
    assert session.plan.blocks[0].attr == dit.block_lists[1].attr and not session.plan.blocks[0].streamed
    assert session.plan == make_plan(corrected, build_policy({}, 3))


def test_commands_in_flight_and_quit():
    session = make()
    first, second = Future(), Future()
    assert session.track("load", first) is first and session.busy is first
    session.track("bandwidth", second)
    session.command_done(first)  # not the latest: the latest stays in flight
    assert session.busy is second and session.last_command == {"load": first, "bandwidth": second}
    session.command_done(second)
    assert session.busy is None
    session.bandwidth_measured(5e10)
    assert session.bandwidth == 5e10 and session.bandwidth_source.startswith("measured")
    assert session.quit() and session.phase == "quitting"
    assert not session.quit()  # a second q does nothing more
    assert session.allows("load", on_plan_screen=True) is None


def test_the_session_imports_neither_textual_nor_torch():
    code = ("import sys, omni_console.console.session\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'torch'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


COMMAND_LINE_MODULES = ("cli.py", "headless.py", "headless_ranks.py", "app_main.py")
"""The command line's modules: they drive the engine on the main thread before or instead of the app."""


def ui_modules() -> list[Path]:
    """Every console module the app's UI thread runs (all but the command line's)."""
    from omni_console.console import session as session_module

    root = Path(session_module.__file__).parent
    return sorted(p for p in root.rglob("*.py") if p.name not in COMMAND_LINE_MODULES or p.parent != root)


def engine_reads(path) -> list[str]:
    """`x.engine.plan`-like reads of the engine's live objects (plan, pipe, placement, state, failure), and
    `engine.pipe` / `engine.plan` / `engine.placement` on a name, in one module."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Attribute) and owner.attr == "engine"
                and node.attr in ("plan", "pipe", "placement", "state", "failure")):
            found.append(f"{path.name}:{node.lineno} .engine.{node.attr}")
        elif isinstance(owner, ast.Name) and owner.id == "engine" and node.attr in ("plan", "pipe", "placement"):
            found.append(f"{path.name}:{node.lineno} engine.{node.attr}")
    return found


def test_the_apps_modules_read_the_engines_plan_pipe_and_state_only_from_events():
    files = ui_modules()
    assert len(files) > 10
    assert [read for path in files for read in engine_reads(path)] == []


def engine_calls(source: str, name: str = "<source>") -> list[str]:
    """Calls into the engine object outside a worker command (`worker.call(lambda engine: ...)`, run on the
    engine thread): `engine.m(...)` / `x.engine.m(...)`, and any reference to one of `EngineHandle`'s methods
    (`x.engine.make_plan` handed on is a call on the UI thread later). `x.engine.bus` is the event stream
    (its own thread-safe object) and `x.engine.model` etc. are values: not calls into the engine."""
    import ast
    import inspect

    from omni_console.engine.api import EngineHandle

    methods = {n for n, v in vars(EngineHandle).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert {"make_plan", "forecast", "load", "generate", "replan"} <= methods

    def is_engine(node: ast.expr) -> bool:
        return ((isinstance(node, ast.Name) and node.id == "engine")
                or (isinstance(node, ast.Attribute) and node.attr == "engine"
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "app")))

    found: list[str] = []

    def visit(node: ast.AST, on_worker: bool) -> None:
        if isinstance(node, ast.Lambda) and "engine" in [a.arg for a in node.args.args]:
            on_worker = True  # the body runs on the engine thread, with the engine as its argument
        children = list(ast.iter_child_nodes(node))
        if not on_worker:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_engine(node.func.value):
                found.append(f"{name}:{node.lineno} engine.{node.func.attr}()")
                children.remove(node.func)  # the method named once, as a call
            elif isinstance(node, ast.Attribute) and node.attr in methods and is_engine(node.value):
                found.append(f"{name}:{node.lineno} engine.{node.attr}")
        for child in children:
            visit(child, on_worker)

    visit(ast.parse(source), False)
    return sorted(set(found))


def test_the_guard_tells_a_call_into_the_engine_from_a_worker_command():
    source = """
editor = PolicyEditor(engine.model, engine.make_plan, policy)
line = forecast_line(self.engine.forecast(size), steps)
self.engine.prepare()
future = self.worker.call(lambda engine: engine.forecast(size, plan=plan))
self.sub = engine.bus.subscribe()
self.engine.bus.publish(event)
rows = routed.engine.append(event)
name = self.engine.model.component("vae").name
"""
    assert engine_calls(source) == ["<source>:2 engine.make_plan", "<source>:3 engine.forecast()",
                                    "<source>:4 engine.prepare()"]


def test_the_ui_thread_makes_no_call_into_the_engine():
    """Only worker commands touch the engine object: the UI thread plans with the pure make_plan on the model
    value and asks the engine thread for every forecast (issue 24)."""
    files = ui_modules()
    assert {"app.py", "plan_commands.py", "request_commands.py", "policy_edits.py"} <= {p.name for p in files}
    assert [call for path in files for call in engine_calls(path.read_text(), path.name)] == []
