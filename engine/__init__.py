"""omni_console.engine: discovery, policy resolution, loading and running models (never Textual)."""

from .offline import enforce_offline

enforce_offline()
