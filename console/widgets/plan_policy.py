"""The policy as vLLM-Omni spells it: the exact `--dlo-offload-components` JSON and the serve line.

It updates with every toggle so the operator can copy the chosen policy into a deployment;
after load it is shown read-only (greyed), since the loaded model no longer follows edits.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...engine.api import Plan, plain, planner


class PolicyPanel(Static, can_focus=True):
    """`--dlo-offload-components '…'`, resident layers, mode and the `vllm serve` command."""

    DEFAULT_CSS = """
    PolicyPanel { height: auto; border: round $secondary; padding: 0 1; }
    PolicyPanel.-readonly { opacity: 60%; border: round $panel-lighten-2; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = "policy (vLLM-Omni)"
        self.components_json = "{}"
        self.flags = ""
        self.command = ""
        self.readonly = False

    def show_plan(self, plan: Plan, *, readonly: bool = False, live: bool = False) -> None:
        """`readonly`: loaded without live re-plan; `live`: loaded, and the keys re-plan it between requests."""
        policy = plan.policy
        self.readonly = readonly
        self.components_json = policy.components_json()
        self.flags = planner.vllm_flags(plan)
        self.command = planner.vllm_serve_command(plan)
        self.set_class(readonly, "-readonly")
        self.border_title = "policy (vLLM-Omni)" + (" — read-only while loaded; u unloads" if readonly else "") + (
            " — live: + - o [ ] d b re-plan between requests" if live else "")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row("mode", policy.mode + ("  (no offload: baseline)" if policy.mode == "resident" else ""))
        grid.add_row("--dlo-offload-components", Text(plain(self.components_json), style="bold"))
        grid.add_row("--dlo-resident-layers", str(policy.resident_layers))
        if policy.mode == "dlo" and (policy.placement != "leading" or policy.prefetch_slots != 2):
            grid.add_row("streaming", f"{policy.placement} placement, {policy.prefetch_slots} prefetch slots")
        lean = [f"{name.replace('_', '-')} {getattr(policy, name)}"
                f"{' (for the budget)' if name in policy.lean_auto else ''}" for name in planner.LEAN_FIELDS
                if getattr(policy, name) != "auto"]
        if lean:  # the operator's or the budget's choice; "auto" ones are left to --vram-budget
            grid.add_row("lean phases", ", ".join(lean))
        grid.add_row("vllm serve", Text(plain(self.command)))
        grid.add_row("", Text("c copies the command", style="dim") if not readonly else "")
        self.update(grid)
