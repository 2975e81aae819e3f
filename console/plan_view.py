"""Rich rendering of a plan for the headless `plan` command (the app has its own widgets)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..engine.export import vllm_flags, vllm_python_call, vllm_serve_command
from ..engine.plan import ComponentPlan, Plan
from ..engine.units import fmt_bytes

RESIDENCY_STYLE = {"streamed": "cyan", "staged": "yellow", "resident": "green", "none": "dim"}
RESIDENCY_LABEL = {"streamed": "streamed by DLO", "staged": "offloaded (staged)", "resident": "resident",
                   "none": "—"}


def _blocks_cell(c: ComponentPlan) -> str:
    lists = c.info.block_lists
    if not lists:
        return ""
    total = sum(b.count for b in lists)
    return str(total) if len(lists) == 1 else f"{total} ({'+'.join(str(b.count) for b in lists)})"


def component_table(plan: Plan) -> Table:
    table = Table(title=f"{plan.model.pipeline_class} — {plan.model.path}", expand=False)
    for col in ("component", "role", "class", "dtype", "size", "blocks", "residency", "why"):
        table.add_column(col, justify="right" if col in ("size", "blocks") else "left")
    for c in plan.components:
        info = c.info
        table.add_row(
            info.name, info.role, info.class_name or "", ", ".join(info.dtypes) or "—",
            fmt_bytes(info.nbytes) if info.has_weights else "—",
            _blocks_cell(c),
            Text(RESIDENCY_LABEL[c.residency], style=RESIDENCY_STYLE[c.residency]),
            c.why,
        )
    return table


def blocks_table(plan: Plan) -> Table | None:
    """Each DiT's block lists in execution order, with how many leading blocks stay resident."""
    dits = [c for c in plan.components if c.info.block_lists]
    if not dits:
        return None
    table = Table(title="DiT blocks (execution order)")
    for col in ("DiT", "block list", "count", "bytes/block", "largest", "total", "resident", "streamed"):
        table.add_column(col, justify="left" if col in ("DiT", "block list") else "right")
    for c in dits:
        for b in c.info.block_lists:
            mine = [x for x in plan.blocks if x.dit == c.info.name and x.attr == b.attr]
            kept = sum(1 for x in mine if not x.streamed)
            sizes = sorted(set(b.block_bytes))
            per = fmt_bytes(sizes[0]) if len(sizes) == 1 else f"{fmt_bytes(sizes[0])}–{fmt_bytes(sizes[-1])}"
            table.add_row(c.info.name, b.attr, str(b.count), per, fmt_bytes(b.largest_bytes),
                          fmt_bytes(b.total_bytes), str(kept), str(b.count - kept))
        table.add_row(c.info.name, "(non-block modules: resident)", "", "", "", fmt_bytes(c.info.non_block_bytes),
                      "", "")
    return table


def forecast_table(plan: Plan) -> Table:
    f = plan.forecast
    table = Table(title="forecast (from safetensors headers)", show_header=False)
    table.add_column("what")
    table.add_column("bytes", justify="right")
    table.add_row("device resident weights", fmt_bytes(f.device_resident_bytes))
    table.add_row("device peak weights", fmt_bytes(f.peak_device_weight_bytes))
    table.add_row("pinned host memory", fmt_bytes(f.pinned_host_bytes))
    table.add_row(f"streamed per DiT forward ({f.num_streamed_blocks} blocks)", fmt_bytes(f.streamed_bytes_per_forward))
    table.caption = (f"peak = resident + 2 × largest streamed block ({fmt_bytes(f.largest_streamed_block_bytes)})"
                     f" + largest staged component ({fmt_bytes(f.largest_staged_bytes)})")
    return table


def render_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    console.print(component_table(plan))
    for note in plan.model.notes:  # files discovery ignored on purpose (code, pickles)
        console.print(Text(f"note: {note}", style="dim"))
    blocks = blocks_table(plan)
    if blocks is not None:
        console.print(blocks)
    console.print(forecast_table(plan))
    lines = [Text("vLLM-Omni equivalent", style="bold")]
    if plan.policy.mode == "resident":
        lines.append(Text("mode=resident: no offload (baseline); vLLM-Omni without DLO flags"))
    else:
        lines.append(Text(f"flags:  {vllm_flags(plan)}"))
    lines.append(Text(f"serve:  {vllm_serve_command(plan)}"))
    lines.append(Text(f"python: {vllm_python_call(plan)}"))
    console.print(Panel(Group(*lines), expand=False))
