"""The plan screen's `--ram-budget` panel: the host budget, the pin cap, where the blocks live (pinned, page
cache, disk), the predicted host peak, and the planner's decision lines, as `plan` prints them.

Hidden without a `--ram-budget`. The tiers are planned on the engine thread (they read the rates cache and the
request profile: engine/planning/ram_flow.py), so the panel says "planning…" until the answer comes. A policy
that no tier assignment fits is said in one line, as `plan` would refuse it.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...engine.api import Plan, plain, planner
from ...offload.units import format_bytes
from ..tier_traffic import LABELS

PLANNING = "planning the host tiers…"
TITLE = "host tiers (--ram-budget)"


def ram_rows(plan: Plan, ram: planner.RamPlan) -> list[tuple[str, str]]:
    """(label, value) rows: budget, pin cap, streamed blocks per tier, predicted host peak."""
    choice, cost = ram.choice, ram.choice.cost
    streamed = [plan.tiers.block(i) for i, b in enumerate(plan.blocks) if b.streamed]
    counts = " · ".join(f"{streamed.count(t)} {LABELS[t]}" for t in planner.TIERS if streamed.count(t) or t == "pinned")
    return [
        ("host budget", format_bytes(choice.budget)),
        ("pin cap", format_bytes(choice.pin_cap)),
        (f"streamed {plan.model.block_kind} blocks", counts if streamed else "none streamed"),
        ("predicted host peak", f"{format_bytes(cost.host_peak_bytes)} of {format_bytes(choice.budget)}"),
    ]


class RamPlanPanel(Static):
    """`--ram-budget`'s decisions for the plan on screen (hidden without a budget)."""

    DEFAULT_CSS = """
    RamPlanPanel { height: auto; border: round $secondary; padding: 0 1; display: none; }
    RamPlanPanel.-shown { display: block; }
    RamPlanPanel.-refused { border: round $error; }
    """

    def on_mount(self) -> None:
        self.border_title = TITLE

    def show(self, answer: tuple[Plan, planner.RamPlan] | Exception | None, pending: bool = False) -> None:
        """The tiers for the plan on screen; an exception: the budget refused it; None and not `pending`: no
        `--ram-budget` (hidden)."""
        self.set_class(answer is not None or pending, "-shown")
        self.set_class(isinstance(answer, Exception), "-refused")
        if isinstance(answer, Exception):
            self.update(Text(plain(f"this policy does not fit: {answer}")))
        elif answer is None:
            self.update(Text(PLANNING if pending else ""))
        else:
            plan, ram = answer
            table = Table.grid(padding=(0, 2))
            table.add_column(no_wrap=True)
            table.add_column(justify="right", no_wrap=True)
            for label, value in ram_rows(plan, ram):
                table.add_row(plain(label), plain(value))
            lines = Text("\n".join(plain(line) for line in ram.reasons), style="dim")
            self.update(Group(table, lines))
