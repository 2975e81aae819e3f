"""How far a profile measured at one size says anything about another: the range a scaled step time
must lie in, and the figure inside it.

A block's measured time `c` at the profiled size is fixed work (kernel launches, hooks, copies on a
CPU, memory-bound work that does not grow with FLOPs) plus FLOP work; one profile cannot split
them. The FLOP part is at least the block's FLOPs over the device's peak (the table's dense bf16
peak on a GPU it names; nothing on a CPU or an unnamed device, where it may be none) and at most
`c`. With the FLOPs growing by `g` to the requested size the time is `c + F (g - 1)` for a FLOP part
`F` in that range: both ends are the bounds. A forecast that stays inside them is the geometric
middle, within 2x of either end when they are at most 4x apart; wider than that, the step time is
unknown until measured at that size (`request_forecast.forecast_for` says so). This is what keeps a
9x32x32 profile of a 3 MB model, all launch overhead, from forecasting a million seconds at 121
frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPREAD = 4.0  # the widest range (high / low) a scaled figure is given for: the middle is within 2x of both ends


@dataclass(frozen=True, slots=True)
class Bounds:
    low: float
    high: float

    @property
    def middle(self) -> float:
        return math.sqrt(self.low * self.high) if self.low > 0 else self.high / 2

    @property
    def known(self) -> bool:
        """Narrow enough to give one figure (`SPREAD`)."""
        return self.high <= SPREAD * self.low or self.high == 0


def scaled_time(measured: float, growth: float, flop_floor: float = 0.0) -> Bounds:
    """The time of work measured at `measured` seconds whose FLOPs grow by `growth`; `flop_floor`:
    the seconds its FLOPs take at least at the measured size (FLOPs / peak), clipped to `measured`."""
    floor = min(max(flop_floor, 0.0), measured)
    ends = (measured + floor * (growth - 1.0), measured * growth)
    return Bounds(max(min(ends), 0.0), max(ends))


def range_text(low: float, high: float) -> str:
    """"0.005-0.113 s" with enough digits to tell the ends apart."""
    digits = 3 if low >= 0.01 else 4
    return f"{low:.{digits}f}–{high:.{digits}f} s"
