"""Check a rank layout against this machine and the model, before anything loads.

rank_layout.py checks the flags and counts the devices of a device type; here `--device` (or its
default) picks that type, and the pipeline's call says whether there is an unconditional branch to
give a second rank. Each refusal is a `ConfigError`: one line, exit 2.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..planning.experts import expert_spans
from .rank_layout import RankLayout, check_layout_device


def check_rank_devices(layout: RankLayout, device: str | None) -> None:
    """One GPU per rank on CUDA; on a CPU each rank is a process (gloo), at most one per core.

    `device` is `--device` as given (None: cuda when CUDA is available, else cpu)."""
    if not layout.distributed:
        return
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_layout_device(layout, "cuda" if device.startswith("cuda") else "cpu")


def has_unconditional_branch(pipeline_class_name: str) -> bool:
    """The pipeline's call takes a negative prompt: the unconditional (negative) branch CFG runs.

    `guidance_scale` alone does not say so: Flux-dev-style pipelines (FluxFill, FluxControl) take a
    guidance scale that is embedded into the DiT's conditioning, one forward per step, no second branch."""
    from ..running.call_options import call_signature

    return "negative_prompt" in call_signature(pipeline_class_name)


def check_parallel(layout: RankLayout, pipeline_class_name: str | None) -> None:
    """`--parallel cfg` needs a second (unconditional) branch to give the second rank."""
    if layout.parallel != "cfg" or not layout.distributed:
        return
    if pipeline_class_name is None or not has_unconditional_branch(pipeline_class_name):
        raise ConfigError(f"--parallel cfg: {pipeline_class_name or 'this pipeline'} has no unconditional branch "
                          f"(its call takes no negative prompt; guidance, if any, is embedded): use --parallel dp")


def check_experts(layout: RankLayout, model: ModelInfo) -> None:
    """Two experts (Wan 2.2 A14B) hand their blocks over from whole pinned masters; an AllGather rank keeps
    only shards, so that layout is refused (each rank streaming whole blocks, `--dlo-no-use-allgather`, works)."""
    if layout.sharded and expert_spans(model):
        raise ConfigError("two experts (transformer, transformer_2) are not sharded across GPUs yet: "
                          "use --dlo-no-use-allgather (every rank streams whole blocks) or one GPU")


def check_cache_ranks(layout: RankLayout, cache: object | None) -> None:
    """`--cache` with `--gpus N > 1` where the output could not match one GPU's with the same cache, refused in
    one line saying why. Data-parallel rank-local ranks each run the whole pipeline on their own request, their
    own cache deciding on their own inputs, as one GPU would: taken."""
    if cache is None or not layout.distributed:
        return
    if layout.parallel == "cfg":
        raise ConfigError("--cache with --parallel cfg: a rank computes the other guidance branch under the first "
                          "branch's cache context, so diffusers' per-branch cache state would not be one GPU's; "
                          "use --parallel dp --dlo-no-use-allgather, or one GPU")
    if layout.sharded:
        raise ConfigError("--cache with --dlo-use-allgather: every rank gathers each block together, but each "
                          "rank's cache decides its skips on its own seed's latents, so the gathers would diverge; "
                          "use --dlo-no-use-allgather (each rank streams whole blocks), or one GPU")
