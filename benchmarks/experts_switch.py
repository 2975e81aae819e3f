"""Wan 2.2 A14B-size: two experts share one device budget (issue 22 item 9), on one GPU.

Two Wan-14B-size experts (`transformer` high-noise, `transformer_2` low-noise; 40 blocks of dim 5120,
random bf16 weights, ~28.6 GB each) denoise 81x480x832 latents (21x60x104) as WanPipeline does with
`boundary_ratio` 0.875: the UniPC scheduler's timesteps (flow shift 12, as the A14B checkpoints), the
high-noise expert while t >= 875, the low-noise one after; guidance 1 (one forward per step). Three runs:

  resident     both experts on the device (the oracle: plain diffusers' placement)
  one expert   the high-noise expert alone in a `LayerwiseStreamer` with N resident blocks (the Wan 2.1 14B
               figure at the same budget), every step on it
  two experts  both experts' blocks in one streamer (pinned host holds both), N resident blocks of the
               running expert, `ExpertSwitch` handing the budget over at the boundary step and back
               after the request (engine/loading/expert_switch.py, what `Engine` installs)

Each streamed run serves `--requests` requests (the first warms up); figures are the last request's.
Reported: steady step time per expert vs the one-expert figure (target: within 2 %), the switch's time
vs its moved bytes / the measured pinned bandwidth + 100 ms (target), the device peak vs one expert's
budget, and the final latents bit-identical to the resident run's (the frames are their VAE decode).

    python -m benchmarks.experts_switch --out experts_switch.json                 # 81x480x832, 40 layers
    python -m benchmarks.experts_switch --frames 21 --layers 10 --out small.json  # a quick check
    python -m benchmarks.experts_switch --tiny --device cpu --out smoke.json      # the script itself, on a CPU
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import torch

from omni_console.engine.events import ExpertSwitched
from omni_console.engine.loading.expert_switch import ExpertSwitch
from omni_console.engine.planning.experts import Expert, streamer_residency
from omni_console.offload.events import EventBus
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

from . import harness

BOUNDARY_RATIO = 0.875
GB = 1e9
WAN_14B = dict(num_attention_heads=40, attention_head_dim=128, text_dim=4096, freq_dim=256, ffn_dim=13824)
TINY = dict(num_attention_heads=2, attention_head_dim=16, text_dim=32, freq_dim=32, ffn_dim=64)  # --tiny: a smoke run
DEVICE = torch.device("cuda")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_expert(layers: int, seed: int, size: dict[str, int]) -> torch.nn.Module:
    """A Wan-14B-size WanTransformer3DModel, random bf16 weights made on the GPU (deterministic per seed)."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        model = WanTransformer3DModel(patch_size=(1, 2, 2), in_channels=16, out_channels=16, num_layers=layers,
                                      cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, **size)
    model = model.to(dtype=torch.bfloat16).to_empty(device=DEVICE)
    with torch.device(DEVICE):  # computed buffers (the rotary tables) as the class makes them: no blocks, cheap
        fresh = WanTransformer3DModel(patch_size=(1, 2, 2), in_channels=16, out_channels=16, num_layers=0,
                                      cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, **size)
    for name, buf in fresh.named_buffers():
        model.get_buffer(name).copy_(buf)
    del fresh
    gen = torch.Generator(DEVICE).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm) and m.weight is not None:
                m.weight.fill_(1.0)
                if m.bias is not None:
                    m.bias.zero_()
    return model.requires_grad_(False).eval()


def measure_bandwidth(nbytes: int = 2**30, repeats: int = 5) -> float:
    """Pinned host→device copy rate in bytes/s (best of `repeats`)."""
    from omni_console.offload.pinned import HostArena

    if DEVICE.type != "cuda":
        return 1e10  # a CPU smoke run: no link

    arena = HostArena(nbytes, pin=True)
    arena.tensor.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(arena.tensor, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    arena.close()
    return nbytes / best


def schedule(steps: int) -> list[int]:
    from diffusers import UniPCMultistepScheduler

    s = UniPCMultistepScheduler(num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True,
                                flow_shift=12.0, solver_order=2)
    s.set_timesteps(steps)
    return [int(t) for t in s.timesteps]


def denoise(experts: list[torch.nn.Module], latents: torch.Tensor, text: torch.Tensor,
            timesteps: list[int]) -> tuple[torch.Tensor, list[float]]:
    """WanPipeline's expert choice per step (t >= boundary: the first); an Euler update stands in for UniPC.
    Returns the final latents and each step's wall time (synchronized)."""
    x = latents.clone()
    times: list[float] = []
    boundary = BOUNDARY_RATIO * 1000
    sigmas = [t / 1000 for t in timesteps] + [0.0]
    with torch.no_grad():
        for i, t in enumerate(timesteps):
            model = experts[0] if t >= boundary or len(experts) == 1 else experts[1]
            sync()
            t0 = time.perf_counter()
            pred = model(hidden_states=x, timestep=torch.tensor([t], device=DEVICE), encoder_hidden_states=text,
                         return_dict=False)[0]
            x = (x.float() + (sigmas[i + 1] - sigmas[i]) * pred.float()).to(x.dtype)
            sync()
            times.append(time.perf_counter() - t0)
    return x, times


def block_bytes(blocks: torch.nn.ModuleList) -> int:
    return sum(p.numel() * p.element_size() for p in blocks.parameters())


def main() -> None:
    ap = harness.parser(__doc__, out="experts_switch.json", device="cuda")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--layers", type=int, default=40, help="blocks per expert (Wan 14B: 40)")
    ap.add_argument("--resident", type=int, default=20, help="N: resident blocks of the running expert")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="tiny experts (a smoke run of the script, no figures)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    assert DEVICE.type != "cuda" or torch.cuda.is_available(), "needs a CUDA device"
    size = TINY if args.tiny else WAN_14B
    timesteps = schedule(args.steps)
    high = sum(t >= BOUNDARY_RATIO * 1000 for t in timesteps)
    assert 0 < high < len(timesteps), f"{args.steps} steps do not reach both experts: {timesteps}"
    result: dict[str, Any] = {"args": vars(args), "timesteps": timesteps, "high_noise_steps": high,
                              "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu"}
    bw = measure_bandwidth()
    result["pinned_bandwidth_GBps"] = bw / GB
    log(f"pinned H2D {bw / GB:.1f} GB/s; timesteps {timesteps} ({high} on the high-noise expert)")

    t0 = time.perf_counter()
    experts = [build_expert(args.layers, 1, size), build_expert(args.layers, 2, size)]
    log(f"built two experts in {time.perf_counter() - t0:.1f} s: {block_bytes(experts[0].blocks) / GB:.2f} GB "
        f"of blocks each")
    gen = torch.Generator(DEVICE).manual_seed(0)
    lat_frames = (args.frames - 1) // 4 + 1
    latents = torch.randn(1, 16, lat_frames, args.height // 8, args.width // 8, generator=gen, device=DEVICE,
                          dtype=torch.bfloat16)
    text = torch.randn(1, 512, size["text_dim"], generator=gen, device=DEVICE, dtype=torch.bfloat16)

    denoise(experts, latents, text, timesteps[:1])  # kernels chosen once, for every run
    oracle, steps = denoise(experts, latents, text, timesteps)
    result["resident"] = {"step_s": steps, "median_s": statistics.median(steps)}
    log(f"resident: steps {[round(s, 3) for s in steps]}")

    # the one-expert figure: the high-noise expert alone, same budget (a GPU copy of its blocks is kept to rebuild it)
    keep = {k: t.detach().clone() for k, t in (*experts[0].blocks.named_parameters(),
                                               *experts[0].blocks.named_buffers())}
    n = args.layers
    bus = EventBus()
    one = LayerwiseStreamer([("transformer.blocks", list(experts[0].blocks))], DEVICE, bus=bus,
                            residency=BlockResidency.leading(n, args.resident, args.slots))
    one.attach()
    one_steps: list[float] = []
    for _ in range(args.requests):
        _, one_steps = denoise(experts[:1], latents, text, timesteps)
    result["one_expert"] = {"step_s": one_steps, "median_s": statistics.median(one_steps[1:] or one_steps)}
    log(f"one expert, {args.resident} resident: steps {[round(s, 3) for s in one_steps]}")
    one.detach()
    for name, t in (*experts[0].blocks.named_parameters(), *experts[0].blocks.named_buffers()):
        t.data = keep[name]
    del keep, one
    gc.collect()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()

    plan = tuple(Expert(name, i * n, n, BlockResidency.leading(n, args.resident, args.slots))
                 for i, name in enumerate(("transformer", "transformer_2")))
    residency, active = streamer_residency(plan, 0, 2 * n)
    t0 = time.perf_counter()
    two = LayerwiseStreamer([("transformer.blocks", list(experts[0].blocks)),
                             ("transformer_2.blocks", list(experts[1].blocks))], DEVICE, bus=bus,
                            residency=residency, keep_masters=True, active=active)
    two.attach()
    log(f"two experts packed and pinned ({two.host_bytes / GB:.1f} GB) in {time.perf_counter() - t0:.1f} s")
    switch = ExpertSwitch(two, plan, experts, bus)
    sub = bus.subscribe()
    if DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for r in range(args.requests):
        switch.request_id = r + 1
        final, two_steps = denoise(experts, latents, text, timesteps)
        switch.restore()
    peak = torch.cuda.max_memory_allocated() if DEVICE.type == "cuda" else 0
    events = [e for e in sub.drain() if isinstance(e, ExpertSwitched) and e.request_id == args.requests]
    boundary = next(e for e in events if e.reason == "boundary")
    back = next(e for e in events if e.reason == "request end")
    steady = [s for i, s in enumerate(two_steps) if i not in (0, high)]  # the first step and the switch's
    one_fig = result["one_expert"]["median_s"]
    moved = boundary.copied_bytes + boundary.ring_bytes
    target = moved / bw + 0.1
    result["two_experts"] = {
        "step_s": two_steps, "steady_median_s": statistics.median(steady), "ratio_to_one_expert":
        statistics.median(steady) / one_fig, "boundary_step_s": two_steps[high],
        "switch": {"seconds": boundary.seconds, "copied_bytes": boundary.copied_bytes,
                   "freed_bytes": boundary.freed_bytes, "ring_bytes": boundary.ring_bytes,
                   "target_s": target, "within_target": boundary.seconds <= target},
        "switch_back": {"seconds": back.seconds, "copied_bytes": back.copied_bytes + back.ring_bytes},
        "pinned_host_GB": two.host_bytes / GB, "peak_allocated_GB": peak / GB,
        "resident_blocks_GB": two.resident_bytes / GB, "ring_GB": two.slot_bytes / GB,
        "bit_identical_to_resident": bool(torch.equal(final, oracle)),
    }
    t = result["two_experts"]
    log(f"two experts: steps {[round(s, 3) for s in two_steps]}; steady {t['steady_median_s']:.3f} s = "
        f"{t['ratio_to_one_expert']:.3f}x the one-expert {one_fig:.3f} s (target <= 1.02)")
    log(f"switch at t={boundary.timestep:g}: {boundary.seconds:.3f} s for {moved / GB:.2f} GB "
        f"(target {target:.3f} s = moved / {bw / GB:.1f} GB/s + 0.1 s); back after the request {back.seconds:.3f} s")
    log(f"peak allocated {peak / GB:.1f} GB (one expert's {t['resident_blocks_GB']:.1f} GB of resident blocks + "
        f"{t['ring_GB']:.1f} GB ring + non-block modules and activations), pinned {t['pinned_host_GB']:.1f} GB; "
        f"bit-identical to resident: {t['bit_identical_to_resident']}")
    switch.close()
    two.detach()
    harness.write(result, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
