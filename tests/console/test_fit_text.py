"""Text fitted to a width: long words lose their middle, nothing is folded inside a word."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from omni_console.console.fit_text import fit_words, middle_ellipsis, one_line
from omni_console.console.toasts import toast_text

PATH = "/home/operator/renders/omni-console-out/request-0007-20260101-120000.png"


def test_a_path_keeps_its_start_and_its_file_name():
    assert middle_ellipsis(PATH, 50) == "/home/operator/r…/request-0007-20260101-120000.png"
    assert len(middle_ellipsis(PATH, 50)) == 50
    assert middle_ellipsis(PATH, 20) == "/home/oper…20000.png"  # the file name alone is too long: the middle goes
    assert middle_ellipsis("short", 10) == "short"


@given(st.text(alphabet="ab/-. ", min_size=0, max_size=200), st.integers(min_value=2, max_value=120))
def test_no_word_is_wider_than_the_line(text: str, width: int):
    fitted = fit_words(text, width)
    assert all(len(word) <= width for line in fitted.split("\n") for word in line.split(" "))
    assert len(fitted.split(" ")) == len(text.split(" "))  # the same words, only the long ones shortened


@given(st.text(min_size=0, max_size=300), st.integers(min_value=12, max_value=200))
def test_one_line_fits(text: str, width: int):
    line = one_line(text, width)
    assert "\n" not in line and len(line) <= width


def test_a_notice_is_one_line_only_on_a_narrow_terminal():
    notice = f"saved {PATH}"
    assert toast_text(notice, 160) == notice
    short = toast_text(notice, 80)
    assert len(short) <= 74 and short.startswith("saved /home/operator/") and short.endswith(
        "…/request-0007-20260101-120000.png")
