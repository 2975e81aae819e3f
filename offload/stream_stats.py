"""What a streamer reports: a re-plan's moved bytes and a step's transfer totals (offload/streamer.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplanStats:
    """What a `replan` moved: block regions copied to the device (newly resident), device bytes freed
    (newly streamed), the ring's warm-up copies, and the wall time including both synchronizations."""

    copied_bytes: int
    freed_bytes: int
    ring_bytes: int
    seconds: float
    file_blocks: int = 0  # newly resident blocks read from their files (their master in a page-cache/disk tier)
    file_bytes: int = 0


@dataclass(frozen=True, slots=True)
class StepStats:
    """Transfer totals since the previous `take_step_stats()` call.

    `stall_s`: time compute waited on weight copies (exposed stall). `h2d_bytes` / `transfers`:
    bytes and number of host-to-device block copies issued. `sync_fetches`: blocks found missing when
    about to run and copied synchronously (the ring's order missed them; 0 once the order is right).
    """

    stall_s: float
    h2d_bytes: int
    transfers: int
    sync_fetches: int = 0
    skipped_blocks: int = 0  # streamed blocks a step cache skipped (no copy issued for them)
    skipped_bytes: int = 0  # their regions' bytes
