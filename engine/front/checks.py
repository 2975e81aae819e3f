"""A request's rules, checked before any work: options, parameters, sizes, text length, output place.

One namespace of the engine's front door (`from omni_console.engine.api import checks`); names load lazily.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are this namespace's names, for type checkers)
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:  # the same names as `EXPORTS` (tests/engine/test_api.py holds them equal)
    from ..loading.lora_files import check_loras
    from ..ranks.rank_checks import check_cache_ranks
    from ..running.cache_spec import CacheSpec, parse_cache
    from ..running.call_options import (
        accepted_options,
        call_signature,
        check_call,
        check_shape,
        option_parameter,
    )
    from ..running.frame_counts import frames_rule
    from ..running.host_fit import check_fits_host
    from ..running.outputs import check_output, check_output_place
    from ..running.param_syntax import check_finite, check_parameter_names, parse_param
    from ..running.profiler import request_size
    from ..running.request_checks import SEED_MAX, check_request
    from ..running.request_limits import check_limits, schedule_steps
    from ..running.runner import total_steps_of
    from ..running.step_cache import check_cache_support, supported_kinds
    from ..running.text_length import check_text_length
    from ..running.trace_file import check_trace_place

EXPORTS: dict[str, tuple[str, ...]] = {
    "..running.host_fit": ("check_fits_host",),
    "..running.cache_spec": ("CacheSpec", "parse_cache"),  # --cache's text, torch-free
    "..running.step_cache": ("check_cache_support", "supported_kinds"),
    "..loading.lora_files": ("check_loras",),
    "..ranks.rank_checks": ("check_cache_ranks",),
    "..running.request_checks": ("SEED_MAX", "check_request"),
    "..running.call_options": (
        "accepted_options", "call_signature", "check_call", "check_shape", "option_parameter",
    ),
    "..running.frame_counts": ("frames_rule",),
    "..running.text_length": ("check_text_length",),
    "..running.trace_file": ("check_trace_place",),
    "..running.param_syntax": ("check_finite", "check_parameter_names", "parse_param"),
    "..running.request_limits": ("check_limits", "schedule_steps"),
    "..running.profiler": ("request_size",),
    "..running.runner": ("total_steps_of",),
    "..running.outputs": ("check_output", "check_output_place"),
}
"""Each name's module (relative to this package)."""

__getattr__, __dir__, __all__ = lazy_names(__name__, __package__, EXPORTS)
