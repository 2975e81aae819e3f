"""Components a pipeline keeps but never calls, so the plan neither moves nor reads them.

AnimateDiff's `motion_adapter` (a `MotionAdapter`) is the case: a saved AnimateDiff pipeline's `unet` is already
the `UNetMotionModel` built from a UNet and the adapter, with the adapter's motion modules inside it; the
pipeline keeps the adapter only for its config (FreeNoise reads `motion_max_seq_length`). Placed like any other
component it took the released adapter's 0.45 GB of device memory, and as much host memory at load, for nothing.
Such a component is built from its config on the meta device (no weights read, nothing allocated): a call into
it would fail loudly, never compute on missing weights. Where the saved `unet` is a plain `UNet2DConditionModel`,
the pipeline builds the motion UNet from the adapter's weights, so the adapter is used and no rule applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .discovery import ComponentInfo

# (the unused component's class, the class of another component whose presence makes it unused, why)
RULES: tuple[tuple[str, str, str], ...] = (
    ("MotionAdapter", "UNetMotionModel",
     "never called: its motion modules are inside {other} ({other_class}), which the pipeline runs"),
)


def mark_unused(components: Sequence[ComponentInfo]) -> tuple[ComponentInfo, ...]:
    """`components` with `unused` set (one line: why) on each that a rule says the pipeline never calls."""
    out = []
    for c in components:
        for cls, other_cls, why in RULES:
            other = next((o for o in components if o.class_name == other_cls and o is not c), None)
            if c.class_name == cls and c.library == "diffusers" and other is not None:
                line = why.format(other=other.name, other_class=other_cls)
                c = replace(c, unused=line, notes=(*c.notes, f"{c.name} ({cls}): {line}; not loaded"))
                break
        out.append(c)
    return tuple(out)
