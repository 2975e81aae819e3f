"""The plan's step time under `--cache`: a range, from no hits to the kind's best case, never one number.

Whether a step hits depends on the weights and the prompt, which a plan does not see; so the plan gives the
uncached step (no hits) and the best case the kind allows, and says it is a range. The best case counts only
what the ring saves: the blocks a hit skips are neither copied nor computed (First-Block Cache runs its probe
block alone; MagCache and SeaCache skip every block, the probe's copy aside). Kinds that skip inside blocks
(pab, faster, taylorseer by default) copy every block: on a link-bound step their best case is the uncached
step. TaylorSeer hooked on whole blocks (`use_lite_mode=true`) copies no block on a predicted step; its
schedule, not the weights, decides which steps those are, and the line says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..planning.documents import CacheRangeDoc, MeasuredHitsDoc
from .cache_hits import HitRate
from .cache_spec import CacheSpec

# blocks of N a hit forward still copies and runs, per kind that skips whole blocks
_RUN_ON_HIT = {"first-block": 1, "mag": 1, "sea": 1}


@dataclass(frozen=True, slots=True)
class CacheRange:
    no_hits_s: float | None
    best_s: float | None
    line: str
    spec: CacheSpec | None = None
    num_blocks: int = 0
    measured: HitRate | None = None
    expected_s: float | None = None  # the step at the measured rate

    def document(self) -> CacheRangeDoc:
        """`plan --json`'s `cache`: the same range, field by field."""
        assert self.spec is not None
        m = self.measured
        measured = MeasuredHitsDoc(forwards=m.forwards, hits=m.hits, steps=m.steps, hit_rate=m.rate,
                                   expected_step_seconds=self.expected_s) if m is not None and m.forwards else None
        return CacheRangeDoc(cache=self.spec.text(), kind=self.spec.kind, no_hits_step_seconds=self.no_hits_s,
                             best_step_seconds=self.best_s, blocks_run_on_hit=runs_on_hit(self.spec),
                             num_blocks=self.num_blocks, measured=measured, line=self.line)


def runs_on_hit(spec: CacheSpec) -> int | None:
    """Blocks a hit forward still copies and runs (None: the kind skips inside blocks, every block is copied)."""
    if spec.kind == "taylorseer" and dict(spec.params).get("use_lite_mode") is True:
        return 0
    return _RUN_ON_HIT.get(spec.kind)


def cache_step_range(spec: CacheSpec, num_blocks: int, step_s: float | None, measured: HitRate | None = None
                     ) -> CacheRange:
    """The step from no hits to the best case of `spec` (see the module docstring), and the plan's line; with a
    hit rate this family measured for the setting (`cache_hits`), the step that rate gives as well."""
    found = replace(_range(spec, num_blocks, step_s), spec=spec, num_blocks=num_blocks)
    if measured is None or measured.forwards == 0:
        return found
    seen = f"; measured here: {measured.hits} of {measured.forwards} forwards hit ({measured.rate:.0%}, at " \
           f"{measured.steps} steps)"
    expected = None
    if found.no_hits_s is not None and found.best_s is not None:
        expected = found.no_hits_s + measured.rate * (found.best_s - found.no_hits_s)
        seen += f", about {expected:.3f} s a step at that rate"
    return replace(found, line=found.line + seen, measured=measured, expected_s=expected)


def _range(spec: CacheSpec, num_blocks: int, step_s: float | None) -> CacheRange:
    runs = _RUN_ON_HIT.get(spec.kind)
    head = f"--cache {spec.text()}: step time is a range, not a forecast: "
    if spec.kind == "taylorseer" and dict(spec.params).get("use_lite_mode") is True:
        return CacheRange(step_s, None, head + "a predicted step (diffusers' schedule: cache_interval after "
                          "disable_cache_before_step) copies and runs no block; a computed step is the uncached one")
    if runs is None or num_blocks < 1:
        return CacheRange(step_s, step_s, head + "this kind skips work inside blocks, so every block is still "
                          "copied; on a link-bound step it saves nothing of the copies (compute only)")
    if step_s is None:
        return CacheRange(None, None, head + f"no hits (the uncached step, unknown until measured) down to a hit "
                          f"step running {runs} of {num_blocks} blocks")
    best = step_s * min(runs, num_blocks) / num_blocks
    return CacheRange(step_s, best, head + f"{step_s:.3f} s (no hits) down to {best:.3f} s when a step hits "
                      f"({runs} of {num_blocks} blocks copied and run; the first step never hits)")
