"""Where omni-console keeps what it can rebuild (the demo model, request profiles).

Its own module without torch, so `plan` can find a cached profile without importing it.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "OMNI_CONSOLE_CACHE_DIR"


def cache_root() -> Path:
    """Root of omni-console's cache: ``$OMNI_CONSOLE_CACHE_DIR`` or the platform user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("omni-console", appauthor=False))
