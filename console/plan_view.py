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
    if not c.info.block_lists:
        return ""
    parts = [f"{b.attr} ×{b.count} (max {fmt_bytes(b.largest_bytes)})" for b in c.info.block_lists]
    parts.append(f"non-block {fmt_bytes(c.info.non_block_bytes)}")
    if c.resident_layers:
        parts.append(f"{c.resident_layers} resident")
    return "\n".join(parts)


def component_table(plan: Plan) -> Table:
    table = Table(title=f"{plan.model.pipeline_class} — {plan.model.path}", expand=False)
    for col in ("component", "role", "class", "dtype", "params", "size", "blocks", "residency", "why"):
        table.add_column(col, justify="right" if col in ("params", "size") else "left")
    for c in plan.components:
        info = c.info
        table.add_row(
            info.name, info.role, info.class_name or "", ", ".join(info.dtypes) or "—",
            f"{info.num_params:,}" if info.has_weights else "—",
            fmt_bytes(info.nbytes) if info.has_weights else "—",
            _blocks_cell(c),
            Text(RESIDENCY_LABEL[c.residency], style=RESIDENCY_STYLE[c.residency]),
            c.why,
        )
    return table


def forecast_table(plan: Plan) -> Table:
    f = plan.forecast
    table = Table(title="forecast (from safetensors headers)", show_header=False)
    table.add_column("what")
    table.add_column("bytes", justify="right")
    table.add_row("device: resident weights (resident components + DiT non-block + resident layers)",
                  fmt_bytes(f.device_resident_bytes))
    table.add_row(f"device: peak weights (+ 2 slots × largest streamed block {fmt_bytes(f.largest_streamed_block_bytes)}"
                  f" + largest staged {fmt_bytes(f.largest_staged_bytes)})", fmt_bytes(f.peak_device_weight_bytes))
    table.add_row("host: pinned (streamed blocks + staged masters)", fmt_bytes(f.pinned_host_bytes))
    table.add_row(f"link: streamed per DiT forward ({f.num_streamed_blocks} blocks streamed, "
                  f"{f.num_resident_blocks} resident)", fmt_bytes(f.streamed_bytes_per_forward))
    return table


def render_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    console.print(component_table(plan))
    console.print(forecast_table(plan))
    lines = [Text("vLLM-Omni equivalent", style="bold")]
    if plan.policy.mode == "resident":
        lines.append(Text("mode=resident: no offload (baseline); vLLM-Omni without DLO flags"))
    else:
        lines.append(Text(f"flags:  {vllm_flags(plan)}"))
    lines.append(Text(f"serve:  {vllm_serve_command(plan)}"))
    lines.append(Text(f"python: {vllm_python_call(plan)}"))
    console.print(Panel(Group(*lines), expand=False))
