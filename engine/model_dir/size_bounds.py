"""Bound every size a component's configs can ask `__init__` to allocate, before anything loads.

A config's integers become module counts (`layers_per_block`), table lengths (`rope_max_seq_len`,
`relative_attention_num_buckets`), scheduler arrays (`num_train_timesteps`) and padding lengths
(`model_max_length`). The libraries build whatever they say: `layers_per_block: 1e9` grows the
process until the kernel kills it. No list of field names is kept (a hostile directory names its own);
every integer of every `*config.json` is checked against what backs it, one line (exit 2) if not:

- a component with weights: no integer above the number of values its weights hold (a layer count,
  a width, a table length no tensor backs) nor above what the host could hold as a table of that
  many rows (`HOST_ROW_BYTES` each); at least `FLOOR` is allowed (positions, rope bases and token
  ids of tiny models). No list longer than its tensor count (at least `LIST_FLOOR`);
- a component without weights (scheduler, tokenizer, processor): no integer above `WEIGHTLESS_MAX`
  (`model_max_length`'s "no limit", transformers' `int(1e30)`, excepted);
- identifiers (`*_id`, `*_ids`, `*_index`) and rope bases (`*theta`) name a value, not a size: not
  bounded; `NaN` is refused anywhere (an infinity has meanings: DPM-Solver's `lambda_min_clipped`);
- a tokenizer declares at most `MAX_ADDED_TOKENS` added tokens (`tokenizer.json`'s `added_tokens`,
  `tokenizer_config.json`'s `added_tokens_decoder`).

The checks read JSON already parsed and the safetensors headers; they cost the same whatever the numbers.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...offload.units import format_bytes
from ..errors import ModelDirError
from ..plain_text import shown
from .weights import TensorInfo, open_regular

FLOOR = 2**17
LIST_FLOOR = 1024
WEIGHTLESS_MAX = 2**24
HOST_ROW_BYTES = 1024  # a table row of 128 float64 values (a rope table's row for a 128-wide head)
MAX_ADDED_TOKENS = 65_536  # real tokenizers add a few thousand at most
NO_LENGTH_LIMIT = int(1e30)  # transformers' VERY_LARGE_INTEGER
MAX_TOKENIZER_BYTES = 512 * 2**20
_NOT_A_SIZE = re.compile(r"(_id|_ids|_index|theta)$", re.IGNORECASE)


def host_bytes() -> int:
    """Physical memory of this host (0 when the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 0


def _numbers(document: Any) -> Iterator[tuple[str, Any]]:
    """(the key it sits under, value) for every number and list in a JSON document, iteratively."""
    pending: list[tuple[str, Any]] = [("", document)]
    while pending:
        key, value = pending.pop()
        if isinstance(value, dict):
            pending.extend((str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            yield key, value
            pending.extend((key, v) for v in value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, value


def check_sizes(path: Path, document: dict, tensors: Sequence[TensorInfo] | None) -> None:
    """Refuse a config whose integers exceed what the component's weights back (rules in the module docstring).

    `tensors` is None for a component without weights."""
    if tensors is None:
        int_bound, list_bound, backing = WEIGHTLESS_MAX, None, None
    else:
        values = sum(t.numel for t in tensors)
        host = host_bytes() // HOST_ROW_BYTES or values
        int_bound = max(FLOOR, min(values, host))
        list_bound = max(LIST_FLOOR, len(tensors))
        backing = (f"its weights hold {values:,} values" if values <= host else
                   f"this host's {format_bytes(host_bytes())} could not hold a table that long")
    for key, value in _numbers(document):
        if isinstance(value, list):
            if list_bound is not None and len(value) > list_bound:
                raise ModelDirError(f"{path}: {shown(key)} lists {len(value):,} values, more than the {len(tensors):,} "
                                    "tensors its weights hold (refused before load)")
            continue
        if isinstance(value, float):
            if math.isnan(value):  # (an infinity has meanings: DPM-Solver's lambda_min_clipped is -inf)
                raise ModelDirError(f"{path}: {shown(key)} is NaN, not a number")
            continue
        if _NOT_A_SIZE.search(key) or abs(value) <= int_bound:
            continue
        if tensors is None and key == "model_max_length" and value == NO_LENGTH_LIMIT:
            continue
        number = shown(value, 24)
        if backing is None:
            raise ModelDirError(f"{path}: {shown(key)} = {number} is more than the {WEIGHTLESS_MAX:,} omni-console "
                                "allows a component without weights (refused before load: it would allocate that much)")
        raise ModelDirError(f"{path}: {shown(key)} = {number}, but {backing} (refused before load: it would "
                            "allocate for a size nothing backs)")


def check_added_tokens(folder: Path, configs: dict[Path, dict]) -> None:
    """Refuse a tokenizer that declares more than `MAX_ADDED_TOKENS` added tokens (each one is built in Python
    at load, and a few hundred thousand exhaust the host)."""
    for path, document in configs.items():
        decoder = document.get("added_tokens_decoder")
        if isinstance(decoder, (dict, list)) and len(decoder) > MAX_ADDED_TOKENS:
            _too_many(path, len(decoder))
    tokenizer = folder / "tokenizer.json"
    if tokenizer.is_file() and not tokenizer.is_symlink():
        count = _added_token_count(tokenizer)
        if count > MAX_ADDED_TOKENS:
            _too_many(tokenizer, count)


def _too_many(path: Path, count: int) -> None:
    raise ModelDirError(f"{path}: {count:,} added tokens, more than the {MAX_ADDED_TOKENS:,} omni-console loads "
                        "(refused before load)")


def _added_token_count(path: Path) -> int:
    """Entries of every `"added_tokens": [...]` array in tokenizer.json, the largest (its other parts, the
    vocabulary tens of MB long, are not parsed)."""
    with open_regular(path) as handle:
        raw = handle.read(MAX_TOKENIZER_BYTES)
    decoder = json.JSONDecoder()
    text = raw.decode("utf-8", errors="replace")
    largest, start = 0, 0
    while (found := text.find('"added_tokens"', start)) >= 0:
        start = found + 1
        rest = text[found + len('"added_tokens"'):found + 64].lstrip()
        if not rest.startswith(":"):
            continue
        at = text.index(":", found) + 1
        while at < len(text) and text[at].isspace():
            at += 1
        if text.startswith("[", at):
            try:
                value, _ = decoder.raw_decode(text, at)
            except (ValueError, RecursionError):
                continue  # malformed: the tokenizer library refuses it at load
            largest = max(largest, len(value) if isinstance(value, list) else 0)
    return largest
