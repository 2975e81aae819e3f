"""`--lora` in the plan's documents and in vLLM-Omni's spelling, or what vLLM-Omni cannot express.

vLLM-Omni (its LoRA guide, stable docs) takes a LoRA as a PEFT adapter *folder* (`adapter_config.json` +
`adapter_model.safetensors`): preloaded with `Omni(model=..., lora_path=...)`, activated per request by a
`LoRARequest(lora_name, lora_int_id, lora_path)` with one external `lora_scale`; one adapter is active per
request, and under its layerwise offload the A/B are kept resident (a sidecar, never merged).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from .documents import LoraDoc, LoraFileDoc
from .lora_cost import LoraModes


def vllm_lora(loras: Sequence[Any], chosen: str) -> tuple[str, list[str]]:
    """(the Python call's LoRA arguments, the gaps) for checked LoRA files (`path`, `scale`)."""
    if not loras:
        return "", []
    first = loras[0]
    folder = str(first.path.parent)
    text = (f"Omni(..., lora_path={shlex.quote(folder)}); per request: LoRARequest(lora_name='lora0', "
            f"lora_int_id=1, lora_path={shlex.quote(folder)}) with lora_scale={first.scale:g}")
    gaps = [f"vLLM-Omni reads a PEFT adapter folder (adapter_config.json + adapter_model.safetensors), not the "
            f"single file {first.path.name}: its folder is named, the file must be saved there as a PEFT adapter"]
    if len(loras) > 1:
        gaps.append(f"{len(loras)} LoRAs at once: vLLM-Omni activates one adapter per request (only the first is "
                    "named)")
    if chosen == "merge":
        gaps.append("merge on upload has no vLLM-Omni spelling: its layerwise offload keeps A/B resident (sidecar)")
    return text, gaps


def lora_file_docs(loras: Sequence[Any], mode: str) -> list[LoraFileDoc]:
    return [LoraFileDoc(path=str(f.path), bytes=f.nbytes, scale=f.scale, components=list(f.components), mode=mode)
            for f in loras]


def lora_doc(loras: Sequence[Any], modes: LoraModes, mode: str) -> LoraDoc:
    """The plan document's `lora` object."""
    text, gaps = vllm_lora(loras, modes.chosen)
    return LoraDoc(mode=mode, chosen=modes.chosen, why=modes.why,  # type: ignore[arg-type]
                   device_bytes=modes.device_bytes(modes.chosen), ab_bytes=modes.ab_bytes,
                   merge_scratch_bytes=modes.merge_scratch_bytes, sidecar_flops_per_step=modes.sidecar_flops,
                   merge_flops_per_step=modes.merge_flops, sidecar_seconds_per_step=modes.sidecar_s,
                   merge_seconds_per_step=modes.merge_s, vllm_omni=text, vllm_omni_gaps=gaps)
