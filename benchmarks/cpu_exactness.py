"""Engine vs plain diffusers on this machine's CPU, with the staging address-phase rule on and off.

Prints the CPU model and, per tiny family and policy, the largest pixel difference between the
engine's image and the plain pipeline's (0 = bit-identical). "phase off" replaces the rule by a
plain allocation, which is what the engine did before: on CPUs whose kernels depend on operand
alignment (seen on an AMD EPYC with AVX-512), that column shows the difference the rule removes.

    python -m benchmarks.cpu_exactness --out cpu_exactness.json        # the engine's demo model (Flux)
    python tests/write_tiny_families.py /tmp/tiny                         # flux, sd3, pixart_sigma, wan
    python -m benchmarks.cpu_exactness --tiny-dir /tmp/tiny --out cpu_exactness.json
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from omni_console.engine.engine import Engine  # noqa: E402
from omni_console.engine.running.runner import GenerateRequest  # noqa: E402
from omni_console.offload import stager  # noqa: E402
from omni_console.offload.policy import build_policy  # noqa: E402

from . import harness


def families(tiny_dir: Path | None) -> dict[str, tuple[Path, str, dict]]:
    """family -> (model directory, pipeline class name, call kwargs): those `tests/write_tiny_families.py`
    wrote to `tiny_dir`, or the engine's demo model alone."""
    if tiny_dir is None:
        from omni_console.engine.demo.demo_model import DEMO_GENERATION, ensure_demo_model

        call = {k: v for k, v in DEMO_GENERATION.items() if k != "guidance_scale"}
        return {"flux": (ensure_demo_model(), "FluxPipeline", call)}
    index = json.loads((tiny_dir / "families.json").read_text())
    return {name: (tiny_dir / name, entry["pipeline"], dict(entry["call"])) for name, entry in index.items()}


def first_image(output) -> np.ndarray:
    images = getattr(output, "images", None)
    if images is None:
        return np.asarray(output.frames[0][0])
    return np.asarray(images[0])


def main() -> None:
    parser = harness.parser(__doc__, out=None)
    parser.add_argument("--tiny-dir", type=Path, default=None,
                        help="tiny pipelines written by tests/write_tiny_families.py (default: the demo model)")
    args = parser.parse_args()
    import diffusers

    from omni_console.engine.loading.loader import quiet_libraries

    quiet_libraries()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    report = {"cpu": harness.cpu_model(), "avx512f": " avx512f" in flags, "torch": torch.__version__,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "families": {}}
    print(f"CPU: {report['cpu']} (AVX-512: {report['avx512f']}, torch {report['torch']}, "
          f"kernels {report['cpu_capability']})")
    original = stager.place_like
    for family, (path, pipeline_name, gen) in families(args.tiny_dir).items():
        req = GenerateRequest(prompt="a red fox in snow", steps=gen.pop("num_inference_steps"),
                              height=gen.pop("height"), width=gen.pop("width"), seed=7, extra=gen)
        pipe = getattr(diffusers, pipeline_name).from_pretrained(path, local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        expected = first_image(pipe(**req.call_kwargs(pipe)))
        del pipe
        rows = {}
        for label, rule in (("phase on", original), ("phase off", lambda alloc, n, d, _p: alloc(n, d))):
            stager.place_like = rule
            engine = Engine(path, device="cpu")
            for comps, layers in (({}, 0), ({"default": False}, 1), ({"vae": False}, engine.model.num_dit_blocks)):
                engine.load(build_policy(comps, layers))
                image = np.asarray(engine.generate(req).image)
                engine.unload()
                diff = int(np.abs(image.astype(np.int32) - expected.astype(np.int32)).max())
                differing = int((image != expected).any(axis=-1).sum()) if image.ndim == 3 else -1
                rows[f"{label} {json.dumps(comps)} layers={layers}"] = {"max_diff": diff, "pixels": differing}
            engine.close()
        stager.place_like = original
        report["families"][family] = rows
        for key, row in rows.items():
            print(f"{family:13s} {key:45s} max pixel diff {row['max_diff']} ({row['pixels']} pixels)")
    harness.write(report, args, device="cpu")


if __name__ == "__main__":
    main()
