"""The staging log names the host tier a streamed block was read from (offload/tier_filler.py)."""

from __future__ import annotations


def test_a_block_read_from_its_file_says_which_tier_in_the_staging_log():
    from omni_console.console.event_text import format_staging
    from omni_console.offload.events import StagingEvent

    disk = StagingEvent(target="transformer.transformer_blocks.3", direction="h2d", nbytes=4096, seconds=0.001,
                        tier="disk")
    pinned = StagingEvent(target="transformer.transformer_blocks.3", direction="h2d", nbytes=4096, seconds=0.001)
    assert format_staging(disk).endswith("from disk") and "from" not in format_staging(pinned)
    assert format_staging(disk, on_cpu=True).endswith("from disk")
