"""The README's pictures are the snapshot tests' own screens: each copy in docs/screens/ has the bytes of its
snapshot, so a screen that changes (its snapshot regenerated) fails here until the copy is made again:
`cp tests/console/__snapshots__/<test>/<name>.svg docs/screens/<copy>.svg`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "console" / "__snapshots__"
COPIES = {
    "plan.svg": "test_snapshots/test_plan_screen_snapshot[omni-dark-160x48].svg",
    "live.svg": "test_snapshots/test_live_screen_snapshot[omni-dark-160x48].svg",
    "queue.svg": "test_queue_snapshots/test_queue_panel_snapshot[160x48].svg",
    "plots.svg": "test_plot_snapshots/test_plot_screen_snapshot[160x48].svg",
}


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_each_readme_picture_is_its_snapshot(copy: str):
    snapshot = SNAPSHOTS / COPIES[copy]
    assert snapshot.is_file(), f"{COPIES[copy]}: the snapshot is gone; pick another screen for docs/screens/{copy}"
    assert (ROOT / "docs" / "screens" / copy).read_bytes() == snapshot.read_bytes(), (
        f"docs/screens/{copy} differs from its snapshot: cp '{snapshot.relative_to(ROOT)}' docs/screens/{copy}")


def test_the_readme_shows_every_picture_and_only_those():
    shown = set(re.findall(r"!\[[^\]]*\]\(docs/screens/([^)]+)\)", (ROOT / "README.md").read_text()))
    assert shown == set(COPIES)
    assert {p.name for p in (ROOT / "docs" / "screens").iterdir()} == set(COPIES)
