"""`plan`'s request, checked as `run` checks it: the same defaults, the same refusals, the same line.

`plan` forecasts a request; were it to forecast one that `run` then refuses (CogVideoX's default text
of 226 tokens where its transformer takes 16), its figures would describe nothing. With any request
flag given, `plan` runs `run`'s own checks (the service's `check_model_request`: the pipeline's call
signature, which imports torch and diffusers). With none, it stays torch-free: the defaults it
forecasts are read from the installed source (`default_size`), and the checks a default request can
fail that need no import (the DiT's fixed text length) run on them, with `run`'s line.
"""

from __future__ import annotations

from ..engine.api import ModelInfo, RequestSize, checks, planner

TEXT_FLAG = "--max-sequence-length"  # as `run` names it (the service's checks.CALL_NAMES)


def check_plan_request(model: ModelInfo, size: RequestSize) -> None:
    """Refuse (ConfigError, one line naming the flag) the request `plan` was asked to forecast, where
    `run` with the same flags would refuse it before load."""
    if any(v is not None for v in size.model_dump().values()):
        from ..engine.api import GenerateRequest, service

        service.check_model_request(model, GenerateRequest(prompt="", height=size.height, width=size.width,
                                                           frames=size.frames,
                                                           max_sequence_length=size.max_sequence_length,
                                                           guidance=size.guidance))
        return
    checks.check_text_length(model, None, planner.default_size(model).max_sequence_length, TEXT_FLAG)
