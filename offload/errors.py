"""Errors an operator can fix: bad input, bad policy, bad model directory.

Every such error carries one clear line naming the file or key and the problem; the command
line prints that line and exits 2, without a traceback.
"""


class ConfigError(ValueError):
    """Bad input the operator can fix (policy, model directory, flags)."""


class PolicyError(ConfigError):
    """An invalid `dlo_offload_components` / resident-layers / mode combination."""


class PolicyTypeError(PolicyError, TypeError):
    """A policy value of the wrong type (vLLM-Omni raises TypeError for these)."""
