"""The plan screen's policy edits as pure functions: each returns the new policy or a refusal.

Kept free of Textual so the rules (DiT and UNet rows are refused, resident mode is read-only, layers are
clamped to the model's block count) are plain data transformations a test can check directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..engine.api import ModelInfo, OffloadPolicy, Plan, planner
from ..engine.errors import PolicyError

DIT_REFUSAL = "{name} is a DiT: DLO always owns DiT offload (use +/- for resident layers)"
UNET_REFUSAL = "{name} is a UNet: DLO streams its blocks as it does a DiT's (use +/- for resident blocks)"
RESIDENT_MODE_REFUSAL = "mode=resident keeps everything on the device; press m to switch to dlo mode"


@dataclass(frozen=True, slots=True)
class Edit:
    """The outcome of one key: a new policy (None when refused) and a line for the operator."""

    policy: OffloadPolicy | None
    message: str


def _residency_word(offload: bool) -> str:
    return "offloaded (staged)" if offload else "resident"


def _check_component(model: ModelInfo, policy: OffloadPolicy, name: str) -> str | None:
    """Why `name` cannot be toggled, or None when it can."""
    try:
        info = model.component(name)
    except KeyError:
        return f"{name} is not a component of this model"
    if info.role == "dit":
        return DIT_REFUSAL.format(name=name)
    if info.role == "unet":
        return UNET_REFUSAL.format(name=name)
    if info.role not in ("encoder", "vae"):
        what = "has no weights" if not info.has_weights else "is not an encoder or VAE (always resident)"
        return f"{name} {what}: not part of the offload policy"
    if policy.mode == "resident":
        return RESIDENT_MODE_REFUSAL
    return None


def toggle_component(model: ModelInfo, policy: OffloadPolicy, name: str) -> Edit:
    """Flip a component's effective residency by giving it its own explicit entry."""
    why = _check_component(model, policy, name)
    if why is not None:
        return Edit(None, why)
    offload = not policy.offload_enabled(name)
    return Edit(policy.with_component(name, offload), f"{name}: {_residency_word(offload)} (explicit)")


def clear_component(model: ModelInfo, policy: OffloadPolicy, name: str) -> Edit:
    """Drop a component's explicit entry so it follows "default" (or the implicit True)."""
    why = _check_component(model, policy, name)
    if why is not None:
        return Edit(None, why)
    if name not in policy.dlo_offload_components:
        return Edit(None, f"{name} has no explicit entry to clear")
    new = policy.with_component(name, None)
    return Edit(new, f"{name}: {_residency_word(new.offload_enabled(name))} ({new.source_of(name)})")


def toggle_default(policy: OffloadPolicy) -> Edit:
    """Flip the "default" entry; absent means True, so the first press sets it to False."""
    if policy.mode == "resident":
        return Edit(None, RESIDENT_MODE_REFUSAL)
    current = policy.dlo_offload_components.get(planner.DEFAULT_KEY)
    value = False if current is None else not current
    return Edit(policy.with_component(planner.DEFAULT_KEY, value),
                f'"default": {str(value).lower()} — components without an entry are {_residency_word(value)}')


def change_resident_layers(model: ModelInfo, policy: OffloadPolicy, delta: int) -> Edit:
    """Move resident leading DiT (or UNet) layers by `delta`, clamped to 0..number of their blocks."""
    if policy.mode == "resident":
        return Edit(None, RESIDENT_MODE_REFUSAL)
    limit = planner.blocks_per_forward(model)  # with two experts: per expert (engine/planning/experts.py)
    n = min(max(policy.resident_layers + delta, 0), limit)
    if n == policy.resident_layers:
        bound = "0" if delta < 0 else f"{limit} (every {model.block_kind} block)"
        return Edit(None, f"resident layers already at {bound}")
    which = "leading" if policy.placement == "leading" else "spread"
    return Edit(policy.with_resident_layers(n), f"resident {model.block_kind} layers ({which}): {n} of {limit}")


def toggle_placement(policy: OffloadPolicy) -> Edit:
    """leading (vLLM-Omni's resident_layers) ⇄ spread (resident blocks between the streamed ones)."""
    if policy.mode == "resident":
        return Edit(None, RESIDENT_MODE_REFUSAL)
    new = "spread" if policy.placement == "leading" else "leading"
    words = {"leading": "leading: the first N blocks stay resident (vLLM-Omni's resident_layers)",
             "spread": "spread: resident blocks between the streamed ones (no vLLM-Omni spelling)"}
    return Edit(policy.with_streaming(new, policy.prefetch_slots), f"placement {words[new]}")


MAX_PREFETCH_SLOTS = 32


def change_prefetch_slots(policy: OffloadPolicy, delta: int) -> Edit:
    """Ring depth k by `delta`, clamped to 2..MAX_PREFETCH_SLOTS (the plan uses at most the streamed blocks)."""
    if policy.mode == "resident":
        return Edit(None, RESIDENT_MODE_REFUSAL)
    k = min(max(policy.prefetch_slots + delta, 2), MAX_PREFETCH_SLOTS)
    if k == policy.prefetch_slots:
        return Edit(None, f"prefetch slots already at {k} ({'the least' if delta < 0 else 'the most'})")
    return Edit(policy.with_streaming(policy.placement, k), f"prefetch ring: {k} slots, copies run {k - 1} ahead")


def switch_mode(policy: OffloadPolicy, stash: OffloadPolicy | None,
                kind: str = "DiT") -> tuple[Edit, OffloadPolicy | None]:
    """dlo → resident (the dlo policy is stashed) and back (the stash is restored).

    Resident mode cannot carry a component map or resident layers, so they are kept aside
    rather than lost. Returns the edit and the new stash.
    """
    if policy.mode == "dlo":
        resident = planner.build_policy(None, 0, "resident", stream_dtype=policy.stream_dtype,
                                fp8_modulation=policy.fp8_modulation)  # the same weights, resident
        return Edit(resident, "mode=resident: no offload (baseline); m switches back"), policy
    restored = stash if stash is not None else planner.build_policy(None, 0, "dlo", stream_dtype=policy.stream_dtype,
                                                            fp8_modulation=policy.fp8_modulation)
    return Edit(restored, f"mode=dlo: {kind} blocks streamed, encoders/VAEs by policy"), None


@dataclass(frozen=True, slots=True)
class Applied:
    """What one edit did, as the operator is told: kept or not, the line and its severity."""

    kept: bool
    message: str
    severity: str = "information"


class PolicyEditor:
    """The plan screen's policy and its plan: an edit is kept only when the engine can plan it.

    Planning is the engine's pure function of two values (`make_plan(model, policy)`: the discovered
    model's headers, no disk, no live object), so an edit is answered on the UI thread at once; `model`
    follows the engine's own (its `PlanReady`'s plan: after a first forward corrected the block order).
    The mode switch's stash lives here too, so m twice restores the dlo policy as it was.
    """

    def __init__(self, model: ModelInfo, policy: OffloadPolicy) -> None:
        self.model = model
        self.policy = policy
        self.plan = self.make_plan(policy)  # PolicyError (exit 2 on the command line) before anything runs
        self._mode_stash: OffloadPolicy | None = None

    def make_plan(self, policy: OffloadPolicy) -> Plan:
        """`policy` planned for the model (PolicyError when it does not apply); allocates and reads nothing."""
        return planner.make_plan(self.model, policy)

    def replan(self) -> Plan:
        """Plan the current policy again (the engine's model may have changed since: a corrected block order)."""
        self.plan = self.make_plan(self.policy)
        return self.plan

    def edit(self, what: str, value: object = None) -> Applied:
        """`toggle`/`clear` a component (`value` names it), flip the `default`, move `layers` or `slots` by
        `value`, flip `placement`, switch `mode`, or take a whole `policy` (the VRAM-budget choice)."""
        if what == "mode":
            edit, stash = switch_mode(self.policy, self._mode_stash, self.model.block_kind)
            applied = self._apply(edit)
            if applied.kept:
                self._mode_stash = stash
            return applied
        edits: dict[str, Callable[[], Edit]] = {
            "toggle": lambda: toggle_component(self.model, self.policy, str(value)),
            "clear": lambda: clear_component(self.model, self.policy, str(value)),
            "default": lambda: toggle_default(self.policy),
            "layers": lambda: change_resident_layers(self.model, self.policy, int(value)),  # type: ignore[call-overload]
            "placement": lambda: toggle_placement(self.policy),
            "slots": lambda: change_prefetch_slots(self.policy, int(value)),  # type: ignore[call-overload]
            "policy": lambda: Edit(value, "policy chosen for the VRAM budget"),  # type: ignore[arg-type]
        }
        return self._apply(edits[what]())

    def _apply(self, edit: Edit) -> Applied:
        if edit.policy is None:
            return Applied(False, edit.message, "warning")
        try:
            plan = self.make_plan(edit.policy)
        except PolicyError as exc:
            return Applied(False, str(exc), "error")
        self.policy, self.plan = edit.policy, plan
        return Applied(True, edit.message)
