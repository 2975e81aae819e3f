"""Read and check `--lora` files before anything loads: untrusted input, like a model directory.

A LoRA file is opened only at the path the operator named (a regular file, safetensors only: its header is
bounded and parsed by the project's reader, its tensors read by `safetensors`, never unpickled). Its keys are
converted by diffusers' own `lora_state_dict` of the pipeline's class (kohya / sd-scripts, PEFT/diffusers and
the Comfy-style names it accepts); no key mapping is written here. What diffusers refuses, a non-finite
value, a key whose module the model does not hold, or an A/B pair whose rank or shape does not fit that
module is one `ConfigError` line naming the file and the first bad key (exit 2 on the command line).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..errors import ConfigError, ModelDirError
from ..model_dir.discovery import ModelInfo
from ..model_dir.trusted_classes import pipeline_class
from ..model_dir.weights import header_length, read_header
from ..plain_text import plain
from ..planning.lora_cost import LoraModule

MAX_HEADER_BYTES = 16 * 2**20  # a rank-128 LoRA on every linear of a 12B DiT has a ~0.5 MiB header
MAX_LORA_TENSORS = 8192  # kohya SDXL with both text encoders: ~2,400; Flux on every linear: ~1,000
_LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_A.bias", ".lora_B.bias")


class LoraError(ConfigError):
    """A `--lora` file that cannot be applied to this model (one line: the file and the first bad key)."""


@dataclass(frozen=True)
class LoraFile:
    """One checked LoRA: its tensors as the file holds them (diffusers converts them again at load)."""

    path: Path
    scale: float
    tensors: dict[str, torch.Tensor]
    nbytes: int  # bytes of its tensors (what sidecar mode keeps on the device)
    components: tuple[str, ...]  # the pipeline components its converted keys apply to
    modules: tuple[LoraModule, ...] = ()  # each LoRA layer's module and A/B shapes (the plan's bytes and FLOPs)

    @property
    def name(self) -> str:
        return self.path.name


def check_loras(model: ModelInfo, loras: tuple[tuple[str, float], ...]) -> list[LoraFile]:
    """Every `(path, scale)` read and checked against `model`, in order; raises `LoraError` on the first bad one."""
    return [check_lora(model, Path(path), scale) for path, scale in loras]


def check_lora(model: ModelInfo, path: Path, scale: float) -> LoraFile:
    where = plain(path)
    if path.suffix != ".safetensors":
        raise LoraError(f"--lora {where}: not a .safetensors file (LoRAs are read from safetensors only)")
    tensors = _read_tensors(path, where)
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise LoraError(f"--lora {where}: tensor {plain(name)[:120]} holds non-finite values (NaN or inf)")
    converted = _converted(model, dict(tensors), where)
    modules = _check_modules(model, converted, where)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    components = tuple(dict.fromkeys(m.component for m in modules))
    return LoraFile(path, scale, tensors, nbytes, components, modules)


def _read_tensors(path: Path, where: str) -> dict[str, torch.Tensor]:
    """The file's tensors, after a bounded look at its header (length first, then the project's reader)."""
    try:
        header_bytes = header_length(path)
    except ModelDirError as exc:
        raise LoraError(f"--lora {where}: {_after_path(str(exc))}") from None
    except OSError as exc:
        raise LoraError(f"--lora {where}: cannot read ({exc.strerror or exc})") from None
    if header_bytes is None:
        raise LoraError(f"--lora {where}: not a safetensors file (shorter than its header length)")
    if header_bytes > MAX_HEADER_BYTES:
        raise LoraError(f"--lora {where}: its safetensors header claims {header_bytes} bytes, more than the "
                        f"{MAX_HEADER_BYTES // 2**20} MiB a LoRA's needs (not a LoRA file)")
    try:
        infos = read_header(path)
    except ModelDirError as exc:
        raise LoraError(f"--lora {where}: {_after_path(str(exc))}") from None
    if len(infos) > MAX_LORA_TENSORS:
        raise LoraError(f"--lora {where}: {len(infos)} tensors, more than the {MAX_LORA_TENSORS} a LoRA holds "
                        "(kohya SDXL with both text encoders: about 2,400)")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError) as exc:
        raise LoraError(f"--lora {where}: cannot read its tensors ({plain(exc)[:200]})") from None


def _after_path(message: str) -> str:
    """A reader's line without the path it starts with (the LoRA line names the file once)."""
    head, sep, rest = message.partition(": ")
    return rest if sep else message


def _converted(model: ModelInfo, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """The keys as the pipeline class's own `lora_state_dict` converts them (prefixed by component)."""
    cls = pipeline_class(model.pipeline_class, str(model.path / "model_index.json"))
    loader = getattr(cls, "lora_state_dict", None)
    if loader is None:
        raise LoraError(f"--lora {where}: {model.pipeline_class} loads no LoRA in diffusers")
    try:
        out: Any = loader(tensors)
    except Exception as exc:  # diffusers' converters raise ValueError, KeyError, IndexError, RuntimeError alike
        from .loader import first_line

        raise LoraError(f"--lora {where}: diffusers refuses it ({plain(first_line(exc))})") from None
    state = out[0] if isinstance(out, tuple) else out
    if not isinstance(state, dict) or not state:
        raise LoraError(f"--lora {where}: diffusers finds no LoRA weights in it")
    return state


def _check_modules(model: ModelInfo, state: dict[str, torch.Tensor], where: str) -> tuple[LoraModule, ...]:
    """Each converted key names a module of a component with weights, and each A/B pair fits that module;
    returns every LoRA layer found."""
    from diffusers.utils import convert_unet_state_dict_to_peft

    components = {info.name: info for info in model.components if info.files}
    by_component: dict[str, dict[str, torch.Tensor]] = {}
    modules: list[LoraModule] = []
    for key, value in state.items():
        prefix, _, rest = key.partition(".")
        if prefix not in components or not rest:
            raise LoraError(f"--lora {where}: key {plain(key)[:120]} names no component of this "
                            f"{model.pipeline_class} (it is a LoRA for another model)")
        by_component.setdefault(prefix, {})[rest] = value
    for name, keys in by_component.items():
        if not any("lora_A" in k for k in keys):
            keys = convert_unet_state_dict_to_peft(keys)  # as diffusers' load_lora_adapter converts them
        shapes = {t.name: t.shape for f in components[name].files for t in read_header(f)}
        modules.extend(_check_pairs(name, keys, shapes, where))
    return tuple(modules)


def _check_pairs(component: str, keys: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]],
                 where: str) -> list[LoraModule]:
    found: list[LoraModule] = []
    for key, a in keys.items():
        module = next((key[: -len(s)] for s in _LORA_SUFFIXES if key.endswith(s)), None)
        shown = plain(f"{component}.{key}")[:160]
        if module is None:
            raise LoraError(f"--lora {where}: key {shown} is not a LoRA A/B weight diffusers applies")
        base = shapes.get(f"{module}.weight")
        if base is None or len(base) < 2:
            raise LoraError(f"--lora {where}: key {shown} matches no linear or conv module of {component}")
        if not key.endswith(".lora_A.weight"):
            continue
        b = keys.get(f"{module}.lora_B.weight")
        if b is None:
            raise LoraError(f"--lora {where}: key {shown} has no lora_B beside it")
        if a.ndim != len(base) or b.ndim != len(base) or a.shape[0] != b.shape[1] or a.shape[1] != base[1] \
                or b.shape[0] != base[0]:
            raise LoraError(f"--lora {where}: key {shown}: A {tuple(a.shape)} and B {tuple(b.shape)} do not fit "
                            f"{component}.{plain(module)} of shape {tuple(base)} (rank or shape mismatch)")
        found.append(LoraModule(component, module, int(a.shape[0]), int(a[0].numel()), int(b.shape[0])))
    return found
