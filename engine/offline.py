"""Run-time guard: the engine never touches the network and never runs remote code.

Imported by `omni_console.engine` before diffusers/transformers are, so every hub client sees
offline mode; loads also pass `local_files_only=True` explicitly.
"""

from __future__ import annotations

import os

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DISABLE_TELEMETRY": "1",
    # transformers warns about optional image backends (torchvision) on import; not ours to show.
    "TRANSFORMERS_VERBOSITY": "error",
}


def enforce_offline() -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
