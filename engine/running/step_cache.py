"""A request's step cache: diffusers' own config built from `--cache`, checked against the family before load,
enabled on the DiTs for the request, and followed by the streamer's ring (`cache_follow`).

Exactness: the same `enable_cache(config)` on plain `DiffusionPipeline.from_pretrained(dir)` gives the same
output (tests/engine/test_step_cache.py); nothing of the cache's mathematics is ours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ...offload.module_hooks import Hooks
from ...offload.streamer import LayerwiseStreamer
from ..errors import ConfigError
from .cache_follow import SkipFollower
from .cache_schedule import ScheduleFollower
from .cache_spec import CACHE_KINDS, CacheSpec


def _timestep_of(pipe: Any) -> Callable[[], Any]:
    """What PAB and FasterCache ask each block for: the pipeline's current timestep (as diffusers' docs pass)."""
    return lambda: getattr(pipe, "current_timestep", None) if pipe is not None else 0


def _typed(kind: str, name: str, value: Any, default: Any) -> Any:
    """The value as the config's field takes it (its default's type); a value of another kind: ConfigError."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    label = f"--cache {kind}: {name}={value}"
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ConfigError(f"{label}: takes true or false")
    if isinstance(default, float) and not number:
        raise ConfigError(f"{label}: takes a number")
    if isinstance(default, int) and not isinstance(default, bool) and not (number and isinstance(value, int)):
        raise ConfigError(f"{label}: takes a whole number")
    if isinstance(default, float):
        return float(value)
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    if (isinstance(default, torch.dtype) or name.endswith("dtype")) and isinstance(value, str):
        dtype = getattr(torch, value, None)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(f"{label}: not a torch dtype (e.g. bfloat16, float32)")
        return dtype
    return value


def cache_config(spec: CacheSpec, pipe: Any = None) -> Any:
    """diffusers' config for `spec`, its parameters under their own names. A name the config has not, or a
    value it refuses: ConfigError, one line."""
    import diffusers.hooks

    cls = getattr(diffusers.hooks, spec.config_class)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    given = {key for key, _ in spec.params}
    if spec.kind == "mag" and not given & {"mag_ratios", "calibrate"}:
        kwargs["calibrate"] = True  # without the model's ratios, MagCache calibrates: it computes every step
    for key, value in spec.params:
        field = fields.get(key)
        if field is None or key.startswith("_"):
            names = ", ".join(n for n in fields if not n.startswith("_") and not n.endswith("_callback"))
            raise ConfigError(f"--cache {spec.kind}: {cls.__name__} has no parameter {key} (it has {names})")
        default = field.default if field.default is not dataclasses.MISSING else None
        kwargs[key] = _typed(spec.kind, key, value, default)
    if "current_timestep_callback" in fields:
        kwargs["current_timestep_callback"] = _timestep_of(pipe)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].strip()
        raise ConfigError(f"--cache {spec.text()}: {cls.__name__} refuses it: {first}") from None


def _takes(model: torch.nn.Module, config: Any) -> bool:
    """Whether diffusers' `enable_cache(config)` takes this model (its block classes registered, ...)."""
    import diffusers.utils.logging as diffusers_logging

    if not hasattr(model, "enable_cache"):
        return False
    level = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # its notes on defaults it picks are for the run, not this check
    try:
        model.enable_cache(config)
    except Exception:  # diffusers says no in its own words (ValueError, KeyError, ...): the kind does not work
        return False
    finally:
        diffusers_logging.set_verbosity(level)
    model.disable_cache()
    return True


def _meta_model(class_name: str, folder: Any) -> torch.nn.Module | None:
    """The component's model built on the meta device from its config.json alone (no weights read)."""
    import accelerate
    import diffusers

    cls = getattr(diffusers, class_name or "", None)
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module) or not hasattr(cls, "load_config"):
        return None
    config = cls.load_config(folder, local_files_only=True)
    with accelerate.init_empty_weights():
        return cls.from_config(config)


def kinds_that_work(model: torch.nn.Module) -> list[str]:
    """The `--cache` kinds diffusers' `enable_cache` takes on this model, each with its default parameters."""
    return [kind for kind in CACHE_KINDS if _takes(model, cache_config(CacheSpec(kind)))]


def check_cache_support(model: Any, spec: CacheSpec | None) -> None:
    """Before load: refuse a kind diffusers does not support for this family's denoiser (or a config it
    refuses), in one line naming the kinds that work. `model`: the discovered `ModelInfo`."""
    if spec is None:
        return
    config = cache_config(spec)
    for comp in model.denoisers:
        built = _meta_model(comp.class_name, comp.folder)
        if built is not None and _takes(built, config):
            continue
        works = kinds_that_work(built) if built is not None else []
        hint = f"kinds that work: {', '.join(works)}" if works else "no --cache kind works for it"
        raise ConfigError(f"--cache {spec.kind}: diffusers does not support it for {comp.name} "
                          f"({comp.class_name}); {hint}")


def supported_kinds(model: Any) -> list[str]:
    """The `--cache` kinds diffusers takes on every denoiser of `model` (the discovered `ModelInfo`), each
    built on the meta device from its config (no weights read): the console's toggle cycles through them."""
    works = list(CACHE_KINDS)
    for comp in model.denoisers:
        built = _meta_model(comp.class_name, comp.folder)
        found = kinds_that_work(built) if built is not None else []
        works = [kind for kind in works if kind in found]
    return works


class StepCache:
    """The cache enabled on a request's DiTs, the ring following its skips, and its hit counts."""

    def __init__(self, spec: CacheSpec, pipe: Any, dits: list[torch.nn.Module],
                 streamer: LayerwiseStreamer | None) -> None:
        self.spec = spec
        self._dits: list[torch.nn.Module] = []
        self._hooks = Hooks()
        self._streamer = streamer
        self.followers: list[SkipFollower | ScheduleFollower] = []
        try:
            for dit in dits:
                if getattr(dit, "is_cache_enabled", False):
                    dit.disable_cache()
                self._dits.append(dit)
                dit.enable_cache(cache_config(spec, pipe))
        except BaseException:  # the DiTs enabled so far go back as they were
            self.remove()
            raise
        retarget: list[Callable[[], None]] = []
        decided = lambda: retarget[0]() if retarget else None  # noqa: E731 - bound once the ring follows
        self.followers = [follower(d, self._hooks, decided) for d in self._dits
                          for follower in (SkipFollower, ScheduleFollower)]
        self.followers = [f for f in self.followers if f.active]
        if streamer is not None and self.followers:
            retarget.append(streamer.follow_skips(self.skips))
        self._seen = (0, 0)

    def skips(self, module: torch.nn.Module) -> bool:
        return any(f.skips(module) for f in self.followers)

    @property
    def totals(self) -> tuple[int, int]:
        """(forwards decided, forwards that skipped the later blocks) since the request began."""
        return sum(f.forwards for f in self.followers), sum(f.hits for f in self.followers)

    def take_step(self) -> tuple[int, int]:
        """(forwards, hits) since the previous call: one denoise step's."""
        now = self.totals
        step = (now[0] - self._seen[0], now[1] - self._seen[1])
        self._seen = now
        return step

    def remove(self) -> None:
        """The ring stops following; diffusers' hooks come off (their state with them)."""
        if self._streamer is not None and self.followers:
            self._streamer.follow_skips(None)
        self._hooks.remove()
        for dit in self._dits:
            if getattr(dit, "is_cache_enabled", False):
                dit.disable_cache()


def start_cache(spec: CacheSpec | None, pipe: Any, dits: list[torch.nn.Module],
                streamer: LayerwiseStreamer | None) -> StepCache | None:
    """The request's cache, or None for `--cache off` (nothing enabled: the output is unchanged)."""
    return StepCache(spec, pipe, dits, streamer) if spec is not None else None
