"""A class whose optional package is missing is refused naming that package, never with an empty reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_console.engine.errors import ModelDirError
from omni_console.engine.model_dir.missing_backends import error_reason
from omni_console.engine.model_dir.trusted_classes import pipeline_class


def test_consisid_without_opencv_is_refused_naming_opencv():
    from diffusers.utils import is_opencv_available

    if is_opencv_available():
        pytest.skip("OpenCV is installed: ConsisID is a real class here")
    with pytest.raises(ModelDirError) as refused:
        pipeline_class("ConsisIDPipeline", "model_index.json")
    line = str(refused.value)
    assert "\n" not in line
    assert "ConsisIDPipeline needs OpenCV (pip install opencv-python)" in line


def test_a_message_starting_with_a_blank_line_gives_its_first_words():
    exc = ImportError("\nFooPipeline requires the OpenCV library but it was not found.\nInstall it.")
    assert error_reason(exc) == "FooPipeline requires the OpenCV library but it was not found."


@given(st.text(alphabet=" \n\t\r", max_size=20))
def test_an_empty_message_gives_the_error_type(message: str):
    assert error_reason(ImportError(message)) == "ImportError"
