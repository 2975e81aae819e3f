"""`--cache` in `plan` and `run`: a bad kind, parameter or value, or a kind diffusers does not support for the
family, is one line on stderr and exit 2 before anything loads; the parser never fails any other way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_console.console.cli import main
from omni_console.engine.errors import ConfigError
from omni_console.engine.running.cache_spec import CACHE_KINDS, CacheSpec, parse_cache


def _run(capsys, model: Path, cache: str, tmp_path: Path, command: str = "run") -> tuple[int, list[str]]:
    capsys.readouterr()
    args = ["--model", str(model), "--cache", cache]
    if command == "run":
        args += ["--prompt", "x", "--output", str(tmp_path / "o.png")]
    code = main([command, *args])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(("cache", "line"), [
    ("bogus", "--cache 'bogus': not a cache kind (use one of first-block, mag, taylorseer, faster, pab, sea, off)"),
    ("first-block:threshold", "--cache first-block: 'threshold' is not key=value"),
    ("first-block:threshold=0.1,threshold=0.2", "--cache first-block: threshold given twice"),
    ("off:threshold=1", "--cache off: takes no parameters"),
    ("first-block:nope=1", "--cache first-block: FirstBlockCacheConfig has no parameter nope (it has threshold)"),
    ("first-block:threshold=nan", "--cache first-block: threshold=nan: takes a number"),
    ("mag:max_skip_steps=2.5", "--cache mag: max_skip_steps=2.5: takes a whole number"),
    ("pab:current_timestep_callback=1", "--cache pab: current_timestep_callback is set by the engine (the "
                                        "pipeline's current timestep)"),
])
@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_bad_cache_is_one_line_and_exit_2_before_load(demo_model_dir, tmp_path, capsys, loads, cache, line,
                                                         command):
    code, err = _run(capsys, demo_model_dir, cache, tmp_path, command)
    assert code == 2 and loads == [] and err == [f"omni-console: error: {line}"]
    assert not (tmp_path / "o.png").exists()


@pytest.mark.slow  # builds two tiny families and their DiTs on the meta device, once per kind
def test_a_kind_the_family_does_not_take_names_the_kinds_that_work(tmp_path, capsys, loads):
    """SkyReels-V2's block class is not in diffusers' block registry (First-Block Cache and MagCache cannot hook
    it); Lumina-Next's DiT has no `enable_cache` at all."""
    from tiny_families_more import build_tiny_more_family

    path = build_tiny_more_family("skyreels_v2", tmp_path / "skyreels")
    code, err = _run(capsys, path, "first-block:threshold=0.1", tmp_path, "plan")
    assert code == 2 and loads == [] and len(err) == 1
    head = ("omni-console: error: --cache first-block: diffusers does not support it for transformer "
            "(SkyReelsV2Transformer3DModel); kinds that work: ")
    assert err[0].startswith(head), err
    works = err[0][len(head):].split(", ")
    assert works and "first-block" not in works and "mag" not in works and set(works) <= set(CACHE_KINDS)
    for kind in works:  # each named kind passes the same check
        code, err = _run(capsys, path, kind, tmp_path, "plan")
        assert code == 0, (kind, err)
    lumina = build_tiny_more_family("lumina", tmp_path / "lumina")
    code, err = _run(capsys, lumina, "taylorseer", tmp_path, "plan")
    assert code == 2 and err == ["omni-console: error: --cache taylorseer: diffusers does not support it for "
                                 "transformer (LuminaNextDiT2DModel); no --cache kind works for it"]


_KEYS = st.sampled_from(["threshold", "max_skip_steps", "calibrate", "cache_interval", "x_y"])
_VALUES = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.booleans(), st.lists(st.integers(0, 1000), max_size=3), st.sampled_from(["bfloat16", "float32"]))


@given(kind=st.sampled_from(list(CACHE_KINDS)), params=st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_a_spec_reads_back_from_its_own_text(kind, params):
    spec = CacheSpec(kind, tuple(params.items()))
    back = parse_cache(spec.text())
    assert back is not None and back.kind == kind
    assert [k for k, _ in back.params] == list(params)
    for (_, got), want in zip(back.params, params.values(), strict=True):
        assert got == want or (isinstance(want, str) and got == want)


@given(st.text(max_size=80))
def test_any_text_parses_or_is_refused_in_one_line(text):
    try:
        spec = parse_cache(text)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("--cache")
        return
    assert spec is None or spec.kind in CACHE_KINDS


@pytest.mark.slow  # one run end to end
def test_run_json_carries_the_hit_rate_and_the_bytes_skipped_and_moved(demo_model_dir, tmp_path, capsys):
    import json

    from omni_console.engine.service.run_report import RunReport

    capsys.readouterr()
    code = main(["run", "--model", str(demo_model_dir), "--prompt", "a red fox", "--seed", "3", "--steps", "5",
                 "--cache", "first-block:threshold=0.5", "--output", str(tmp_path / "o.png"), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    RunReport.model_validate(report)
    cache, steps = report["cache"], report["steps"]
    assert cache["cache"] == "first-block:threshold=0.5"
    assert [s["cache_hits"] for s in steps] == [0, 1, 1, 0, 1]  # the demo's pattern at this seed (engine test)
    assert (cache["forwards"], cache["hits"], cache["hit_rate"]) == (5, 3, 0.6)
    assert cache["bytes_skipped"] == sum(s["skipped_bytes"] for s in steps) > 0
    assert cache["bytes_moved"] == sum(s["h2d_bytes"] for s in steps)
    assert all(s["skipped_bytes"] > 0 for s in steps if s["cache_hits"])


def test_plan_gives_the_cached_step_as_a_range(demo_model_dir, capsys):
    capsys.readouterr()
    assert main(["plan", "--model", str(demo_model_dir), "--cache", "first-block:threshold=0.2"]) == 0
    out, err = capsys.readouterr()
    line = out.strip().splitlines()[-1]
    assert line.startswith("--cache first-block:threshold=0.2: step time is a range, not a forecast: ") and not err
    if "unknown until measured" in line:  # no profile of the demo in this cache yet
        assert line.endswith("no hits (the uncached step, unknown until measured) down to a hit step running 1 of "
                             "6 blocks")
    else:  # an earlier uncached run measured the step: the best case is a sixth of it
        no_hits, best = (float(part.split(" s")[0]) for part in line.split("forecast: ")[1].split(" down to "))
        assert 0 < best < no_hits and best == pytest.approx(no_hits / 6, abs=1e-3)
        assert "(1 of 6 blocks copied and run; the first step never hits)" in line
    assert main(["plan", "--model", str(demo_model_dir), "--cache", "pab"]) == 0
    out, err = capsys.readouterr()
    assert "every block is still copied" in out.strip().splitlines()[-1] and err == ""


def test_a_bad_cache_is_answered_before_torch_is_imported(tmp_path):
    import subprocess
    import sys

    code = ("import sys\nfrom omni_console.console.cli import main\n"
            f"rc = main(['run', '--prompt', 'x', '--output', {str(tmp_path / 'o.png')!r}, '--cache', 'mag:x'])\n"
            "print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"]
    assert done.stderr.strip() == "omni-console: error: --cache mag: 'x' is not key=value"


def test_the_step_panel_and_progress_line_show_hits_and_skipped_bytes():
    from omni_console.console.event_text import progress_line
    from omni_console.console.widgets.step_timings import copied_cell
    from omni_console.engine.events import StepTiming

    hit = StepTiming(request_id=1, step=2, total_steps=5, wall_s=0.1, stall_s=0.0, h2d_bytes=0, cache_forwards=2,
                     cache_hits=1, skipped_blocks=5, skipped_bytes=3 * 2**20)
    plain_step = StepTiming(request_id=1, step=2, total_steps=5, wall_s=0.1, stall_s=0.0, h2d_bytes=2**20)
    assert copied_cell(hit) == "0 bytes (hit 1/2, skipped 3.1 MB)"
    assert copied_cell(plain_step) == "1.0 MB"  # no cache: as before
    assert progress_line(hit)[0].endswith("(stall 0.0 ms, cache hit 1/2, skipped 3.1 MB)")
    assert "cache" not in progress_line(plain_step)[0]


@pytest.mark.slow  # the rank layout's device checks
@pytest.mark.parametrize("flags, why", [
    (["--dlo-use-allgather"], "--cache with --dlo-use-allgather: every rank gathers each block together, but each "
                              "rank's cache decides its skips on its own seed's latents, so the gathers would "
                              "diverge; use --dlo-no-use-allgather (each rank streams whole blocks), or one GPU"),
    (["--parallel", "cfg"], "--cache with --parallel cfg: a rank computes the other guidance branch under the first "
                            "branch's cache context, so diffusers' per-branch cache state would not be one GPU's; "
                            "use --parallel dp --dlo-no-use-allgather, or one GPU"),
])
def test_a_cache_on_ranks_that_cannot_match_one_gpu_is_refused_before_anything_starts(
        demo_model_dir, tmp_path, capsys, loads, flags, why):
    capsys.readouterr()
    code = main(["run", "--model", str(demo_model_dir), "--prompt", "x", "--gpus", "2", "--device", "cpu", *flags,
                 "--cache", "first-block", "--output", str(tmp_path / "o.png")])
    assert code == 2 and loads == []
    assert capsys.readouterr().err.strip().splitlines() == [f"omni-console: error: {why}"]


def test_plan_json_carries_the_cached_step_as_a_range(demo_model_dir, capsys):
    from omni_console.engine.planning.documents import PlanDocument

    capsys.readouterr()
    assert main(["plan", "--model", str(demo_model_dir), "--cache", "first-block:threshold=0.2", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert PlanDocument.model_validate(document).to_json_dict() == document
    cache = document["cache"]
    assert (cache["cache"], cache["kind"], cache["is_range"]) == ("first-block:threshold=0.2", "first-block", True)
    assert (cache["blocks_run_on_hit"], cache["num_blocks"]) == (1, 6)
    assert cache["line"].startswith("--cache first-block:threshold=0.2: step time is a range, not a forecast: ")
    if cache["no_hits_step_seconds"] is None:  # nothing measured for the demo in this cache yet
        assert cache["best_step_seconds"] is None
    else:
        assert cache["best_step_seconds"] == pytest.approx(cache["no_hits_step_seconds"] / 6)
    assert main(["plan", "--model", str(demo_model_dir), "--cache", "pab", "--json"]) == 0
    pab = json.loads(capsys.readouterr().out)["cache"]
    assert pab["blocks_run_on_hit"] is None and pab["best_step_seconds"] == pab["no_hits_step_seconds"]
    assert main(["plan", "--model", str(demo_model_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cache"] is None
