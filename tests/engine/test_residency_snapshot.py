"""The residency panel's rows leave the engine as `ResidencySnapshot` events (issue 24).

Loading the demo model (CPU) and running a request publishes the rows the console shows: staged
encoders and VAE on the device during their stage and back on the host after it, the DiT's
non-block modules and leading blocks resident, its streamed blocks one row each; only changes are
published (a bounded number per request), and an empty snapshot on unload.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.events import ResidencySnapshot, StagingEvent
from omni_console.engine.running.residency_snapshot import residency_rows
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import Subscription
from omni_console.offload.policy import build_policy

STAGED = ("text_encoder", "text_encoder_2", "vae")


@pytest.fixture
def demo_engine(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    yield engine
    engine.close()


def snapshots(sub: Subscription) -> list[ResidencySnapshot]:
    return [e for e in sub.drain() if isinstance(e, ResidencySnapshot)]


def states(snapshot: ResidencySnapshot) -> dict[str, str]:
    return {name: state for name, state, _ in snapshot.rows}


def test_load_request_and_unload_publish_the_panels_rows(demo_engine: Engine):
    sub = demo_engine.bus.subscribe()
    try:
        demo_engine.load(build_policy({}, 2))
        loaded = snapshots(sub)
        assert loaded, "the load publishes its rows"
        rows = states(loaded[-1])
        assert all(rows[name] == "host" for name in STAGED)  # staged: on the host between stages
        assert rows["transformer (non-block modules)"] == "resident"
        blocks = [(name, state) for name, state, _ in loaded[-1].rows if name.startswith("transformer.")]
        assert len(blocks) == 6 and [s for _, s in blocks[:2]] == ["resident", "resident"]
        assert {s for _, s in blocks[2:]} <= {"host", "device", "in_flight"}
        assert list(loaded[-1].rows) == residency_rows(demo_engine.placement, demo_engine.plan)

        gen = dict(FAMILY_GENERATION["flux"])
        steps, height, width = gen.pop("num_inference_steps"), gen.pop("height"), gen.pop("width")
        events_before = len(sub)
        assert events_before == 0
        demo_engine.generate(GenerateRequest(prompt="a red fox", steps=steps, height=height, width=width, seed=7,
                                             extra=gen))
        events = sub.drain()
        during = [e for e in events if isinstance(e, ResidencySnapshot)]
        for name in STAGED:  # on the device during its stage, back on the host after it
            assert any(states(s)[name] == "device" for s in during), name
            assert states(during[-1])[name] == "host"
        assert list(during[-1].rows) == residency_rows(demo_engine.placement, demo_engine.plan)
        stagings = sum(isinstance(e, StagingEvent) and e.direction == "d2h" for e in events)
        assert len(during) <= 2 * stagings + steps * 2  # per stager move and per DiT forward, not per block
        assert all(a.rows != b.rows for a, b in zip(during, during[1:], strict=False))  # changes only
    finally:
        demo_engine.unload()
        after = snapshots(sub)
        sub.close()
    assert after and after[-1].rows == ()
