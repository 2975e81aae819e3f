"""The plan leaves the engine as a `PlanReady` event (issue 24): the console never reads `engine.plan`
or `engine.pipe`.

A load publishes the plan it carries out, with the pipeline's request defaults, before the engine
says it is ready; the first request's first forward confirms the block order (a new plan, announced);
a live re-plan publishes the new plan; a request that changes nothing and an unload publish none. A
rank group's engine (no pipeline in this process) announces its plan without pipeline defaults.
"""

from __future__ import annotations

import inspect
import pickle

from omni_console.engine.engine import Engine
from omni_console.engine.events import EngineStateChanged, PlanReady
from omni_console.engine.lifecycle import EngineState, Lifecycle
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import EventBus
from omni_console.offload.policy import build_policy


def plan_events(events) -> list[PlanReady]:
    return [e for e in events if isinstance(e, PlanReady)]


def test_a_load_announces_its_plan_and_the_pipelines_defaults_before_ready_and_a_replan_its_new_plan(
        demo_model_dir):
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    sub = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 2))
        events = sub.drain()
        [ready] = plan_events(events)
        assert ready.plan is engine.plan and ready.plan.policy.resident_layers == 2
        became_ready = next(i for i, e in enumerate(events) if isinstance(e, EngineStateChanged) and e.new == "ready")
        assert events.index(ready) < became_ready  # the console knows the plan when it sees the engine ready
        pipe = engine.pipe
        assert ready.steps == inspect.signature(pipe.__call__).parameters["num_inference_steps"].default
        assert ready.height == ready.width == pipe.default_sample_size * pipe.vae_scale_factor
        assert pickle.loads(pickle.dumps(ready)).plan.policy == ready.plan.policy  # a rank forwards its events

        request = GenerateRequest(prompt="x", steps=1, height=64, width=64, seed=0, extra={"max_sequence_length": 16})
        engine.generate(request)  # the first forward checks the block order: the plan records it was observed
        assert [e.plan for e in plan_events(sub.drain())] == [engine.plan]
        assert engine.plan.model.component("transformer").order_observed
        engine.generate(request)
        assert plan_events(sub.drain()) == []  # nothing re-planned: nothing announced again

        engine.replan(build_policy({"text_encoder": False}, 4))
        [replanned] = plan_events(sub.drain())
        assert replanned.plan is engine.plan
        assert replanned.plan.policy.resident_layers == 4
        assert replanned.plan.policy.dlo_offload_components == {"text_encoder": False}

        engine.unload()
        assert plan_events(sub.drain()) == []
    finally:
        engine.close()


class _Group(Lifecycle):
    """A rank group's side of the lifecycle: a plan, but no pipeline in this process."""

    def __init__(self, plan: object) -> None:
        self.bus, self.state, self.failure, self.plan, self.pipe = EventBus(), EngineState.LOADING, None, plan, None


def test_an_engine_without_a_pipeline_here_announces_its_plan_without_defaults_once():
    group = _Group(plan="the plan")
    sub = group.bus.subscribe()
    group._set_state(EngineState.READY)
    group._set_state(EngineState.RUNNING)
    group._set_state(EngineState.READY)
    [ready] = plan_events(sub.drain())
    assert (ready.plan, ready.steps, ready.height, ready.width) == ("the plan", None, None, None)
