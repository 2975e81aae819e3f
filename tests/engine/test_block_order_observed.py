"""The DiT block order is checked against the first real forward and corrected where the source misleads.

Per family (the tiny families, the video ones and Lumina2): with every block streamed, no block is fetched
synchronously after the first step (the streamer counts them), and the engine's order is the one the blocks
were really called in. Lumina2 registers `noise_refiner` first but runs `context_refiner` first: the
engine says so (an event and a log line), the streamer, the plan and `plan --json` follow what ran, and a
cached order that does not fit the model is ignored.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from tiny_families import FAMILY_GENERATION
from tiny_families_shapes import SHAPE_GENERATION, build_tiny_lumina2

from omni_console.console.cli import main
from omni_console.engine.engine import Engine
from omni_console.engine.events import BlockOrderCorrected, StepTiming
from omni_console.engine.model_dir.blocks import BlockList
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.order_cache import order_path
from omni_console.engine.running.order_watch import one_pass_order
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import LogEvent
from omni_console.offload.policy import build_policy

LUMINA2_SOURCE = ["noise_refiner", "context_refiner", "layers"]
LUMINA2_RAN = ["context_refiner", "noise_refiner", "layers"]


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No order cached yet: this test's own cache directory."""
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def lumina2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lumina2(tmp_path_factory.mktemp("models") / "lumina2", seed=0)


def request_for(family: str) -> GenerateRequest:
    gen = {**FAMILY_GENERATION, **SHAPE_GENERATION}[family]
    frames = gen.get("num_frames")
    return GenerateRequest(prompt="a fox", steps=3, height=gen["height"], width=gen["width"], seed=0,
                           frames=frames, max_sequence_length=gen["max_sequence_length"], output_type="np")


def called_order(engine: Engine) -> list[str]:
    """Hooks on the loaded DiT: `LIST.i` in the order the blocks are called (the test's own record)."""
    calls: list[str] = []
    (dit,) = engine.model.dits
    module = getattr(engine.pipe, dit.name)
    for block_list in dit.block_lists:
        for i, block in enumerate(getattr(module, block_list.attr)):
            block.register_forward_pre_hook(lambda *_, n=f"{block_list.attr}.{i}": calls.append(n))
    return calls


FAMILIES = {"flux": "demo_model_dir", "sd3": "sd3_model_dir", "pixart_sigma": "pixart_model_dir",
            "wan": "wan_model_dir", "ltx": "ltx_model_dir", "ltx_i2v": "ltx_i2v_model_dir",
            "cogvideox": "cogvideox_model_dir", "lumina2": "lumina2_dir"}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_no_synchronous_fetch_after_the_first_step(request, family, fresh_cache, wan_loadable, tmp_path):
    path: Path = request.getfixturevalue(FAMILIES[family])
    req = request_for(family)
    if family == "ltx_i2v":
        from PIL import Image

        req = dataclasses.replace(req, image=tmp_path / "first.png")
        Image.new("RGB", (32, 32), (120, 40, 200)).save(req.image)
    engine = Engine(path, device="cpu")
    sub = engine.bus.subscribe()
    engine.load(build_policy({}, 0))  # every block streamed through a ring of two slots
    calls = called_order(engine)
    streamer = engine.placement.streamer
    per_forward: list[int] = []  # not every pipeline has step callbacks (PixArt): count per DiT forward
    getattr(engine.pipe, engine.model.dits[0].name).register_forward_hook(
        lambda *_: per_forward.append(streamer.take_step_stats().sync_fetches))
    engine.generate(req)
    assert len(per_forward) >= 3 and per_forward[1:] == [0] * (len(per_forward) - 1), per_forward
    steps = [e for e in sub.drain() if isinstance(e, StepTiming)]
    assert all(s.sync_fetches == 0 for s in steps)  # what the step events say agrees (this hook took them)
    plan_order = [f"{b.attr}.{b.index}" for b in engine.plan.blocks]
    assert calls[: len(plan_order)] == plan_order  # the order the plan (and the ring) follow is what ran
    assert [n.split(".", 1)[1] for n in streamer.block_names] == plan_order
    engine.close()


@pytest.mark.slow
def test_lumina2_order_is_corrected_and_said(lumina2_dir, fresh_cache, capsys):
    model = discover_model(lumina2_dir)
    assert [b.attr for b in model.dits[0].block_lists] == LUMINA2_SOURCE  # what the source says
    assert main(["plan", "--model", str(lumina2_dir), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    (dit_doc,) = [c for c in before["components"] if c["name"] == "transformer"]
    assert dit_doc["block_order"] == "source" and [b["attr"] for b in dit_doc["block_lists"]] == LUMINA2_SOURCE

    engine = Engine(lumina2_dir, device="cpu")
    sub = engine.bus.subscribe()
    engine.load(build_policy({}, 1))  # one resident block: it stays where it is when the order changes
    resident_before = engine.placement.streamer.block_names[0]
    engine.generate(request_for("lumina2"))
    events = sub.drain()
    (corrected,) = [e for e in events if isinstance(e, BlockOrderCorrected)]
    assert (list(corrected.planned), list(corrected.observed)) == (LUMINA2_SOURCE, LUMINA2_RAN)
    assert any(isinstance(e, LogEvent) and e.level == "warning" and "context_refiner → noise_refiner" in e.message
               for e in events)
    steps = [e for e in events if isinstance(e, StepTiming)]
    assert steps[0].sync_fetches > 0 and all(s.sync_fetches == 0 for s in steps[1:])
    streamer = engine.placement.streamer
    assert [b.attr for b in engine.plan.model.dits[0].block_lists] == LUMINA2_RAN
    assert engine.plan.residency == streamer.residency  # the plan shows what the streamer does
    kept = [n for n, r in zip(streamer.block_names, streamer.residency.resident, strict=True) if r]
    assert kept == [resident_before] == ["transformer.noise_refiner.0"]
    engine.close()

    assert main(["plan", "--model", str(lumina2_dir), "--json", "--resident-layers", "1"]) == 0
    after = json.loads(capsys.readouterr().out)
    (dit_doc,) = [c for c in after["components"] if c["name"] == "transformer"]
    assert dit_doc["block_order"] == "observed" and [b["attr"] for b in dit_doc["block_lists"]] == LUMINA2_RAN
    assert after["forecast"]["resident_block_indices"] == [0]  # a new plan: context_refiner.0 leads

    again = Engine(lumina2_dir, device="cpu")  # the next load starts in the observed order
    sub = again.bus.subscribe()
    again.load(build_policy({}, 1))
    assert again.placement.streamer.block_names[0] == "transformer.context_refiner.0"
    again.generate(request_for("lumina2"))
    events = sub.drain()
    assert not [e for e in events if isinstance(e, BlockOrderCorrected)]
    assert all(e.sync_fetches == 0 for e in events if isinstance(e, StepTiming))
    again.close()


@pytest.mark.parametrize("content", [
    '{"version": 1, "order": ["layers", "noise_refiner"]}',  # not every list
    '{"version": 1, "order": ["layers", "layers", "noise_refiner"]}',
    '{"version": 1, "order": ["x", "y", "z"]}',
    '{"version": 2, "order": ["context_refiner", "noise_refiner", "layers"]}',
    '{"version": 1, "order": [1, 2, 3]}',
    '["context_refiner"]',
    "not json",
    '{"version": 1, "order": ["' + "a" * 100_000 + '"]}',
])
def test_a_cached_order_that_does_not_fit_is_ignored(lumina2_dir, fresh_cache, content):
    (dit,) = discover_model(lumina2_dir).dits
    path = order_path(lumina2_dir, dit.name, dit.class_name, dit.block_lists)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    (dit,) = discover_model(lumina2_dir).dits
    assert [b.attr for b in dit.block_lists] == LUMINA2_SOURCE and not dit.order_observed


def test_a_valid_cached_order_is_applied(lumina2_dir, fresh_cache):
    (dit,) = discover_model(lumina2_dir).dits
    path = order_path(lumina2_dir, dit.name, dit.class_name, dit.block_lists)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "order": LUMINA2_RAN}))
    (dit,) = discover_model(lumina2_dir).dits
    assert [b.attr for b in dit.block_lists] == LUMINA2_RAN and dit.order_observed


LISTS = [BlockList("a", (1, 1)), BlockList("b", (1, 1, 1))]


@pytest.mark.parametrize("calls,expected", [
    ([("b", 0), ("b", 1), ("b", 2), ("a", 0), ("a", 1)], ["b", "a"]),
    ([("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)], ["a", "b"]),
    ([("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2)], None),  # interleaved
    ([("a", 0), ("a", 1), ("b", 0), ("b", 2), ("b", 1)], None),  # out of index order
    ([("a", 0), ("a", 1), ("b", 0), ("b", 1)], None),  # a block skipped
    ([("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("a", 0)], None),  # called twice
    ([], None),
])
def test_only_one_pass_over_the_lists_is_an_order(calls, expected):
    assert one_pass_order(calls, LISTS) == expected


def test_streamer_reorder_keeps_each_block_where_it_is():
    from omni_console.offload.residency import BlockResidency
    from omni_console.offload.streamer import LayerwiseStreamer

    torch.manual_seed(0)
    first = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    second = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    x = torch.randn(1, 4)

    def forward(order):
        y = x
        for block in order:
            y = block(y)
        return y

    expected = forward([*second, *first])
    streamer = LayerwiseStreamer([("a", first), ("b", second)], "cpu",
                                 residency=BlockResidency((True, False, False, False, False, False), 2))
    streamer.attach()
    assert torch.equal(forward([*second, *first]), expected)
    assert streamer.take_step_stats().sync_fetches > 0  # the ring held a.1 and a.2 when b.0 ran
    residency = streamer.reorder(["b.0", "b.1", "b.2", "a.0", "a.1", "a.2"])
    assert residency.resident == (False, False, False, True, False, False) and residency.slots == 2
    for _ in range(2):
        assert torch.equal(forward([*second, *first]), expected)
    assert streamer.take_step_stats().sync_fetches == 0
    with pytest.raises(ValueError, match="every block exactly once"):
        streamer.reorder(["b.0", "b.0", "b.2", "a.0", "a.1", "a.2"])
    streamer.detach()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("resident", [0, 2])
def test_lumina2_on_cuda_moves_each_block_once_per_forward_after_the_first(lumina2_dir, fresh_cache, resident):
    """On a GPU the ring is asynchronous: after the first forward no block is fetched synchronously and each
    step moves the same bytes, one pass over the streamed blocks per DiT forward (the issue saw 13 synchronous
    fetches per step and twice the bytes)."""
    engine = Engine(lumina2_dir, device="cuda")
    sub = engine.bus.subscribe()
    engine.load(build_policy({}, resident))
    streamer = engine.placement.streamer
    forwards: list[tuple[int, int]] = []  # per DiT forward: (sync fetches, bytes copied)
    engine.pipe.transformer.register_forward_hook(
        lambda *_: forwards.append(astuple(streamer.take_step_stats(wait=True))))
    engine.generate(dataclasses.replace(request_for("lumina2"), steps=4, guidance=4.0))
    engine.close()
    assert [f[0] for f in forwards[1:]] == [0] * (len(forwards) - 1), forwards
    assert len({f[1] for f in forwards[2:]}) == 1, forwards  # the same bytes every steady forward
    assert [e for e in sub.drain() if isinstance(e, BlockOrderCorrected)]


def astuple(stats) -> tuple[int, int]:
    return stats.sync_fetches, stats.h2d_bytes


def test_streamer_reorder_keeps_parked_blocks_parked():
    """An expert's parked blocks (Wan 2.2's inactive expert) stay out of the ring whatever the order."""
    from omni_console.offload.streamer import LayerwiseStreamer

    torch.manual_seed(0)
    first = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    second = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    x = torch.randn(1, 4)
    expected = second[2](second[1](second[0](x)))
    streamer = LayerwiseStreamer([("a", first), ("b", second)], "cpu", keep_masters=True,
                                 active=(False, False, False, True, True, True))
    streamer.attach()
    streamer.reorder(["b.0", "b.1", "b.2", "a.0", "a.1", "a.2"])
    assert streamer.active == (True, True, True, False, False, False)
    for _ in range(2):
        assert torch.equal(second[2](second[1](second[0](x))), expected)
    assert streamer.take_step_stats().sync_fetches == 0
    streamer.detach()
