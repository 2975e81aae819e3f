"""Errors an operator can fix: bad flags, bad model directory, a request the model cannot run.

Every such error carries one clear line naming the file, flag or key and the problem; the command
line prints that line and exits 2, without a traceback.
"""

from __future__ import annotations

from ..offload.errors import PolicyError


class ConfigError(ValueError):
    """Bad input the operator can fix (model directory, flags, request)."""


class ModelDirError(ConfigError):
    """A model directory, component folder or weight file the engine cannot use."""


OPERATOR_ERRORS: tuple[type[ValueError], ...] = (ConfigError, PolicyError)
"""What the command line reports as one line and exit 2: these, and an offload policy's errors."""


class OutputError(ConfigError):
    """A finished call whose output cannot be written truly (nothing returned, an all-NaN or all-black
    decode): one line after load, exit 1, and no file kept."""
