"""Component configs and the pipeline's call defaults, read without importing torch or diffusers.

The forecast needs the request's real size before anything loads: `plan` with no size flags plans
for the size the pipeline would render, and a profile cached by `run` is keyed by that size too, so
the two meet. The size comes from the pipeline class's `__call__` defaults (read from the installed
diffusers source with `ast`: nothing is imported or run) and, where the default is `None` and the
pipeline computes it, the same arithmetic the pipeline does: `default_sample_size` (the denoiser's
config `sample_size`, else the literal the pipeline's `__init__` assigns) × the VAE's spatial factor.

Config files are untrusted input: read through `weights.load_json` (bounded, one-line errors), and
every value used is checked to be a plain positive number (anything else counts as absent).
"""

from __future__ import annotations

import ast
import functools
from typing import Any

from ..model_dir.discovery import ComponentInfo, ModelInfo
from ..model_dir.installed_source import SourceModule, class_statement, locate
from ..model_dir.roles import DENOISER_ROLES
from ..model_dir.weights import ModelDirError, load_json
from .request_profile import RequestSize

MAX_BASES = 6  # base classes followed to find an inherited `__call__`
CALL_FIELDS = {"height": "height", "width": "width", "num_frames": "frames",
               "max_sequence_length": "max_sequence_length", "guidance_scale": "guidance"}


def config_of(component: ComponentInfo | None) -> dict[str, Any]:
    """A component's `config.json` (empty when absent or unreadable: discovery reported it)."""
    if component is None:
        return {}
    path = component.folder / "config.json"
    try:
        return load_json(path) if path.is_file() else {}
    except ModelDirError:
        return {}


def pos_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 40 else None


def pos_num(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9
    return float(value) if ok else None


def denoiser(model: ModelInfo) -> ComponentInfo | None:
    """The (first) denoiser: the DiT or UNet whose config sizes the tokens."""
    found = [c for c in model.components if c.role in DENOISER_ROLES and c.has_weights]
    return found[0] if found else None


def vae(model: ModelInfo) -> ComponentInfo | None:
    found = [c for c in model.components if c.name == "vae"] or model.by_role("vae")
    return found[0] if found else None


def vae_spatial_factor(config: dict[str, Any]) -> int:
    """Pixels per latent along each side, as the pipelines compute it (8 when the config says nothing)."""
    channels = config.get("block_out_channels")
    if isinstance(channels, list) and 1 <= len(channels) <= 16 and "scale_factor_spatial" not in config:
        return 2 ** (len(channels) - 1)
    return pos_int(config.get("scale_factor_spatial")) or pos_int(config.get("spatial_compression_ratio")) or 8


def vae_temporal_factor(config: dict[str, Any]) -> int:
    """Frames per latent frame (1: an image VAE)."""
    return (pos_int(config.get("scale_factor_temporal")) or pos_int(config.get("temporal_compression_ratio"))
            or 1)


# ------------------------------------------------------------------------------------------ call defaults
def _class_chain(name: str) -> list[tuple[SourceModule, ast.ClassDef]]:
    package = locate("diffusers")
    found = class_statement(package, name, 0) if package else None
    chain: list[tuple[SourceModule, ast.ClassDef]] = []
    while found is not None and len(chain) < MAX_BASES and found[0].name.split(".")[0] == "diffusers":
        chain.append(found)
        module, cls = found
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        found = class_statement(module, bases[0], 0) if bases else None
    return chain


def _method(chain: list[tuple[SourceModule, ast.ClassDef]], name: str) -> ast.FunctionDef | None:
    for _, cls in chain:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
    return None


def _literal(node: ast.expr | None) -> object:
    try:
        return ast.literal_eval(node) if node is not None else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


@functools.lru_cache(maxsize=64)
def call_defaults(pipeline_class: str) -> dict[str, object]:
    """The literal defaults of the pipeline's `__call__` for the size fields, plus `default_sample_size`
    when its `__init__` assigns a literal (or a conditional with a literal fallback)."""
    if not pipeline_class.isidentifier():
        return {}
    try:
        chain = _class_chain(pipeline_class)
    except RecursionError:
        return {}
    out: dict[str, object] = {}
    call = _method(chain, "__call__")
    if call is not None:
        args = call.args.args + call.args.kwonlyargs
        defaults = [None] * (len(call.args.args) - len(call.args.defaults)) + list(call.args.defaults)
        defaults += list(call.args.kw_defaults)
        for arg, default in zip(args, defaults, strict=True):
            if arg.arg in CALL_FIELDS:
                out[arg.arg] = _literal(default)
    init = _method(chain, "__init__")
    for node in ast.walk(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "default_sample_size"):
            value = node.value.orelse if isinstance(node.value, ast.IfExp) else node.value
            out["default_sample_size"] = _literal(value)
    return out


@functools.lru_cache(maxsize=64)
def call_parameter_names(pipeline_class: str) -> frozenset[str] | None:
    """The named parameters of the pipeline's `__call__` (not `self`, not `*args`/`**kwargs`), read from the
    installed source like `call_defaults`; None: the class is no pipeline found there (following first bases
    to `DiffusionPipeline`), or has no `__call__`."""
    if not pipeline_class.isidentifier():
        return None
    try:
        chain = _class_chain(pipeline_class)
    except RecursionError:
        return None
    call = _method(chain, "__call__")
    if call is None or not any(cls.name == "DiffusionPipeline" for _, cls in chain):  # a pipeline's, nothing else
        return None
    names = {a.arg for a in call.args.posonlyargs + call.args.args + call.args.kwonlyargs}
    return frozenset(names - {"self"})


def default_size(model: ModelInfo) -> RequestSize:
    """The size the pipeline renders when the request leaves every size field out (None: not known)."""
    from ..demo.demo_model import DEMO_GENERATION, is_demo_model

    if is_demo_model(model.path):  # `run` sends the demo's own working defaults
        d = DEMO_GENERATION
        return RequestSize(height=pos_int(d["height"]), width=pos_int(d["width"]),
                           max_sequence_length=pos_int(d["max_sequence_length"]),
                           guidance=pos_num(d["guidance_scale"]))
    defaults = call_defaults(model.pipeline_class)
    height, width = pos_int(defaults.get("height")), pos_int(defaults.get("width"))
    if height is None or width is None:
        sample = pos_int(config_of(denoiser(model)).get("sample_size")) or pos_int(defaults.get("default_sample_size"))
        if sample is not None:  # a pixel-space model (DDPM: no VAE) renders its sample size itself
            found = vae(model)
            side = sample * (vae_spatial_factor(config_of(found)) if found is not None else 1)
            height, width = height or side, width or side
    frames = pos_int(defaults.get("num_frames")) if "num_frames" in defaults else None
    guidance = pos_num(defaults.get("guidance_scale")) if "guidance_scale" in defaults else guider_scale(model)
    return RequestSize(height=height, width=width, frames=frames,
                       max_sequence_length=pos_int(defaults.get("max_sequence_length")), guidance=guidance)


def guider_scale(model: ModelInfo) -> float | None:
    """The guidance scale of the model's `guider` component (HunyuanVideo 1.5, Motif Video: their call
    takes none; `running/guider_guidance.py`), from its guider_config.json (None: no guider or no scale)."""
    guider = next((c for c in model.components if c.name == "guider"), None)
    path = guider.folder / "guider_config.json" if guider is not None else None
    if path is None or not path.is_file():
        return None
    try:
        config = load_json(path)
    except ModelDirError:  # discovery reads it first and says why
        return None
    return pos_num(config.get("guidance_scale")) if isinstance(config, dict) else None


def fill_size(model: ModelInfo, size: RequestSize) -> RequestSize:
    """`size` with every field it leaves out taken from the pipeline's defaults (`default_size`)."""
    base = default_size(model)
    return RequestSize(**{k: v if v is not None else getattr(base, k) for k, v in size.model_dump().items()})
