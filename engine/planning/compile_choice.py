"""`--compile off|regional|auto`: whether a request's streamed blocks run compiled, and what the compile costs.

Torch-free (the plan screen and `plan` read it). Regional compile (offload/block_compile.py) compiles each
repeated block class once per shape; its cost is a phase of the first request at a shape: cold when Inductor's
cache (under the tool's cache dir) has no entry for this model's block signature, warm when an earlier process
compiled it (`engine/running/compile_record.py` keeps the measured seconds per signature).

`auto` turns it on only where it can pay back within the request:
- the device supports it: CUDA with Triton, compute capability >= 7 (on a CPU auto is off);
- the forecast is compute-bound: a compiled step can never go below the link's transfer time, so the gain per
  step is min(GAIN x compute, compute - transfer), zero where the plan is transfer-bound;
- compile seconds < steps x that gain.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPILE_MODES = ("off", "regional", "auto")
COMPUTE_GAIN = 0.18
"""Estimated share of a block's compute that regional compile saves on a GPU: Wan-14B one forward on an H100,
resident eager 4.60 s against resident compiled 3.77 s (diffusers PR #11605); Flux on an RTX 4090 32.60 -> 25.85 s
(diffusers docs). Replaced by nothing measured here yet: the plan says "estimated"."""
COLD_SECONDS_PER_CLASS = 10.0
"""Estimated cold compile (Inductor, default mode) of one block class at one shape, until one is measured, with the
compile start-up beside the load (offload/compile_warmup.py): on an H100 (docs/benchmarks.md) the engine's path
compiled a Flux-dev-size DiT's two block classes in 12.6 s (2026-12-08; 6.3 s a class) and a Wan-14B-size DiT's one
class in 15.3 s before the start-up moved out of the first step (2026-12-07); sglang measured a whole DiT's
regional compile at 8.1 s on an H200 (PR #28193)."""
WARM_SHARE = 0.20
"""A warm start (every graph from Inductor's FX graph and AOTAutograd caches; Dynamo still traces each graph) as a
share of the cold one, until one is measured: 0.187 on the H100 for the engine's path with the start-up beside the
load (2.35 s against 12.6 s, the Flux-dev-size DiT, 2026-12-08; diffusers' own path 0.257), 0.11-0.17 on a 2-core
CPU."""
WORKSPACE_SHARE = 0.5
"""Compile workspace (autotuning scratch, Inductor's extra buffers) as a share of the largest block's device
bytes, until one is measured. Estimated."""
EXACTNESS_LINE = ("compiled output is not bit-identical to eager (Inductor fuses and reorders floating-point work)")


@dataclass(frozen=True)
class DeviceSupport:
    """What the device offers regional compile."""

    cuda: bool
    triton: bool
    capability: tuple[int, int] | None

    @property
    def why_not(self) -> str | None:
        """None when compile can run here, else the reason in a few words."""
        if not self.cuda:
            return "no CUDA device (Inductor on a CPU would compile for minutes to save little)"
        if not self.triton:
            return "Triton is not installed"
        if self.capability is not None and self.capability < (7, 0):
            return f"compute capability {self.capability[0]}.{self.capability[1]} < 7.0"
        return None


@dataclass(frozen=True)
class CompileRecord:
    """What earlier runs measured for one block signature (`compile_record.py` reads and writes it)."""

    cold_s: float | None = None
    warm_s: float | None = None
    workspace_bytes: int | None = None
    max_abs_diff: float | None = None
    """Largest |compiled - eager| over the output, measured by the benchmark (None: not measured)."""


@dataclass(frozen=True)
class CompileForecast:
    """The plan's word on compile for one request."""

    asked: str
    on: bool
    why: str
    expect: str | None = None  # "cold" or "warm" (None: off)
    seconds: float = 0.0
    seconds_source: str = "estimated"  # "measured" when an earlier run at this signature timed it
    gain_s: float = 0.0  # forecast seconds saved over the request
    workspace_bytes: int = 0
    workspace_source: str = "estimated"
    max_abs_diff: float | None = None

    def lines(self) -> list[str]:
        """The plan's and report's lines (none when off and not asked)."""
        if self.asked == "off":
            return []
        if not self.on:
            return [f"compile {self.asked}: off ({self.why})"]
        lines = [f"compile {self.asked}: regional, {self.expect} start, ~{self.seconds:.1f} s "
                 f"({self.seconds_source}) in the first step; {self.why}",
                 f"compile workspace {self.workspace_bytes / 2**20:,.0f} MiB on the device ({self.workspace_source}) "
                 "beside the forecast's peak; --vram-budget holds it back"]
        diff = f" (measured max |diff| {self.max_abs_diff:.3g})" if self.max_abs_diff is not None else ""
        lines.append(EXACTNESS_LINE + diff)
        return lines


def compile_seconds(record: CompileRecord | None, classes: int) -> tuple[str, float, str]:
    """(cold or warm, seconds, measured or estimated) for a start at a signature with `record`."""
    if record is None or record.cold_s is None:
        return "cold", COLD_SECONDS_PER_CLASS * max(classes, 1), "estimated"
    if record.warm_s is not None:
        return "warm", record.warm_s, "measured"
    return "warm", record.cold_s * WARM_SHARE, "estimated"


def step_gain(compute_s: float | None, transfer_s: float) -> float:
    """Seconds a compiled step saves: a share of the compute, never below the link's transfer time."""
    if compute_s is None or compute_s <= transfer_s:
        return 0.0
    return min(COMPUTE_GAIN * compute_s, compute_s - transfer_s)


def choose_compile(asked: str, device: DeviceSupport, *, classes: int, steps: int, compute_s: float | None,
                   transfer_s: float, largest_block_bytes: int, record: CompileRecord | None = None,
                   warm_cache: bool = False) -> CompileForecast:
    """The decision for one request (see the module docstring). `compute_s`, `transfer_s`: one step's compute
    and link time from the forecast (compute None: unknown). `warm_cache`: Inductor's cache has entries for
    this signature (a warm start even without a record of its seconds)."""
    if asked not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {asked!r}")
    if asked == "off":
        return CompileForecast(asked, False, "not asked")
    expect, seconds, source = compile_seconds(record, classes)
    if expect == "cold" and warm_cache:
        expect, seconds = "warm", seconds * WARM_SHARE
    measured_ws = record is not None and record.workspace_bytes is not None
    workspace = record.workspace_bytes if measured_ws else int(WORKSPACE_SHARE * largest_block_bytes)
    gain = step_gain(compute_s, transfer_s) * steps
    common = {"expect": expect, "seconds": seconds, "seconds_source": source, "gain_s": gain,
              "workspace_bytes": workspace or 0, "workspace_source": "measured" if measured_ws else "estimated",
              "max_abs_diff": record.max_abs_diff if record else None}
    if asked == "regional":
        why = device.why_not
        return CompileForecast(asked, True, f"asked (note: {why})" if why else "asked", **common)
    why = device.why_not
    if why:
        return CompileForecast(asked, False, why)
    if compute_s is None:
        return CompileForecast(asked, False, "step compute unknown until a request has run")
    if gain <= 0:
        return CompileForecast(asked, False, "transfer-bound: the link sets the step time, compile saves nothing")
    if seconds >= gain:
        return CompileForecast(asked, False, f"does not pay back: compile ~{seconds:.0f} s > {steps} steps x "
                                             f"{gain / steps:.2f} s saved")
    return CompileForecast(asked, True, f"pays back: ~{gain:.1f} s saved over {steps} steps", **common)
