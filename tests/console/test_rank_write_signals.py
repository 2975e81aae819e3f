"""`run --gpus N`'s write follows the single run's signal rule: the ranks' images (one per seed) are put in
place together in one held step, so a signal while they are written leaves none of them and says "nothing
written", and one just after says every one is complete. The real CLI in a subprocess, two gloo ranks on
the CPU, stopped at the named moment (`OMNI_CONSOLE_TEST_PAUSE`) and sent the signal."""

from __future__ import annotations

import signal

import pytest
from PIL import Image
from test_signal_rule import DEMO_FAST, SIGNALS, finish, nothing_line, spawn, user_files, wait_paused

pytestmark = pytest.mark.slow  # two rank processes per case

RANKS = ["--gpus", "2", "--device", "cpu"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_between_the_ranks_outputs_leaves_none_of_them(tmp_path, demo_model_dir, signum):
    proc, flag = spawn(["run", "--model", str(demo_model_dir), "--output", "r.png", *RANKS, *DEMO_FAST], tmp_path,
                       "between-outputs")  # rank 0's image encoded, rank 1's not yet
    wait_paused(proc, flag)
    proc.send_signal(signum)
    code, out, err = finish(proc, flag)
    assert (code, out) == (SIGNALS[signum], "") and err.endswith(nothing_line(signum)), err
    assert err.count("interrupted") == 1 and "Traceback" not in err
    assert user_files(tmp_path) == []  # neither seed's image, no scratch folder


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["INT", "HUP"])
def test_a_signal_just_after_the_ranks_write_keeps_every_output_and_says_so(tmp_path, demo_model_dir, signum):
    proc, flag = spawn(["run", "--model", str(demo_model_dir), "--output", "r.png", *RANKS, *DEMO_FAST], tmp_path,
                       "after-write")
    wait_paused(proc, flag)
    proc.send_signal(signum)
    code, out, err = finish(proc, flag)
    name = signal.Signals(signum).name
    assert (code, out) == (SIGNALS[signum], "") and "Traceback" not in err
    assert err.endswith(f"omni-console: interrupted ({name}); output complete: r-seed0.png … r-seed1.png "
                        "(2 files)\n"), err
    assert user_files(tmp_path) == ["r-seed0.png", "r-seed1.png"]
    assert all(Image.open(tmp_path / name).size == (64, 64) for name in user_files(tmp_path))
