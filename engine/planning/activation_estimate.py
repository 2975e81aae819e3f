"""Activations of each phase of a request, estimated from the configs before any profile exists.

A first request has no measured profile, so without this the forecast knows only weights (a Wan-14B
request forecast at 2.6 GB peaked at 11.9 GB). Each phase's peak above the weights is estimated from
the components' configs and the request size, the way the phase's largest live tensors scale:

- text encoding: per encoder, batch 1 (pipelines encode the prompt and the negative prompt one at a
  time), `L` tokens (T5-like encoders: the request's max sequence length; CLIP: its position table):
  `L x (4 d + 3 ff) x elt` for hidden states and the gated feed-forward, plus for T5-like encoders,
  whose attention adds a position bias and so runs in eager mode, `heads x L^2 x C_attn x elt`;
- denoise: the DiT's sequence `N` (latent frames x latent pixels / patch; with joint attention the
  text tokens too) x hidden size x the batch (2 where the pipeline batches classifier-free guidance)
  x `units` of the block's live tensors (SDPA keeps no N^2 matrix on CUDA); `units` is per class
  where a GPU run measured it, else `6 + 2 ff / d`; a UNet: `UNET_UNITS` x the batch x latent pixels x
  its first block's channels (the skip connections it keeps and the widest stage's work);
- VAE decode: the decoder's largest activation (channels x pixels x frames decoded at once, from its
  up path) x `C_vae` live copies of it; a VAE that decodes a chunk of frames at a time (Wan: one
  latent frame) adds the video it accumulates, twice (the output and the copy that appends to it).

The constants (`TEXT_ATTENTION`, `DENOISE_UNITS`, `DECODE_COPIES`) are calibrated against the phase
peaks the GPU runs recorded (docs/ and benchmarks/results/); tests/engine/test_estimate_calibration.py
holds each within 10 % of its recorded figure. Every figure here is labelled "estimated from config".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..model_dir.discovery import ComponentInfo, ModelInfo
from ..model_dir.weights import DTYPES
from .model_configs import config_of, denoiser, pos_int, pos_num, vae, vae_spatial_factor, vae_temporal_factor
from .request_profile import RequestSize

BASIS = "estimated from config"
TEXT_ATTENTION = {"T5EncoderModel": 7.0, "UMT5EncoderModel": 9.5, "MT5EncoderModel": 7.0}  # x elt per score
DENOISE_UNITS = {"FluxTransformer2DModel": 18.5, "WanTransformer3DModel": 11.2}  # x N x d x elt
UNET_UNITS = 22.0  # x batch x latent pixels x block_out_channels[0] x elt (SDXL-size at 1024², batch 2)
DECODE_COPIES = {"AutoencoderKL": 4.8, "AutoencoderKLWan": 7.2}
DEFAULT_DECODE_COPIES = 4.8
# Joint attention: text tokens run through the blocks with the image tokens (the others cross-attend)
JOINT_CLASSES = frozenset({"FluxTransformer2DModel", "SD3Transformer2DModel", "HunyuanVideoTransformer3DModel",
                           "MochiTransformer3DModel", "CogVideoXTransformer3DModel", "ChromaTransformer2DModel",
                           "AuraFlowTransformer2DModel", "HiDreamImageTransformer2DModel"})
# Pipelines that run classifier-free guidance as two forwards of batch 1 (else: one of batch 2)
# (a guider runs each of its conditions as its own forward: HunyuanVideo 1.5, HunyuanImage, Motif Video)
SEPARATE_CFG = ("Wan", "Flux", "Chroma", "HunyuanVideo", "QwenImage", "HunyuanImage", "MotifVideo")
NO_CFG = ("Flux", "HunyuanVideoPipeline")  # guidance distilled into the model: one forward of batch 1
CLIP_TOKENS = 77


@dataclass(frozen=True, slots=True)
class Geometry:
    """The denoiser's sequence at one request size."""

    image_tokens: int
    text_tokens: int
    hidden: int
    heads: int
    ffn: int
    joint: bool
    batch: int  # per forward (2 when guidance is batched)
    forwards_per_step: int

    @property
    def sequence(self) -> int:
        return self.image_tokens + (self.text_tokens if self.joint else 0)


@dataclass(frozen=True, slots=True)
class PhaseEstimate:
    """Bytes above the weights in each phase (None: not estimated), and what each rests on."""

    text_extra: int | None
    denoise_extra: int | None
    decode_extra: int | None
    geometry: Geometry | None
    size: RequestSize
    basis: str = BASIS
    notes: list[str] = field(default_factory=list)


ITEM_BYTES = dict(DTYPES.values())  # torch's dtype names (what discovery records) -> bytes per element


def elt_bytes(component: ComponentInfo | None) -> int:
    """Bytes per activation element: 4 for a float32 component, else 2 (fp8 storage computes in bf16).
    A component's dtypes are torch's names ("float32"), as discovery reads them from the headers."""
    if component is None or not component.dtypes:
        return 2
    return 4 if ITEM_BYTES.get(component.dtypes[0], 2) >= 4 else 2


def _patch(config: dict[str, Any]) -> tuple[int, int, int]:
    p = config.get("patch_size")
    if isinstance(p, list) and len(p) == 3 and all(pos_int(x) for x in p):
        return int(p[0]), int(p[1]), int(p[2])
    side = pos_int(p) or 1
    return pos_int(config.get("patch_size_t")) or 1, side, side


def uses_cfg(pipeline: str, guidance: float | None) -> str:
    """"none", "batch" (one forward of batch 2) or "separate" (two forwards) for this guidance."""
    if guidance is None or guidance <= 1.0 or pipeline.startswith(NO_CFG):
        return "none"
    return "separate" if pipeline.startswith(SEPARATE_CFG) else "batch"


def geometry(model: ModelInfo, size: RequestSize) -> Geometry | None:
    """Tokens, widths and batch of the denoiser at `size` (None when the size or the config is unknown)."""
    dit = denoiser(model)
    if dit is None or dit.role != "dit" or not (size.height and size.width):
        return None
    cfg, vcfg = config_of(dit), config_of(vae(model))
    heads = pos_int(cfg.get("num_attention_heads"))
    head_dim = pos_int(cfg.get("attention_head_dim"))
    if heads is None or head_dim is None:
        return None
    hidden = heads * head_dim
    spatial, temporal = vae_spatial_factor(vcfg), vae_temporal_factor(vcfg)
    pt, ph, pw = _patch(cfg)
    latent_ch = pos_int(vcfg.get("latent_channels")) or pos_int(vcfg.get("z_dim"))
    if ph == 1 and latent_ch and pos_int(cfg.get("in_channels")) == 4 * latent_ch:  # latents packed 2x2 (Flux)
        ph = pw = 2
    frames = size.frames or 1
    latent_frames = (frames - 1) // temporal + 1 if temporal > 1 else frames
    image = -(-latent_frames // pt) * (size.height // spatial // ph) * (size.width // spatial // pw)
    ffn = pos_int(cfg.get("ffn_dim")) or int(hidden * (pos_num(cfg.get("mlp_ratio")) or 4.0))
    text = size.max_sequence_length or 512
    if dit.class_name == "SD3Transformer2DModel":
        text += CLIP_TOKENS
    mode = uses_cfg(model.pipeline_class, size.guidance)
    return Geometry(image_tokens=max(image, 1), text_tokens=text, hidden=hidden, heads=heads, ffn=ffn,
                    joint=dit.class_name in JOINT_CLASSES, batch=2 if mode == "batch" else 1,
                    forwards_per_step=2 if mode == "separate" else 1)


def denoise_extra(class_name: str | None, geo: Geometry, elt: int) -> int:
    units = DENOISE_UNITS.get(class_name or "", 6.0 + 2.0 * geo.ffn / geo.hidden)
    return int(units * geo.batch * geo.sequence * geo.hidden * elt)


def unet_extra(model: ModelInfo, unet: ComponentInfo, size: RequestSize) -> int | None:
    """A UNet's denoise activations (see the module docstring); None when its config says too little."""
    channels = config_of(unet).get("block_out_channels")
    first = pos_int(channels[0]) if isinstance(channels, list) and channels else None
    if first is None or not (size.height and size.width):
        return None
    factor = vae_spatial_factor(config_of(vae(model)))
    batch = 2 if uses_cfg(model.pipeline_class, size.guidance) == "batch" else 1
    latent = (size.height // factor) * (size.width // factor) * (size.frames or 1)
    return int(UNET_UNITS * batch * latent * first * elt_bytes(unet))


def text_extra(class_name: str | None, config: dict[str, Any], tokens: int, elt: int) -> int | None:
    """One encoder's activations at `tokens` tokens, batch 1 (None: its config names no widths)."""
    d = pos_int(config.get("d_model")) or pos_int(config.get("hidden_size"))
    if d is None:
        return None
    ff = pos_int(config.get("d_ff")) or pos_int(config.get("intermediate_size")) or 4 * d
    heads = pos_int(config.get("num_heads")) or pos_int(config.get("num_attention_heads")) or 1
    hidden = tokens * (4 * d + 3 * ff) * elt
    attention = TEXT_ATTENTION.get(class_name or "", 0.0) * heads * tokens * tokens * elt
    return int(hidden + attention)


def encoder_tokens(component: ComponentInfo, config: dict[str, Any], size: RequestSize) -> int:
    if (component.class_name or "").startswith("CLIP"):
        return min(pos_int(config.get("max_position_embeddings")) or CLIP_TOKENS, CLIP_TOKENS)
    return size.max_sequence_length or pos_int(config.get("n_positions")) or 512


def largest_decoder_activation(class_name: str | None, config: dict[str, Any], size: RequestSize) -> int | None:
    """Elements of the VAE decoder's largest activation (channels x pixels x frames decoded at once)."""
    if not (size.height and size.width):
        return None
    if class_name == "AutoencoderKLWan" and not config.get("is_residual"):
        base, mult = pos_int(config.get("base_dim")) or 96, config.get("dim_mult") or [1, 2, 4, 4]
        if not (isinstance(mult, list) and 1 <= len(mult) <= 8 and all(pos_int(m) for m in mult)):
            return None
        dims = [base * m for m in [mult[-1], *mult[::-1]]]
        ups = len(mult) - 1  # upsampled stages; one latent frame decodes to `temporal` frames at a time
        out = max(dims[i + 1] * (size.height >> (ups - i - 1)) * (size.width >> (ups - i - 1))
                  for i in range(ups))
        return out * vae_temporal_factor(config)
    channels = config.get("block_out_channels")
    if not (isinstance(channels, list) and 1 <= len(channels) <= 16 and all(pos_int(c) for c in channels)):
        return None
    rev, n = channels[::-1], len(channels)
    # each up block but the last ends in an upsampler that doubles the side at the block's channels
    largest = max(rev[i] * (size.height >> (n - 2 - i)) * (size.width >> (n - 2 - i)) for i in range(n - 1)) \
        if n > 1 else rev[0] * size.height * size.width
    return largest * (size.frames or 1)


def decode_extra(class_name: str | None, config: dict[str, Any], size: RequestSize, elt: int) -> int | None:
    """The VAE decode's bytes above the weights at `size` (None: the config says too little)."""
    largest = largest_decoder_activation(class_name, config, size)
    if largest is None or not (size.height and size.width):
        return None
    extra = DECODE_COPIES.get(class_name or "", DEFAULT_DECODE_COPIES) * largest
    if class_name == "AutoencoderKLWan":  # chunk by chunk: the decoded video grows by concatenation
        extra += 2 * (size.frames or 1) * (pos_int(config.get("out_channels")) or 3) * size.height * size.width
    return int(extra * elt)


def estimate_phases(model: ModelInfo, size: RequestSize) -> PhaseEstimate:
    """Each phase's bytes above the weights at `size` (a size with every field filled: see
    `model_configs.fill_size`). A phase whose configs say too little is None, with a note."""
    notes: list[str] = []
    texts = []
    for c in model.components:
        if c.role == "encoder" and c.has_weights:
            cfg = config_of(c)
            t = text_extra(c.class_name, cfg, encoder_tokens(c, cfg, size), elt_bytes(c))
            if t is not None:
                texts.append(t)
    text = max(texts) if texts else None
    geo = geometry(model, size)
    dit = denoiser(model)
    denoise = denoise_extra(dit.class_name, geo, elt_bytes(dit)) if geo is not None and dit is not None else None
    if dit is not None and dit.role == "unet":
        denoise = unet_extra(model, dit, size)
    if denoise is None:
        notes.append("denoise activations: not estimated (the request size or the denoiser's config is unknown)")
    v = vae(model)
    decode = decode_extra(v.class_name, config_of(v), size, elt_bytes(v)) if v is not None else None
    if v is not None and decode is None:
        notes.append("VAE decode activations: not estimated (the request size or the VAE's config is unknown)")
    return PhaseEstimate(text, denoise, decode, geo, size, notes=notes)
