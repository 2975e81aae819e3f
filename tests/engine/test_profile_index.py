"""`plan` finds its profiles by name, never by reading the folder: 2,048 profiles in the cache cost it
two opens (this size's file and the model's newest), and a file whose content does not match its
name is ignored with one note."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.model_configs import fill_size
from omni_console.engine.planning.request_profile import (
    RequestProfile,
    RequestSize,
    latest_path,
    profile_dir,
    profile_path,
    save_profile,
)

PLAN = ["plan", "--device", "cpu", "--height", "64", "--width", "64", "--json"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(root))
    return root


def _profile(model_dir: Path, size: RequestSize, model: str | None = None) -> RequestProfile:
    info = discover_model(model_dir)
    blocks = sum(len(bl.block_bytes) for c in info.components for bl in c.block_lists)
    return RequestProfile(model=model or str(model_dir.resolve()), model_bytes=info.nbytes, device="cpu", size=size,
                          block_compute_s=[0.01] * blocks, other_s=0.002, forwards_per_step=1,
                          bandwidth_bytes_per_s=1e9, measured_at="2026-12-01T00:00:00")


def _plan(capsys, model_dir: Path) -> dict:
    assert main([*PLAN, "--model", str(model_dir)]) == 0
    return json.loads(capsys.readouterr().out)["request_forecast"]


@pytest.mark.slow
def test_plan_opens_only_its_own_profiles_among_2048(demo_model_dir: Path, cache: Path, capsys,
                                                     monkeypatch: pytest.MonkeyPatch):
    info = discover_model(demo_model_dir)
    profile_dir().mkdir(parents=True)
    template = _profile(demo_model_dir, RequestSize(height=32, width=32))
    for i in range(2047):  # other models' profiles, named as the engine names them
        other = template.model_copy(update=dict(model=f"/elsewhere/m{i}", size=RequestSize(height=8 + i, width=32)))
        profile_path(Path(other.model), other.model_bytes, "cpu", other.size).write_text(other.model_dump_json())
    save_profile(template)
    assert len(list(profile_dir().glob("*.json"))) == 2049
    opened: list[str] = []
    real_open, real_scandir, real_listdir = os.open, os.scandir, os.listdir
    root = str(profile_dir())

    def counting_open(path, *args, **kwargs):
        if str(path).startswith(root):
            opened.append(str(path))
        return real_open(path, *args, **kwargs)

    def refuse_listing(real):
        def listing(path="."):
            assert not str(path).startswith(root), f"plan listed the profile folder {path}"
            return real(path)
        return listing

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "scandir", refuse_listing(real_scandir))
    monkeypatch.setattr(os, "listdir", refuse_listing(real_listdir))
    forecast = _plan(capsys, demo_model_dir)
    asked = RequestSize(height=64, width=64)
    own = {str(latest_path(demo_model_dir, info.nbytes, "cpu"))}
    own |= {str(profile_path(demo_model_dir, info.nbytes, "cpu", s)) for s in (asked, fill_size(info, asked))}
    assert opened and set(opened) <= own, set(opened) - own
    # the newest of this model, found by its name: scaled from it (or its range said in a note)
    assert "scaled from 32x32" in " ".join([forecast["step_basis"], *forecast["notes"]])


def test_a_profile_under_another_keys_name_is_ignored_with_one_note(demo_model_dir: Path, cache: Path, capsys):
    info = discover_model(demo_model_dir)
    save_profile(_profile(demo_model_dir, RequestSize(height=32, width=32)))
    stranger = _profile(demo_model_dir, RequestSize(height=32, width=32), model="/elsewhere/other")
    latest = latest_path(demo_model_dir, info.nbytes, "cpu")
    latest.write_text(stranger.model_dump_json())  # a copy of another model's profile under this model's name
    forecast = _plan(capsys, demo_model_dir)
    notes = [n for n in forecast["notes"] if "ignored" in n]
    assert len(notes) == 1 and str(latest) in notes[0] and "another model" in notes[0]
    assert "scaled" not in forecast["step_basis"]
