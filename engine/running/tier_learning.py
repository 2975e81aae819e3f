"""After a request: the page cache's and disk's rates the run's file-tier reads reached replace the cached probe's
(engine/planning/tier_rates.py `learn_rates`), so the next plan's step floor and tier choice are the engine's
reader's, not a 256 MiB probe's. A read-only cache changes nothing but this run's line."""

from __future__ import annotations

from typing import Any

from ...offload.units import format_rate
from ..planning.tier_rates import learn_rates


def learn_tier_rates(engine: Any) -> str | None:
    """Learn from the engine's file-tier reads since its load; returns the line to log, or None (nothing learned)."""
    streamer = engine.placement.streamer if engine.placement is not None else None
    totals = getattr(getattr(streamer, "filler", None), "read_totals", None)
    if totals is None or engine.plan is None:
        return None
    try:
        learned = learn_rates(engine.plan.model.path, engine.device_name, totals())
    except OSError as exc:
        return f"tier rates not learned: the cache could not be written ({exc.strerror or exc})"
    if learned is None:
        return None
    return (f"tier rates {learned.note}: page cache {format_rate(learned.page_cache_bytes_per_s)}, disk "
            f"{format_rate(learned.disk_bytes_per_s)}; the next plan uses them")
