"""No partial, empty or temporary file is left after a signal while an output is written.

`run` writes in its main thread: SIGTERM / SIGHUP there become exceptions, the temporary file is
removed, the process exits 143 / 129 and `--output` does not exist (so the next run is not refused
for "exists"), or, with --overwrite, still holds the old file. The console writes on the engine
thread and ends with `os._exit` after `q` or SIGTERM: `exit_now` removes what is being written, and
nothing incomplete ever stands under a final name.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from PIL import Image

from omni_console.console import outputs as console_outputs
from omni_console.engine.running.atomic_write import remove_pending
from omni_console.engine.running.outputs import check_output, write_result

CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from omni_console.engine.running.outputs import check_output, write_result

    signum, out, overwrite = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"

    class Image:  # a large image: half of it is written when the signal comes
        def convert(self, mode):
            return self

        def save(self, stream, format):
            stream.write(b"\\x89PNG" + b"x" * (1 << 20))
            os.kill(os.getpid(), signum)
            stream.write(b"y" * (1 << 20))

    write_result([Image()], check_output(out, overwrite=overwrite), fps=None)
    print("finished")
""")


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["term", "hup"])
@pytest.mark.parametrize("overwrite", [False, True], ids=["new", "overwrite"])
def test_a_signal_during_runs_write_leaves_no_file(tmp_path: Path, signum: int, code: int, overwrite: bool):
    out = tmp_path / "out.png"
    if overwrite:
        out.write_bytes(b"the operator's earlier image")
    before = _listing(tmp_path)
    done = subprocess.run([sys.executable, "-c", CHILD, str(int(signum)), str(out), "1" if overwrite else "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert "finished" not in done.stdout and "Traceback" not in done.stderr
    assert _listing(tmp_path) == before  # no .out.png.XXXX.tmp, no empty out.png
    if overwrite:
        assert out.read_bytes() == b"the operator's earlier image"


def test_an_output_is_complete_or_absent_and_never_replaces_a_new_file(tmp_path: Path):
    out = tmp_path / "o.png"
    target = check_output(out)
    out.write_bytes(b"appeared meanwhile")
    with pytest.raises(Exception, match="appeared while generating"):
        write_result([Image.new("RGB", (8, 8))], target, fps=None)
    assert out.read_bytes() == b"appeared meanwhile" and _listing(tmp_path) == ["o.png"]
    out.unlink()
    write_result([Image.new("RGB", (8, 8))], target, fps=None)
    assert Image.open(out).size == (8, 8) and _listing(tmp_path) == ["o.png"]


def test_the_console_never_shows_a_half_written_image_and_cleans_up_at_exit(tmp_path: Path):
    """`q` while a large PNG is saved on the engine thread: the app's exit removes the temporary file."""
    halfway, release = threading.Event(), threading.Event()

    class SlowImage:
        def save(self, stream, format):
            stream.write(b"\x89PNG" + b"x" * (1 << 20))
            halfway.set()
            release.wait(10)
            stream.write(b"y")

    errors: list[BaseException] = []

    def save() -> None:
        try:
            console_outputs.save_image(SlowImage(), tmp_path / "out", 1)
        except BaseException as exc:  # the temporary file vanished under it: the process is exiting
            errors.append(exc)

    saver = threading.Thread(target=save, daemon=True)
    saver.start()
    assert halfway.wait(10)
    assert [p for p in (tmp_path / "out").iterdir() if p.suffix == ".png"] == []  # nothing under a final name
    remove_pending()  # what exit_now does before os._exit
    assert _listing(tmp_path / "out") == []
    release.set()
    saver.join(10)
    assert [p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")] == []


EXIT_CHILD = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from omni_console.console.app_main import exit_now
    from omni_console.console.outputs import save_image

    out, halfway = Path(sys.argv[1]), threading.Event()

    class SlowImage:
        def save(self, stream, format):
            stream.write(b"x" * (1 << 20))
            halfway.set()
            threading.Event().wait(60)

    threading.Thread(target=lambda: save_image(SlowImage(), out, 1), daemon=True).start()
    halfway.wait(30)
    exit_now(143)  # what SIGTERM or q ends in, with the engine thread still writing
""")


def test_exit_now_leaves_nothing_of_an_image_being_written(tmp_path: Path):
    done = subprocess.run([sys.executable, "-c", EXIT_CHILD, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 143, done.stderr
    assert _listing(tmp_path / "out") == []


def test_two_saves_in_one_second_get_two_names(tmp_path: Path):
    first = console_outputs.save_image(Image.new("RGB", (4, 4)), tmp_path, 1, when=0.0)
    second = console_outputs.save_image(Image.new("RGB", (4, 4), "red"), tmp_path, 1, when=0.0)
    assert first != second and second.name.endswith("-2.png")
    assert _listing(tmp_path) == sorted([first.name, second.name])
