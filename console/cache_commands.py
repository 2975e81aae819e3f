"""The step cache between requests: `s` on the live screen cycles the next request's cache (off → each kind
diffusers takes on this family's denoiser → off), the status line says which, and the generate dialog starts
from it.

Part of `OmniConsoleApp` (a mixin over the `ConsoleHost` protocol). A request's cache is enabled for its whole
run (diffusers' hooks carry state from step to step), so `s` is refused with a toast while a request runs or
waits; the engine enables the new setting when the next request starts (no reload).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.api import checks

if TYPE_CHECKING:
    from .host import ConsoleHost


class CacheCommands:
    """s for the app, and the kinds this model's denoiser takes."""

    _cache_kinds: tuple[str, ...] | None = None

    def cache_kinds(self: ConsoleHost) -> tuple[str, ...]:
        """The kinds diffusers' `enable_cache` takes on every denoiser of the model, found once per console
        from the configs alone (built on the meta device: no weights read)."""
        if self._cache_kinds is None and self.world > 1:  # a rank group's requests take no cache (yet)
            self._cache_kinds = ()
        if self._cache_kinds is None:
            try:
                self._cache_kinds = tuple(checks.supported_kinds(self.model))
            except Exception:  # noqa: BLE001 - a config diffusers cannot build: no kind offered, the console goes on
                self._cache_kinds = ()
        return self._cache_kinds

    def action_cycle_cache(self: ConsoleHost) -> None:
        """s: the next request's step cache, in turn; said in a toast and kept in the live status line."""
        session = self.session
        refusal = session.refuse_cache_change()
        if refusal is not None:
            self.say(*refusal)
            return
        kinds = self.cache_kinds()
        if not kinds and self.world > 1:
            self.say("no step cache on several GPUs yet: --cache runs on one GPU", "warning")
            return
        if not kinds:
            self.say(f"no step cache: diffusers supports none for {self.model.pipeline_class}'s denoiser", "warning")
            return
        spec = session.cycle_cache(kinds)
        self.say(f"step cache for the next request: {spec.text() if spec is not None else 'off'}", timeout=4)
        self._live_status()


def cache_status(spec: checks.CacheSpec | None) -> str:
    """The live status line's part (empty with no cache: the line stays as it was)."""
    return f" · cache {spec.text()}" if spec is not None else ""
