"""The engine's LoRA set between loads: which mode each plan runs it in, switching it between requests, and
telling the faces what is applied (`LorasApplied`). A mixin of `Engine`, apart so the engine's load and request
code does not also carry the LoRA bookkeeping."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..offload.events import EventBus
from .events import LorasApplied
from .lifecycle import EngineState, EngineStateError
from .loading.lora_apply import AppliedLoras, apply_loras, plan_lora_modes, remove_loras, switch_loras
from .loading.lora_files import LoraFile, check_loras
from .planning.lora_cost import LoraModes, with_lora

if TYPE_CHECKING:
    import threading

    from .loading.placement import Placement
    from .model_dir.discovery import ModelInfo
    from .options import EngineOptions
    from .planning.plan import Plan


class LoraControl:
    """`loras` (checked files) and `_loras_applied` (what is on the blocks now); the engine sets `model`,
    `options`, `bus`, `plan`, `pipe`, `placement`, `state`, `_lock` and `device_name`."""

    model: ModelInfo
    options: EngineOptions
    bus: EventBus
    plan: Plan | None
    pipe: Any
    placement: Placement | None
    state: EngineState
    _lock: threading.RLock
    loras: list[LoraFile]
    _loras_applied: AppliedLoras
    device_name: str

    def lora_modes(self, plan: Plan, loras: list[LoraFile] | None = None, mode: str | None = None) -> LoraModes | None:
        """The LoRAs' device bytes, each mode's cost per step and what `auto` resolves to (None: no LoRA)."""
        return plan_lora_modes(plan, self.loras if loras is None else loras, self.device_name,
                               mode or self.options.lora_mode)

    def _lora_mode(self, plan: Plan, loras: list[LoraFile] | None = None, mode: str | None = None) -> str:
        modes = self.lora_modes(plan, loras, mode)
        return modes.chosen if modes is not None else (mode or self.options.lora_mode)

    def _apply_loras(self, plan: Plan) -> None:
        """Apply the LoRA set where the blocks are now under `plan` (after a load or a re-plan)."""
        assert self.placement is not None
        self._loras_applied = apply_loras(self.pipe, self.placement, self.loras, self._lora_mode(plan),
                                          self._loras_applied)
        if self.loras:
            self._announce_loras(plan)  # auto may resolve otherwise under another plan

    def _remove_loras(self) -> None:
        """Take the applied LoRAs off (resident merged bytes back) before the blocks move."""
        assert self.placement is not None
        remove_loras(self.pipe, self.placement, self._loras_applied)

    def set_loras(self, loras: tuple[tuple[str, float], ...], mode: str | None = None) -> float:
        """Between requests: apply other LoRAs (add, remove, re-scale; `mode` default: the loaded one) without
        reloading any base weight; returns the seconds it took. A bad LoRA is refused before anything changes."""
        with self._lock:
            checked = check_loras(self.model, tuple(loras))
            if self.state != EngineState.READY or self.placement is None or self.plan is None:
                raise EngineStateError(f"set_loras needs a loaded model (state {self.state.value})")
            start = time.perf_counter()
            mode = mode or self.options.lora_mode
            self._loras_applied = switch_loras(self.pipe, self.placement, self._loras_applied, checked,
                                               self._lora_mode(self.plan, checked, mode))  # hot-swapped where alike
            self.loras = checked
            self.options = replace(self.options, loras=tuple(loras), lora_mode=mode)
            modes = self.lora_modes(self.plan)  # the plan's device bytes follow the LoRAs now applied
            self.plan = with_lora(self.plan, modes.device_bytes(modes.chosen) if modes is not None else 0)
            self._announce_loras(self.plan)
            return time.perf_counter() - start

    def _announce_loras(self, plan: Plan) -> None:
        """`LorasApplied`: the set now applied and the mode it runs in (a face shows it; `auto` may change)."""
        chosen = self._lora_mode(plan) if self.loras else None
        self.bus.publish(LorasApplied(loras=tuple((str(p), float(s)) for p, s in self.options.loras),
                                      mode=self.options.lora_mode, chosen=chosen))
