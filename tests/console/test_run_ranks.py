"""`run --gpus 2` on a CPU: two gloo rank processes, one image per seed, each identical to a one-GPU run
with that seed; nothing overwritten; bad combinations refused before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omni_console.console.cli import main

pytestmark = pytest.mark.slow  # end to end (spawns rank processes): .ci/run runs it, `pytest -q` skips it


@pytest.fixture(autouse=True)
def _cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CPU ranks are two processes: pass on a CI machine with fewer cores too (they only run slower)."""
    monkeypatch.setattr("os.cpu_count", lambda: 8)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["run", "--device", "cpu", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("allgather_flag", ["--dlo-use-allgather", "--dlo-no-use-allgather"])
def test_two_ranks_write_one_image_per_seed_equal_to_one_gpu_runs(demo_model_dir: Path, tmp_path: Path, capsys,
                                                                  allgather_flag: str) -> None:
    model = ["--model", str(demo_model_dir)]
    for seed in (5, 6):
        assert _run(capsys, *model, "--seed", str(seed), "--output", str(tmp_path / f"one-{seed}.png"))[0] == 0
    code, out, _ = _run(capsys, *model, "--gpus", "2", allgather_flag, "--seed", "5",
                        "--output", str(tmp_path / "two.png"), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["gpus"] == 2 and [r["seed"] for r in report["ranks"]] == [5, 6]
    for r in report["ranks"]:  # each rank says where its load's time went
        m = r["load_milestones"]
        assert 0 < m["dits_built"] <= m["dits_placed"] <= m["pipeline_built"] <= r["load_seconds"]
        assert r["host_peak_bytes"] > r["pinned_bytes"]  # each rank process's own peak RSS (VmHWM)
    for seed in (5, 6):
        ours = np.asarray(Image.open(tmp_path / f"two-seed{seed}.png"))
        assert np.array_equal(ours, np.asarray(Image.open(tmp_path / f"one-{seed}.png"))), seed
    if allgather_flag == "--dlo-use-allgather":
        assert all(r["block_host_bytes"] < report["streamed_bytes"] for r in report["ranks"])


def test_existing_rank_output_is_refused_before_any_rank_starts(demo_model_dir: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "out-seed1.png").write_bytes(b"mine")
    code, _, err = _run(capsys, "--model", str(demo_model_dir), "--gpus", "2", "--seed", "0",
                        "--output", str(tmp_path / "out.png"))
    assert code == 2 and "out-seed1.png" in err and err.count("\n") == 1
    assert (tmp_path / "out-seed1.png").read_bytes() == b"mine"
    assert not (tmp_path / "out-seed0.png").exists()


def test_too_many_cpu_ranks_is_one_line(demo_model_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    code, _, err = _run(capsys, "--model", str(demo_model_dir), "--gpus", "3", "--output", str(tmp_path / "o.png"))
    assert code == 2 and "--gpus 3" in err and err.count("\n") == 1


def test_cfg_parallel_run_writes_the_one_gpu_image(demo_model_dir: Path, tmp_path: Path, capsys) -> None:
    guided = ["--model", str(demo_model_dir), "--negative-prompt", "blurry", "--param", "true_cfg_scale=2.5",
              "--steps", "3", "--seed", "4"]
    assert _run(capsys, *guided, "--output", str(tmp_path / "one.png"))[0] == 0
    code, out, _ = _run(capsys, *guided, "--gpus", "2", "--parallel", "cfg", "--output", str(tmp_path / "cfg.png"),
                        "--json")
    assert code == 0 and json.loads(out)["parallel"] == "cfg"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.png", "one.png"]
    assert np.array_equal(np.asarray(Image.open(tmp_path / "cfg.png")), np.asarray(Image.open(tmp_path / "one.png")))


def test_ctrl_c_during_the_request_stops_every_rank_with_one_line(demo_model_dir: Path, tmp_path: Path, capsys,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel reaches the ranks (they stop at once, not after their 2000 steps): the one line, 130."""
    import multiprocessing
    import os
    import signal
    import threading
    import time

    from omni_console.engine.ranks.group_engine import GroupEngine

    real_generate = GroupEngine.generate
    generating = threading.Event()

    def generate(self: GroupEngine, *args, **kwargs):
        generating.set()
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(GroupEngine, "generate", generate)
    sent: list[float] = []

    def deliver() -> None:
        assert generating.wait(300), "the request never started"
        time.sleep(1.0)  # the ranks are running the request
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, lambda *_: None)  # a stray late signal must not stop pytest
    try:
        sender = threading.Thread(target=deliver)
        sender.start()
        code, out, err = _run(capsys, "--model", str(demo_model_dir), "--gpus", "2", "--steps", "2000",
                              "--output", str(tmp_path / "o.png"))
        sender.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (code, out) == (130, "") and time.monotonic() - sent[0] < 30
    assert err.endswith("omni-console: interrupted (SIGINT); nothing written\n")
    assert err.count("interrupted") == 1 and "Traceback" not in err
    assert "[rank 0] state ready → running request 1" in err  # interrupted during the request
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("omni-rank")]
    assert not list(tmp_path.iterdir())


def test_a_rank_that_dies_is_the_last_line_and_exit_1(demo_model_dir: Path, tmp_path: Path, capsys,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    from omni_console.engine.ranks.group_engine import GroupEngine

    real_generate = GroupEngine.generate

    def generate(self: GroupEngine, *args, **kwargs):
        self.group._procs[1].kill()  # rank 1 dies as the request starts
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(GroupEngine, "generate", generate)
    code, out, err = _run(capsys, "--model", str(demo_model_dir), "--gpus", "2", "--output", str(tmp_path / "o.png"))
    lines = err.splitlines()
    assert (code, out) == (1, "") and lines[-1].startswith("omni-console: rank 1 exited")
    assert [line for line in lines if line.startswith("omni-console:")] == lines[-1:] and "Traceback" not in err
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("omni-rank")]
    assert not list(tmp_path.iterdir())


def test_rank_local_replicas_run_the_cache_as_one_gpu_does_per_seed(demo_model_dir: Path, tmp_path: Path,
                                                                    capsys) -> None:
    """Each rank-local replica runs the whole pipeline on its own seed with its own cache: the images equal
    one GPU's with the same cache at those seeds (a hit pattern the threshold gives on the demo)."""
    model = ["--model", str(demo_model_dir), "--steps", "5", "--cache", "first-block:threshold=0.5"]
    hits = {}
    for seed in (3, 4):
        code, out, _ = _run(capsys, *model, "--seed", str(seed), "--output", str(tmp_path / f"one-{seed}.png"),
                            "--json")
        assert code == 0
        hits[seed] = json.loads(out)["cache"]["hits"]
    assert hits[3] > 0  # the threshold makes the cache skip blocks (engine test: 3 of 5 at seed 3)
    assert _run(capsys, *model[:4], "--seed", "3", "--output", str(tmp_path / "uncached.png"))[0] == 0
    uncached = np.asarray(Image.open(tmp_path / "uncached.png"))
    assert not np.array_equal(uncached, np.asarray(Image.open(tmp_path / "one-3.png")))  # the cache shows
    code, _, err = _run(capsys, *model, "--gpus", "2", "--dlo-no-use-allgather", "--seed", "3",
                        "--output", str(tmp_path / "two.png"))
    assert code == 0, err
    for seed in (3, 4):
        ours = np.asarray(Image.open(tmp_path / f"two-seed{seed}.png"))
        assert np.array_equal(ours, np.asarray(Image.open(tmp_path / f"one-{seed}.png"))), seed
