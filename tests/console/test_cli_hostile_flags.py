"""Hostile flag values: numbers no parser expects, names the file system cannot hold, an empty output.

Each is one short `omni-console: error:` line and exit 2, before the model is read (the model path
given does not exist, so a check that comes too late answers "not found" instead and the test fails).
"""

from __future__ import annotations

import pytest
from cli_helpers import one_error_line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni_console.console.cli import main

HUGE = "9" * 5000  # past Python's 4,300-digit int() limit
LONG_NAME = "a" * 300  # past NAME_MAX (255 bytes)
MAX_LINE = 300  # an error line repeats a bad value cut short, never whole


def refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert len(line) < MAX_LINE, line
    return line


@pytest.mark.parametrize(("flags", "words"), [
    (["--upcast-resident", "²"], "upcast_resident must be auto, off or a number of resident blocks, got '²'"),
    (["--upcast-resident=--3"], "got '--3'"),
    (["--upcast-resident", HUGE], "upcast_resident: 5000 digits is too many"),
    (["--height", HUGE], "argument --height: '999999999999999999999999'… (5000 characters): too many digits"),
    (["--height", "３２"], "argument --height: '３２' is not a whole number"),
    (["--resident-layers", "٣"], "argument --resident-layers: '٣' is not a whole number"),
    (["--guidance", HUGE], "argument --guidance: '999999999999999999999999'… (5000 characters): too long"),
    (["--guidance", "1_0"], "argument --guidance: '1_0' is not a number"),
    (["--vram-budget", HUGE + "GB"], "--vram-budget '999999999999999999999999'… (5002 characters): too large"),
    (["--vram-budget", "2000TB"], "--vram-budget '2000TB': too large (at most 1 PB"),
    (["--model", f"/tmp/{LONG_NAME}"], "argument --model: the name 'aaaaaaaaaaaaaaaaaaaaaaaa'… (300 characters) "
                                       "is 300 bytes long; a file name takes at most 255"),
    (["--model", "/tmp/" + "/".join(["b" * 200] * 25)], "argument --model: the path is 5029 bytes long"),
    ([f"--{HUGE}"], "unrecognized arguments: --9999999999999999999999…(5002 characters)"),
])
def test_plan_flags_refused_in_one_short_line(tmp_path, capsys, flags, words):
    line = refused(capsys, ["plan", "--model", str(tmp_path / "absent"), *flags])
    assert words in line


@pytest.mark.parametrize(("flags", "words"), [
    (["--seed", HUGE], "argument --seed: '999999999999999999999999'… (5000 characters): too many digits"),
    (["--steps", "²"], "argument --steps: '²' is not a whole number"),
    (["--fps", HUGE], "argument --fps: '999999999999999999999999'… (5000 characters): too long for a number"),
    (["--output", ""], "argument --output: the name is empty"),
    (["--output", LONG_NAME + ".png"], "argument --output: the name 'aaaaaaaaaaaaaaaaaaaaaaaa'… (304 characters) is "
                                       "304 bytes long"),
    (["--output", "/tmp/" + "/".join(["b" * 200] * 25) + "/x.png"], "argument --output: the path is 5035 bytes"),
    (["--image", "é" * 200], "argument --image: the name 'éééééééééééééééééééééééé'… (200 characters) is 400 "
                             "bytes long"),
])
def test_run_flags_refused_in_one_short_line(tmp_path, capsys, flags, words):
    line = refused(capsys, ["run", "--model", str(tmp_path / "absent"), *flags])
    assert words in line
    assert list(tmp_path.iterdir()) == []


def test_demo_model_path_over_255_bytes(tmp_path, capsys):
    line = refused(capsys, ["demo-model", str(tmp_path / LONG_NAME)])
    assert "argument path: the name 'aaaaaaaaaaaaaaaaaaaaaaaa'… (300 characters) is 300 bytes long" in line
    assert list(tmp_path.iterdir()) == []


def test_cache_dir_name_over_255_bytes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / LONG_NAME))
    line = refused(capsys, ["plan", "--model", str(tmp_path / "absent")])
    assert line == ("omni-console: error: OMNI_CONSOLE_CACHE_DIR: the name 'aaaaaaaaaaaaaaaaaaaaaaaa'… "
                    "(300 characters) is 300 bytes long; a file name takes at most 255")


# --- every numeric flag, any text ----------------------------------------------------------------

PLAN_NUMBERS = ("--height", "--width", "--frames", "--max-sequence-length", "--guidance", "--resident-layers",
                "--prefetch-slots", "--gpus", "--upcast-resident", "--vram-budget")
RUN_NUMBERS = (*PLAN_NUMBERS, "--steps", "--seed", "--fps", "--telemetry-hz")
hostile_numbers = st.one_of(
    st.sampled_from(["²", "--3", "-0", "１２", "٣", "1_0", "0x10", "1e400", "-1e400", "nan", "inf", "", " ", "1.",
                     ".5", "+7", "9" * 4301, "1" + "0" * 5000, "0." + "1" * 5000, "1e99999999"]),
    st.integers(min_value=10**15, max_value=10**40).map(str),
    st.text(alphabet=st.sampled_from("0123456789-+.eE²³¹٠١٢３ _x"), max_size=40),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["plan", "run"]), data=st.data())
def test_any_numeric_flag_value_is_one_line_and_exit_2(command, data, tmp_path, capsys):
    """Nothing is read (the model is absent): whatever the value, the answer is one short line, exit 2."""
    flag = data.draw(st.sampled_from(PLAN_NUMBERS if command == "plan" else RUN_NUMBERS))
    value = data.draw(hostile_numbers)
    capsys.readouterr()
    refused(capsys, [command, "--model", str(tmp_path / "absent"), "--output" if command == "run" else "--json",
                     *([str(tmp_path / "o.png")] if command == "run" else []), f"{flag}={value}"])


@pytest.mark.parametrize("argv", [["plan", "--vram-budget=--"], ["plan", "--gpus=--"], ["run", "--steps=--"],
                                  ["run", "--seed=--"], ["plan", "--resident-layers=--"]])
def test_a_flag_given_dash_dash_as_its_value_is_one_line(argv, capsys, tmp_path):
    """argparse hands `--flag=--` an empty list, past the flag's own type (hypothesis found the traceback)."""
    line = refused(capsys, [*argv, "--model", str(tmp_path / "absent")])
    assert "expected a value, not '--'" in line
