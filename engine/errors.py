"""The model-directory error, in a module of its own so every reader of the directory can raise it."""

from __future__ import annotations

from ..offload.errors import ConfigError


class ModelDirError(ConfigError):
    """A model directory, component folder or weight file the engine cannot use."""
