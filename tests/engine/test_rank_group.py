"""Two rank processes on gloo serve the demo model as one engine: each rank's image is bit-identical to
the single-process engine's for its seed, with AllGather (each rank pins about half the streamed
blocks) and rank-local; a rank that dies is reported and the group stops, never hangs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_engine import request_for

from omni_console.engine.engine import Engine
from omni_console.engine.events import LoadProgress
from omni_console.engine.ranks.rank_group import RankFailed, RankGroup
from omni_console.engine.ranks.rank_layout import RankLayout
from omni_console.offload.policy import build_policy

pytestmark = pytest.mark.slow  # end to end (spawns rank processes): .ci/run runs it, `pytest -q` skips it

POLICIES = [({"text_encoder": True, "text_encoder_2": True, "vae": True}, 0),
            ({"text_encoder": False, "text_encoder_2": True, "vae": False}, 1)]


@pytest.fixture(scope="module")
def single_images(demo_model_dir: Path) -> dict:
    engine = Engine(demo_model_dir, device="cpu")
    out = {}
    for comps, layers in POLICIES:
        engine.load(build_policy(comps, layers))
        for seed in (7, 8):
            out[(str(comps), layers, seed)] = np.asarray(engine.generate(request_for("flux", seed)).image)
        engine.unload()
    engine.close()
    return out


@pytest.mark.parametrize("allgather", [True, False])
def test_data_parallel_ranks_match_the_single_engine(demo_model_dir: Path, single_images: dict,
                                                     allgather: bool) -> None:
    events: list[tuple[int, object]] = []
    with RankGroup(demo_model_dir, RankLayout(2, allgather), "cpu",
                   on_event=lambda rank, e: events.append((rank, e))) as group:
        for comps, layers in POLICIES:
            reports = group.load(build_policy(comps, layers))
            streamed = reports[0].streamed_bytes
            assert reports[1].streamed_bytes == streamed > 0
            for report in reports:  # AllGather: each rank holds its half of every block (plus padding)
                if allgather:
                    assert streamed / 2 <= report.block_host_bytes <= streamed / 2 + 2 * 256 * 16
                else:
                    assert report.block_host_bytes >= streamed
            results = group.generate(group.layout.rank_requests(request_for("flux", 7)))
            for seed, result in zip((7, 8), results, strict=True):
                assert np.array_equal(np.asarray(result.image), single_images[(str(comps), layers, seed)]), seed
            group.unload()
        from dataclasses import replace

        req = request_for("flux", 7)
        with pytest.raises(ValueError, match="share steps"):  # lockstep gathers: refused before any rank runs
            group.generate([req, replace(req, steps=(req.steps or 2) + 1)])
        with pytest.raises(ValueError, match="2 ranks take 2 requests"):
            group.generate([req])
    assert {rank for rank, e in events if isinstance(e, LoadProgress)} == {0, 1}


def test_a_rank_that_dies_stops_the_group_with_one_line(demo_model_dir: Path) -> None:
    group = RankGroup(demo_model_dir, RankLayout(2, True), "cpu")
    group._procs[1].kill()
    with pytest.raises(RankFailed, match="rank 1 exited"):
        group.load(build_policy({}, 0), timeout_s=120)
    assert all(not p.is_alive() for p in group._procs)
    group.close()


def _guided(family: str, steps: int = 3) -> object:
    from dataclasses import replace

    req = request_for(family, 7)
    req = replace(req, steps=steps, negative_prompt="blurry, low quality")
    # Flux runs its unconditional branch only with a true CFG scale; Wan with guidance above 1
    return replace(req, params={"true_cfg_scale": 2.5}) if family == "flux" else replace(req, guidance=4.0)


@pytest.mark.parametrize("family,fixture,allgather", [("flux", "demo_model_dir", True),
                                                     ("wan", "wan_model_dir", False)])
def test_cfg_parallel_ranks_give_the_single_engine_image(family: str, fixture: str, allgather: bool,
                                                         request: pytest.FixtureRequest) -> None:
    from omni_console.offload.events import LogEvent

    path = request.getfixturevalue(fixture)
    req = _guided(family)
    engine = Engine(path, device="cpu")
    engine.load(build_policy({}, 1))
    single = engine.generate(req)
    engine.close()
    expected = [np.asarray(f) for f in single.frames] or [np.asarray(single.image)]
    lines: list[str] = []
    with RankGroup(path, RankLayout(2, allgather, "cfg"), "cpu",
                   on_event=lambda rank, e: lines.append(f"{rank}:{e.message}") if isinstance(e, LogEvent) else None
                   ) as group:
        group.load(build_policy({}, 1))
        results = group.generate([req, req])
    for result in results:  # both ranks finish the same image
        got = [np.asarray(f) for f in result.frames] or [np.asarray(result.image)]
        assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert any("0:CFG-parallel: 2 DiT call pairs ran at once" in line for line in lines), lines


def test_a_rank_that_fails_to_load_stops_the_group_with_its_line(demo_model_dir: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "demo"
    shutil.copytree(demo_model_dir, root)
    group = RankGroup(root, RankLayout(2, True), "cpu")  # both ranks discovered the intact directory
    weights = max((root / "transformer").glob("*.safetensors"), key=lambda p: p.stat().st_size)
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    with pytest.raises(RankFailed, match=r"rank \d: load failed: ModelDirError: .*outside the file"):
        group.load(build_policy({}, 0), timeout_s=120)
    assert group.closed and all(not p.is_alive() for p in group._procs)
    with pytest.raises(RankFailed, match="stopped"):
        group.load(build_policy({}, 0))
    group.close()

