"""`run`'s request flags → a checked request and output target, before anything loads.

Two stages, because some checks need the model and some do not: `parse_option_flags` reads what the
flags alone decide (`--param KEY=VALUE` syntax, `--fps`), before the model is even looked for;
`checked_request` then has the request service's checks (`engine/service/checks.py`) check the request
against the discovered pipeline and the output against what the result will be, still before any
weight loads. The messages name the flags as typed.
"""

from __future__ import annotations

from pathlib import Path

from ..engine.api import GenerateRequest, ModelInfo, service
from .run_flags import OptionFlags

__all__ = ["CALL_FLAGS", "REQUEST_FLAGS", "checked_request"]

REQUEST_FLAGS = {"steps": "--steps", "height": "--height", "width": "--width", "seed": "--seed",
                 "guidance": "--guidance"}
CALL_FLAGS = {**REQUEST_FLAGS, "frames": "--frames", "negative_prompt": "--negative-prompt",
              "max_sequence_length": "--max-sequence-length", "image": "--image", "param": "--param"}


def checked_request(model: ModelInfo, request: GenerateRequest, options: OptionFlags, output: Path, *,
                    overwrite: bool) -> service.CheckedRun:
    """Refuse (ConfigError, one line naming the flag) what this pipeline cannot run or the output cannot hold."""
    return service.check_run(model, request, output, overwrite=overwrite, fps=options.fps, names=CALL_FLAGS)
