"""omni-console: an operator console for layerwise-offloaded diffusion models."""

__version__ = "0.1.0"
