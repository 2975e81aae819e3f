"""`--preview-decoder PATH`: a tiny autoencoder's decoder (TAESD, TAESDXL, TAESD3, TAEF1) for step previews
that look like the picture, where the latent→RGB factors only hint at it.

The file is untrusted input like any weights: only the path the operator named, a regular file, safetensors
only, its header length bounded before the project's reader parses it, its tensors read by `safetensors`
(never unpickled). The weights are diffusers' `AutoencoderTiny` layout (`decoder.layers.N...`, as in the
madebyollin/taesd* repositories' `diffusion_pytorch_model.safetensors`); the architecture is diffusers'
class, its latent channels read from the first decoder layer. Anything else is one `ConfigError` line
(exit 2, before anything loads). It decodes the step's latents as the pipeline holds them (scaled), which is
what these decoders take when they stand in for a pipeline's VAE.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..errors import ConfigError, ModelDirError
from ..model_dir.weights import header_length, read_header
from ..plain_text import plain

MAX_HEADER_BYTES = 1 << 20  # TAESD's whole file is ~10 MB with ~100 tensors: its header is a few kB
MAX_TENSORS = 1024
FIRST_LAYER = "decoder.layers.0.weight"
DECODER_SIDE = 32
"""Latent pixels a side the decoder is given at most (8x that in output pixels: more than a terminal shows)."""


class PreviewDecoderError(ConfigError):
    """A `--preview-decoder` file that cannot be used (one line naming the file)."""


@dataclass
class PreviewDecoder:
    """The decoder half of an `AutoencoderTiny`, on the CPU until the first step moves it to the device."""

    path: Path
    module: Any  # diffusers' DecoderTiny
    channels: int

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """(channels, h, w) latents -> (h*8, w*8, 3) uint8 on the latent's device."""
        if next(self.module.parameters()).device != latent.device:
            self.module.to(latent.device)
        with torch.no_grad():
            image = self.module(latent.unsqueeze(0).float())[0]  # [-1, 1]
        return ((image.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0)


def _tensors(path: Path, where: str) -> dict[str, torch.Tensor]:
    try:
        header_bytes = header_length(path)
    except ModelDirError as exc:
        raise PreviewDecoderError(f"--preview-decoder {where}: {exc}") from None
    except OSError as exc:
        raise PreviewDecoderError(f"--preview-decoder {where}: cannot read ({exc.strerror or exc})") from None
    if header_bytes is None:
        raise PreviewDecoderError(f"--preview-decoder {where}: not a safetensors file (shorter than its header length)")
    if header_bytes > MAX_HEADER_BYTES:
        raise PreviewDecoderError(f"--preview-decoder {where}: its safetensors header claims {header_bytes} bytes, "
                                  f"more than a tiny decoder's {MAX_HEADER_BYTES // 2**20} MiB")
    try:
        infos = read_header(path)
    except ModelDirError as exc:
        raise PreviewDecoderError(f"--preview-decoder {where}: {exc}") from None
    if len(infos) > MAX_TENSORS:
        raise PreviewDecoderError(f"--preview-decoder {where}: {len(infos)} tensors, not a tiny decoder")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys() if name.startswith("decoder.")}  # noqa: SIM118
    except (SafetensorError, OSError) as exc:
        raise PreviewDecoderError(f"--preview-decoder {where}: cannot read its tensors ({plain(exc)[:200]})") from None


def read_preview_decoder(path: str | Path) -> PreviewDecoder:
    """Check and build the decoder (raises `PreviewDecoderError`, a `ConfigError`: one line, exit 2)."""
    path = Path(path)
    where = plain(path)
    if path.suffix != ".safetensors":
        raise PreviewDecoderError(f"--preview-decoder {where}: not a .safetensors file (weights are read from "
                                  "safetensors only)")
    tensors = _tensors(path, where)
    first = tensors.get(FIRST_LAYER)
    if first is None or first.dim() != 4:
        raise PreviewDecoderError(f"--preview-decoder {where}: no {FIRST_LAYER} (not a TAESD/AutoencoderTiny "
                                  "decoder in diffusers' layout)")
    channels = int(first.shape[1])
    if not 1 <= channels <= 256:
        raise PreviewDecoderError(f"--preview-decoder {where}: {channels} latent channels is not a tiny decoder's")
    from diffusers import AutoencoderTiny

    module = AutoencoderTiny(latent_channels=channels).decoder.eval().requires_grad_(False)
    state = {name.removeprefix("decoder."): tensor for name, tensor in tensors.items()}
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PreviewDecoderError(f"--preview-decoder {where}: its weights do not fit AutoencoderTiny's decoder "
                                  f"({plain(first_line)[:200]})") from None
    if not all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point()):
        raise PreviewDecoderError(f"--preview-decoder {where}: holds non-finite values (NaN or inf)")
    return PreviewDecoder(path, module.float(), channels)
