"""A step preview's latent → RGB pixels, on the console's side (numpy; the engine sent the latent small).

The factors are the latent format's published linear map (one (R, G, B) row per channel, plus a bias,
engine/running/latent_rgb_table.py); the result is in [-1, 1] and mapped to 0..255 as the peers do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def latent_to_rgb(latent: np.ndarray, factors: Sequence[Sequence[float]], bias: Sequence[float]) -> np.ndarray:
    """(channels, h, w) float latent → (h, w, 3) uint8 RGB."""
    matrix = np.asarray(factors, dtype=np.float32)  # (channels, 3)
    if latent.ndim != 3 or matrix.shape != (latent.shape[0], 3):
        raise ValueError(f"latent {latent.shape} does not fit {matrix.shape[0]} rows of factors")
    rgb = np.einsum("chw,cr->hwr", latent.astype(np.float32, copy=False), matrix) + np.asarray(bias, np.float32)
    return (np.clip((rgb + 1.0) / 2.0, 0.0, 1.0) * 255.0).round().astype(np.uint8)
