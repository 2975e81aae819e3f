"""The per-component offload policy, with vLLM-Omni's `dlo_offload_components` semantics.

Two validation moments, as vLLM-Omni has them:
- when the policy is built: shape and types of the map, and "requires DLO" for a non-empty map
  with `mode="resident"`;
- after discovery, before anything is moved (`check_against`): only `"default"` and the discovered
  encoder/VAE names are allowed; DiT names and unknown names are rejected, listed sorted.

Resolution of one auxiliary component: its own entry, else `"default"`, else True (staged).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import PolicyError, PolicyTypeError
from .residency import DEFAULT_SLOTS, BlockResidency, Placement

Mode = Literal["dlo", "resident"]
StreamDtype = Literal["float8_e4m3fn", "float8_e5m2"]
STREAM_DTYPE_NAMES = ("float8_e4m3fn", "float8_e5m2")
Source = Literal["explicit", "default", "implicit"]
# a lean phase (engine/planning/lean.py): "on" always, "off" never, "auto" only where a --vram-budget needs it
LeanMode = Literal["auto", "on", "off"]
LEAN_MODES = ("auto", "on", "off")
LEAN_FIELDS = ("stream_encoders", "vae_tiling", "vae_slicing", "ff_chunking")
# fp8 storage, resident blocks kept in the compute dtype: "auto" (a --vram-budget weighs it; none without one),
# "off" (never: every resident block upcast per forward), or how many (BlockResidency.with_upcast)
UpcastResident = Literal["auto", "off"] | int
UPCAST_WORDS = ("auto", "off")
DEFAULT_KEY = "default"
OPTION = "dlo_offload_components"


def _type_name(value: object) -> str:
    return type(value).__name__


def validate_component_map(value: object) -> dict[str, bool]:
    """Build-time checks of the map (upstream `OffloadConfig` semantics); `None` means `{}`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PolicyTypeError(
            f"{OPTION} must be a mapping of component names to booleans, got {_type_name(value)}"
        )
    checked: dict[str, bool] = {}
    for key, flag in value.items():
        if not isinstance(key, str) or not key:
            raise PolicyTypeError(f"{OPTION} keys must be non-empty strings")
        if not isinstance(flag, bool):  # 0, 1, "false" are rejected: only real booleans
            raise PolicyTypeError(f"{OPTION}[{key!r}] must be a boolean, got {_type_name(flag)}")
        checked[key] = flag
    return checked


class OffloadPolicy(BaseModel):
    """What the operator chose: DLO or the resident baseline, the component map, resident layers,
    which blocks those are (`placement`) and the streamer's ring depth (`prefetch_slots`, k >= 2).

    `stream_dtype` stores the DiT's weights in fp8 by diffusers' layerwise-casting rule (None: as the
    checkpoint stores them); `fp8_modulation` also stores the AdaLN modulation linears in fp8 (not
    diffusers' rule). See engine/loading/stream_dtype.py. `upcast_resident`: with fp8 storage, how many
    resident blocks are kept in the compute dtype (converted once at load, no per-forward upcast, twice
    the device bytes); "auto" lets `--vram-budget` weigh it (none without a budget), "off" never.

    The lean phases (`stream_encoders`, `vae_tiling`, `vae_slicing`, `ff_chunking`; engine/planning/lean.py) are
    applied when "on"; "auto" lets `--vram-budget` turn them on where the budget needs them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = "dlo"
    dlo_offload_components: dict[str, bool] = Field(default_factory=dict)
    resident_layers: int = 0
    placement: Placement = "leading"
    prefetch_slots: int = DEFAULT_SLOTS
    stream_dtype: StreamDtype | None = None
    fp8_modulation: bool = False
    upcast_resident: UpcastResident = "auto"
    stream_encoders: LeanMode = "auto"
    vae_tiling: LeanMode = "auto"
    vae_slicing: LeanMode = "auto"
    ff_chunking: LeanMode = "auto"
    lean_auto: tuple[str, ...] = ()  # the lean phases a --vram-budget turned on (they were "auto"): a new budget
    # may turn them off again, where an operator's "on" stays

    def lean_on(self, name: str) -> bool:
        """Whether the lean phase `name` (one of LEAN_FIELDS) is applied."""
        return bool(getattr(self, name) == "on")

    @field_validator("dlo_offload_components", mode="before")
    @classmethod
    def _check_map(cls, value: object) -> dict[str, bool]:
        return validate_component_map(value)

    @field_validator("resident_layers", mode="before")
    @classmethod
    def _check_layers(cls, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyTypeError(f"resident_layers must be an integer, got {_type_name(value)}")
        if value < 0:
            raise PolicyError(f"resident_layers must be >= 0, got {value}")
        return value

    @field_validator("prefetch_slots", mode="before")
    @classmethod
    def _check_slots(cls, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyTypeError(f"prefetch slots must be an integer, got {_type_name(value)}")
        if value < 2:
            raise PolicyError(f"prefetch slots must be >= 2 (the running block and one ahead), got {value}")
        return value

    @field_validator("upcast_resident", mode="before")
    @classmethod
    def _check_upcast(cls, value: object) -> int | str:
        return check_upcast_resident(value)

    @property
    def upcast_count(self) -> int:
        """Resident blocks kept upcast as the policy says it (a number; "auto" and "off": none)."""
        return self.upcast_resident if isinstance(self.upcast_resident, int) else 0

    @model_validator(mode="after")
    def _check_mode(self) -> OffloadPolicy:
        if self.mode == "resident" and self.dlo_offload_components:
            raise PolicyError(f"{OPTION} requires distributed layerwise offload (mode=dlo), got mode=resident")
        if self.mode == "resident" and self.resident_layers:
            raise PolicyError("resident_layers requires distributed layerwise offload (mode=dlo)")
        if self.mode == "resident" and self.upcast_count:
            raise PolicyError("upcast_resident requires distributed layerwise offload (mode=dlo)")
        return self

    # -- resolution --------------------------------------------------------------------------
    def offload_enabled(self, name: str) -> bool:
        """True: staged (offloaded between uses); False: resident on the device once."""
        if self.mode == "resident":
            return False
        comps = self.dlo_offload_components
        return comps.get(name, comps.get(DEFAULT_KEY, True))

    def block_residency(self, num_blocks: int) -> BlockResidency:
        """Which of the model's `num_blocks` DiT blocks (execution order) stream, and through how many slots.

        `mode=resident` streams nothing; `mode=dlo` keeps `resident_layers` blocks where `placement`
        puts them (`leading`: vLLM-Omni's first N) through a ring of `prefetch_slots` slots.
        Call after `check_against`, which turns an out-of-range `resident_layers` into a PolicyError.
        """
        if self.mode == "resident":
            return BlockResidency.all_resident(num_blocks)
        placed = BlockResidency.placed(self.placement, num_blocks, self.resident_layers, self.prefetch_slots)
        return placed.with_upcast(self.upcast_count) if self.upcast_count else placed

    def source_of(self, name: str) -> Source:
        """Why `offload_enabled(name)` says what it says."""
        if name in self.dlo_offload_components:
            return "explicit"
        if DEFAULT_KEY in self.dlo_offload_components:
            return "default"
        return "implicit"

    def check_against(self, auxiliary_names: Iterable[str], dit_names: Iterable[str], num_dit_blocks: int,
                      *, unet_names: Iterable[str] = ()) -> None:
        """Post-discovery checks, before anything is allocated or moved. `unet_names`: UNets, whose blocks
        DLO streams as it does a DiT's (counted in `num_dit_blocks`)."""
        allowed = {DEFAULT_KEY, *auxiliary_names}
        unknown = sorted(k for k in self.dlo_offload_components if k not in allowed)
        unets = set(unet_names)
        if unknown:
            dits = sorted(set(unknown) & set(dit_names) - unets)
            hints = [f"{', '.join(dits)} {'is a DiT' if len(dits) == 1 else 'are DiTs'}"] if dits else []
            hints += [f"{name} is a UNet, streamed block by block like a DiT" for name in sorted(set(unknown) & unets)]
            hint = f" ({'; '.join(hints)})" if hints else ""
            raise PolicyError(
                f"{OPTION} contains unknown auxiliary components: {unknown}{hint}. "
                f"DLO always owns DiT offload. Allowed keys: {sorted(allowed)}"
            )
        if self.resident_layers > num_dit_blocks:
            kind = "UNet" if unets and not set(dit_names) - unets else "DiT"
            raise PolicyError(
                f"resident_layers must be between 0 and {num_dit_blocks} (the model's {kind} blocks), "
                f"got {self.resident_layers}"
            )

    # -- edits (the console's toggles) -------------------------------------------------------
    def with_component(self, name: str, offload: bool | None) -> OffloadPolicy:
        """A copy with `name` set (None removes the entry so it falls back to the default)."""
        comps = dict(self.dlo_offload_components)
        if offload is None:
            comps.pop(name, None)
        else:
            comps[name] = offload
        return self.model_copy(update={"dlo_offload_components": comps})

    def with_resident_layers(self, n: int) -> OffloadPolicy:
        return build_policy(self.dlo_offload_components, n, self.mode, self.placement, self.prefetch_slots,
                            **self._storage())

    def with_streaming(self, placement: Placement, prefetch_slots: int) -> OffloadPolicy:
        return build_policy(self.dlo_offload_components, self.resident_layers, self.mode, placement, prefetch_slots,
                            **self._storage())

    def _storage(self) -> dict[str, Any]:
        return {"stream_dtype": self.stream_dtype, "fp8_modulation": self.fp8_modulation,
                "upcast_resident": self.upcast_resident, **{name: getattr(self, name) for name in LEAN_FIELDS},
                "lean_auto": self.lean_auto}

    def components_json(self) -> str:
        """The exact `--dlo-offload-components` value (compact JSON, keys in insertion order)."""
        return json.dumps(self.dlo_offload_components, separators=(", ", ": "))


def check_upcast_resident(value: object) -> int | str:
    """"auto", "off" or a count >= 0 (a digit string too: the command line's); else a one-line error."""
    # ASCII digits only: str.isdigit() is true for "²" and int() refuses it; "--3" and 5,000 digits raise too
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
        if len(value.strip()) > 18:
            raise PolicyError(f"upcast_resident: {len(value.strip())} digits is too many for a number of blocks")
        value = int(value.strip())
    if isinstance(value, str) and value in UPCAST_WORDS:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyTypeError(f"upcast_resident must be auto, off or a number of resident blocks, got {value!r:.40}")
    if value < 0:
        raise PolicyError(f"upcast_resident must be >= 0 resident blocks, got {value}")
    return value


def build_policy(components: Any = None, resident_layers: Any = 0, mode: Any = "dlo", placement: Any = "leading",
                 prefetch_slots: Any = DEFAULT_SLOTS, *, stream_dtype: Any = None,
                 fp8_modulation: Any = False, upcast_resident: Any = "auto", **lean: Any) -> OffloadPolicy:
    """Build a policy, turning pydantic's wrapped errors back into our one-line errors."""
    if mode not in ("dlo", "resident"):
        raise PolicyError(f"mode must be 'dlo' or 'resident', got {mode!r}")
    if placement not in ("leading", "spread"):
        raise PolicyError(f"placement must be 'leading' or 'spread', got {placement!r}")
    if stream_dtype is not None and stream_dtype not in STREAM_DTYPE_NAMES:
        raise PolicyError(f"stream dtype must be one of {', '.join(STREAM_DTYPE_NAMES)}, got {stream_dtype!r}")
    if not isinstance(fp8_modulation, bool):
        raise PolicyTypeError(f"fp8_modulation must be a boolean, got {_type_name(fp8_modulation)}")
    upcast_resident = check_upcast_resident(upcast_resident)
    for name, value in lean.items():
        if name == "lean_auto" and isinstance(value, tuple) and set(value) <= set(LEAN_FIELDS):
            continue
        if name not in LEAN_FIELDS:
            raise TypeError(f"build_policy() got an unexpected keyword argument {name!r}")
        if value not in LEAN_MODES:
            raise PolicyError(f"{name.replace('_', '-')} must be one of {', '.join(LEAN_MODES)}, got {value!r}")
    try:
        return OffloadPolicy(mode=mode, dlo_offload_components=components, resident_layers=resident_layers,
                             placement=placement, prefetch_slots=prefetch_slots, stream_dtype=stream_dtype,
                             fp8_modulation=fp8_modulation, upcast_resident=upcast_resident, **lean)
    except ValidationError as exc:
        for err in exc.errors():
            original = (err.get("ctx") or {}).get("error")
            if isinstance(original, PolicyError):
                raise original from None
        raise PolicyError(str(exc.errors()[0].get("msg", exc))) from None


FLAG = "--dlo-offload-components"


class _DuplicateKey(Exception):
    """Raised from inside the JSON decoder; turned into a PolicyError naming the key."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook`: plain `json.loads` keeps the last of two equal keys without a word."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def parse_components_json(text: str | None) -> dict[str, bool] | None:
    """Parse the CLI's `--dlo-offload-components` JSON text, then apply the build-time checks.

    Every malformed text ends in a PolicyError (one line), never another exception: syntax errors,
    duplicate keys (refused, where vLLM-Omni's parser would silently keep the last), nesting too deep
    for the decoder, and numbers too long to convert.
    """
    if text is None:
        return None
    try:
        value = json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as dup:
        raise PolicyError(f"{FLAG} has a duplicate key {dup.key!r}") from None
    except json.JSONDecodeError as exc:
        raise PolicyError(f"{FLAG} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise PolicyError(f"{FLAG} is nested too deeply (expected a flat JSON object of booleans)") from None
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise PolicyError(f"{FLAG} is not valid JSON: {str(exc).split(':')[0]}") from None
    return validate_component_map(value)
