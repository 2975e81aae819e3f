"""`--cache KIND[:key=value,...]` as text: which diffusers step cache, with which parameters, without torch.

The cache mathematics is diffusers' own (its `*CacheConfig` hooks, `transformer.enable_cache`); this module only
reads the operator's text so that a typo is answered before the heavy imports. The parameter names are the
config's own; whether the config has them, and whether the family's DiT takes the kind, is checked after the
import but before anything loads (`step_cache.check_cache_support`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

# kind -> diffusers' config class (diffusers.hooks); "off" is no cache
CACHE_KINDS: dict[str, str] = {
    "first-block": "FirstBlockCacheConfig",
    "mag": "MagCacheConfig",
    "taylorseer": "TaylorSeerCacheConfig",
    "faster": "FasterCacheConfig",
    "pab": "PyramidAttentionBroadcastConfig",
    "sea": "SeaCacheConfig",
}
KIND_NAMES = (*CACHE_KINDS, "off")
MAX_TEXT = 4096  # longer than any real cache setting: refused rather than parsed


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """One step cache: its kind (a key of `CACHE_KINDS`) and the config parameters, in the order given."""

    kind: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def config_class(self) -> str:
        return CACHE_KINDS[self.kind]

    def text(self) -> str:
        """The flag's text back (`first-block:threshold=0.2`): the report's and the profile's key."""
        if not self.params:
            return self.kind
        return self.kind + ":" + ",".join(f"{k}={json.dumps(v)}" for k, v in self.params)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, so a list value (`range=[100,800]`) stays whole."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _value(key: str, raw: str) -> Any:
    """A value as JSON where it parses (numbers, true/false, null, lists), else the string itself."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        value = raw.strip()
        if not value:
            raise ConfigError(f"--cache {key}: no value (expected {key}=VALUE)") from None
        return value
    if isinstance(value, float) and not math.isfinite(value) or (
            isinstance(value, list) and any(isinstance(v, float) and not math.isfinite(v) for v in value)):
        raise ConfigError(f"--cache {key}: holds a non-finite number (NaN or infinity); give finite numbers")
    if isinstance(value, dict):
        raise ConfigError(f"--cache {key}: takes a number, true/false, a word or a [list], not an object")
    return value


def parse_cache(text: str | None) -> CacheSpec | None:
    """`KIND[:key=value,...]` -> a `CacheSpec`; None (no cache) for no flag or `off`. Bad text: ConfigError,
    one line naming the flag."""
    if text is None:
        return None
    if len(text) > MAX_TEXT:
        raise ConfigError(f"--cache: longer than {MAX_TEXT} characters")
    kind, sep, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in KIND_NAMES:
        raise ConfigError(f"--cache {kind!r:.60}: not a cache kind (use one of {', '.join(KIND_NAMES)})")
    if kind == "off":
        if sep and rest.strip():
            raise ConfigError("--cache off: takes no parameters")
        return None
    params: dict[str, Any] = {}
    for item in _split_top_level(rest) if sep and rest.strip() else []:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"--cache {kind}: {item.strip()!r:.60} is not key=value")
        if not key.isidentifier():
            raise ConfigError(f"--cache {kind}: {key!r:.60} is not a parameter name")
        if key in params:
            raise ConfigError(f"--cache {kind}: {key} given twice")
        if key.endswith("_callback"):
            raise ConfigError(f"--cache {kind}: {key} is set by the engine (the pipeline's current timestep)")
        params[key] = _value(key, raw)
    return CacheSpec(kind, tuple(params.items()))
