"""Several outputs written as one (`run --gpus N`'s images, one per seed): all or none, whatever stops it."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from omni_console.engine.running import atomic_write, group_write
from omni_console.engine.running.group_write import GroupOutput, write_results
from omni_console.engine.running.outputs import check_output
from omni_console.engine.running.signal_guard import completed_outputs, forget_outputs


def _image(value: int) -> Image.Image:
    return Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8))


def _outputs(folder, overwrite=False, frames=1):
    return [GroupOutput([_image(seed * 40 + k) for k in range(frames)],
                        check_output(folder / f"o-seed{seed}.png", overwrite=overwrite, frames=frames))
            for seed in range(3)]


def test_every_output_is_in_place_and_complete(tmp_path):
    forget_outputs()
    written = write_results(_outputs(tmp_path))
    assert written == [[tmp_path / f"o-seed{seed}.png"] for seed in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o-seed0.png", "o-seed1.png", "o-seed2.png"]
    assert Image.open(tmp_path / "o-seed2.png").getpixel((0, 0)) == (80, 80, 80)
    assert completed_outputs() == [p for paths in written for p in paths]  # the line names all of them


def test_a_stop_between_outputs_leaves_none_of_them(tmp_path, monkeypatch):
    """A signal while the second output is encoded (SignalGuard raises it there): the first, already
    encoded, is not left either, and no scratch folder is."""
    forget_outputs()

    def stop(moment: str) -> None:
        if moment == "between-outputs":
            raise KeyboardInterrupt

    monkeypatch.setattr(group_write, "pause_point", stop)
    with pytest.raises(KeyboardInterrupt):
        write_results(_outputs(tmp_path, frames=2))  # sequences: frames and manifests
    assert list(tmp_path.iterdir()) == [] and completed_outputs() == []


def test_a_failure_while_putting_them_in_place_removes_what_it_created(tmp_path, monkeypatch):
    """The third output's name taken between the check and its link: the two it had created go again;
    the user's file that took the name stays as it was."""
    forget_outputs()
    real = group_write.publish_all

    def publish(staged, paths, overwrite):
        if paths[0].name == "o-seed2.png":
            paths[0].write_bytes(b"the user's")
        return real(staged, paths, overwrite)

    monkeypatch.setattr(group_write, "publish_all", publish)
    with pytest.raises(Exception, match="appeared while generating"):
        write_results(_outputs(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o-seed2.png"]
    assert (tmp_path / "o-seed2.png").read_bytes() == b"the user's" and completed_outputs() == []
    assert not atomic_write._pending  # no scratch folder registered for removal is left
