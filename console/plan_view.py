"""The plan as the headless `plan` command prints it (the app has its own widgets).

Two renderings of the same rows, chosen by where stdout goes:

- **A terminal** gets rich tables sized to the terminal. A word is never broken in the middle: cells
  wrap at spaces, and on a narrow terminal only free text (a class name, a block list's name) is cut
  with `…` (`table_fit`); the pipe form below has every value complete.
- **A pipe or a file** (`omni-console plan | less`, `| cut -f1`, `> plan.txt`) gets plain text with
  no width at all: each table is one tab-separated header row followed by its rows, every value in
  full, sections separated by a blank line; the model line, notes, the forecast's formula and the
  vLLM-Omni equivalents are plain lines (`serve: vllm serve …` holds the whole command, ready for
  `sed -n 's/^serve: //p'`). Tabs and newlines inside a value are written as `\\t` / `\\n` so a row is
  always one line. Sizes are the same human units as on screen; `plan --json` has exact byte counts.

Plain rows rather than wide rich tables because a reader piping the plan wants to cut, grep and awk
it: box-drawing borders and padding would have to be stripped first, and a table as wide as its
longest path is unreadable in `less` anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..engine.api import Plan, RankLayout, RequestForecast, plain, planner
from ..offload.units import STREAMED_NAME, format_bytes, format_rate
from .table_fit import fit_widths
from .theme_colors import default_variables, resolve

RESIDENCY_STYLE = {"streamed": "$primary", "staged": "$warning", "resident": "$success", "none": "$foreground-muted"}
"""Theme variables, not colours: the app resolves them against the active theme, `plan` against the default."""
RESIDENCY_LABEL = {"streamed": "streamed by DLO", "staged": "offloaded (staged)", "resident": "resident",
                   "none": "—"}


@dataclass(frozen=True, slots=True)
class Sheet:
    """One table's words, before it is drawn as a rich table or written as tab-separated rows."""

    title: str
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]
    right: frozenset[str] = frozenset()  # right-justified columns (numbers)
    show_header: bool = True
    caption: str | None = None
    squeeze: frozenset[str] = frozenset()  # free-text columns that may be cut with `…` on a narrow terminal
    narrow_header: dict[str, str] = field(default_factory=dict)  # shorter headers for a narrow terminal
    styles: dict[tuple[int, int], str] = field(default_factory=dict)  # (row, column) → style with $theme names


def blocks_cell(c: planner.ComponentPlan) -> str:
    """The blocks column: the block count, split per block list when there are several ("40 (30+10)")."""
    lists = c.info.block_lists
    if not lists:
        return ""
    total = sum(b.count for b in lists)
    return str(total) if len(lists) == 1 else f"{total} ({'+'.join(str(b.count) for b in lists)})"


def component_sheet(plan: Plan) -> Sheet:
    header = ("component", "role", "class", "dtype", "size", "blocks", "residency", "why")
    rows, styles = [], {}
    for i, c in enumerate(plan.components):
        info = c.info
        rows.append((
            info.name, info.role, info.class_name or "", ", ".join(info.dtypes) or "—",
            format_bytes(info.nbytes) if info.has_weights else "—", blocks_cell(c),
            RESIDENCY_LABEL[c.residency], c.why,
        ))
        styles[(i, header.index("residency"))] = RESIDENCY_STYLE[c.residency]
    return Sheet(f"{plan.model.pipeline_class} — {plan.model.path}", header, rows,
                 right=frozenset({"size", "blocks"}), squeeze=frozenset({"class", "why"}), styles=styles)


def blocks_sheet(plan: Plan) -> Sheet | None:
    """Each DiT's (or UNet's) block lists in execution order, with how many blocks stay resident."""
    dits = [c for c in plan.components if c.info.block_lists]
    if not dits:
        return None
    kind = plan.model.block_kind
    header = (kind, "block list", "count", "bytes/block", "largest", "total", "resident", "streamed")
    roles = expert_roles(plan)
    if roles:
        header += ("expert",)
    rows = []
    for c in dits:
        tail = (roles.get(c.info.name, ""),) if roles else ()
        for b in c.info.block_lists:
            mine = [x for x in plan.blocks if x.dit == c.info.name and x.attr == b.attr]
            kept = sum(1 for x in mine if not x.streamed)
            stored = [x.nbytes for x in mine]  # as the arena holds them (fp8 storage: fp8 bytes)
            sizes = sorted(set(stored))
            per = format_bytes(sizes[0]) if len(sizes) == 1 else f"{format_bytes(sizes[0])}–{format_bytes(sizes[-1])}"
            rows.append((c.info.name, b.attr, str(b.count), per, format_bytes(max(stored)),
                         format_bytes(sum(stored)), str(kept), str(b.count - kept), *tail))
        rows.append((c.info.name, "(non-block modules: resident)", "", "", "", format_bytes(c.info.non_block_bytes),
                     "", "", *("",) * len(tail)))
    return Sheet(f"{kind} blocks (execution order)", header, rows, right=frozenset(header[2:8]),
                 caption="; ".join(filter(None, (order_caption([c for c in dits if c.info.role == "dit"]),
                                                 experts_caption(plan)))) or None,
                 squeeze=frozenset({"block list", "expert"}), narrow_header={"bytes/block": "per block"})


def expert_roles(plan: Plan) -> dict[str, str]:
    """With two experts (Wan 2.2 A14B): what each expert's blocks do when a request starts. The first runs
    (its resident blocks and ring on the device); the other is idle, parked in host memory, until the
    pipeline's boundary step hands it the budget. Empty without experts."""
    if not plan.experts:
        return {}
    first, *others = plan.experts
    return {first.name: "running", **{e.name: "idle" for e in others}}


def experts_caption(plan: Plan) -> str | None:
    """The expert column's words in full (the column itself is one word per expert)."""
    if not plan.experts:
        return None
    first, *others = plan.experts
    idle = ", ".join(e.name for e in others)
    return (f"expert: a request starts on {first.name} (its resident blocks and ring on the device); {idle} "
            "is idle, its blocks parked in host memory, until the boundary step hands it the budget")


def order_caption(dits: list[planner.ComponentPlan]) -> str | None:
    """Where each DiT's block-list order comes from: its class's source (a guess the first forward checks)
    or a real forward (the engine corrects the order when the two differ)."""
    parts = [f"{c.info.name}: order seen in a real forward" if c.info.order_observed else
             f"{c.info.name}: order read from {c.info.class_name}'s source, checked at the first forward"
             for c in dits if len(c.info.block_lists) > 1]
    return "; ".join(parts) or None


PINNED_ON_CPU = "host memory (not pinned: CPU)"
"""A CPU has no page-locked memory: the blocks' one copy is plain host memory (as the console says)."""


def forecast_sheet(plan: Plan, on_cpu: bool = False) -> Sheet:
    f = plan.forecast
    rows = [
        ("device resident weights", format_bytes(f.device_resident_bytes)),
        ("device peak weights", format_bytes(f.peak_device_weight_bytes)),
        (PINNED_ON_CPU if on_cpu else "pinned host memory", format_bytes(f.pinned_host_bytes)),
        (f"{STREAMED_NAME.format(kind=plan.model.block_kind)} ({f.num_streamed_blocks} blocks)",
         format_bytes(f.streamed_bytes_per_forward)),
    ]
    r = plan.forward[1]  # one forward's blocks: with two experts, the running one's
    if f.num_streamed_blocks:
        each = " per expert" if plan.experts else ""
        rows.append((f"resident {plan.model.block_kind} blocks{each} ({r.placement})",
                     f"{r.num_resident} of {r.num_blocks}"))
        rows.append(("prefetch ring", f"{f.streaming_slots} slots"))
    caption = (f"peak = resident + {f.streaming_slots} × largest streamed block "
               f"({format_bytes(f.largest_streamed_block_bytes)})"
               f" + largest staged component ({format_bytes(f.largest_staged_bytes)})")
    if plan.stream_dtype is not None:
        rows.append((f"{plan.model.block_kind} weights stored in", plan.stream_dtype))
        caption += f" + upcast scratch ({format_bytes(f.upcast_scratch_bytes)})"
        if r.num_resident and plan.policy.mode == "dlo":
            rows.append(upcast_row(plan))
    if plan.experts:
        caption += (f"; two experts ({' → '.join(e.name for e in plan.experts)}), one on the device at a time: "
                    "the budget changes hands at the boundary step")
    if plan.stream_dtype is not None:
        note = planner.storage_note(plan.stream_dtype, plan.policy.fp8_modulation, plan.model.block_kind)
        caption += ". " + (note or "")
    return Sheet("forecast (from safetensors headers)", ("forecast", "bytes"), rows, right=frozenset({"bytes"}),
                 show_header=False, caption=caption)


def upcast_row(plan: Plan) -> tuple[str, str]:
    """fp8 storage: how many resident blocks are kept in the compute dtype, and the device bytes that adds."""
    r = plan.forward[1]
    extra = sum(b.device_bytes - b.nbytes for b in plan.blocks if b.kept_upcast)
    kept = f"{r.num_upcast} of {r.num_resident}" + (f" (+{format_bytes(extra)})" if extra else "")
    return (f"resident {plan.model.block_kind} blocks kept upcast (no per-forward upcast)", kept)


def request_sheet(forecast: RequestForecast, on_cpu: bool = False) -> Sheet:
    """The whole request's forecast, each figure with where it came from. On a CPU there is no
    host→device link: a copy rate there would read as one, so it is not shown."""
    step = f"{forecast.step_s:.3f} s" if forecast.step_s is not None else "unknown until measured"
    phase = forecast.peak_phase.replace('_', ' ')
    rows = [(f"device peak ({phase})", format_bytes(forecast.peak_bytes), forecast.peak_label)]
    if forecast.overhead is not None and forecast.process_peak_bytes is not None and not on_cpu:
        rows = [(f"device memory of the process ({phase})", format_bytes(forecast.process_peak_bytes),
                 forecast.peak_label),
                ("  torch allocated peak", format_bytes(forecast.peak_bytes), forecast.peak_label),
                ("  outside torch's allocations", format_bytes(forecast.process_peak_bytes - forecast.peak_bytes),
                 forecast.overhead.context_source)]
    rows.append(("step time", step, forecast.step_label))
    if forecast.floor_s is not None:
        rows.append(("step floor: max(compute, transfer)", f"{forecast.floor_s:.3f} s", forecast.step_label))
    if forecast.bandwidth and not on_cpu:
        rows.append(("host→device link", format_rate(forecast.bandwidth), forecast.bandwidth_source))
    rows.extend((c.label, c.value, "lean phase") for c in forecast.lean)
    if forecast.size.guidance is not None:  # the scale the request runs with (a guider's, where it has one)
        source = "pipeline default" if "guidance" in forecast.assumed else "--guidance"
        rows.append(("guidance scale", f"{forecast.size.guidance:g}", source))
    caption = "; ".join(([forecast.size_line] if forecast.size_line else []) + forecast.notes) or None
    return Sheet(f"request forecast ({forecast.size.label()})", ("figure", "value", "source"), rows,
                 right=frozenset({"value"}), caption=caption)


HOST_PHASES = {"load": "load", "text_encoding": "text encoding", "denoise": "denoise", "vae_decode": "VAE decode"}


def host_sheet(host: planner.HostForecast) -> Sheet:
    """The process's host memory (RSS) per phase and its parts: what a machine's RAM must hold."""
    source = "learned from a request" if host.baseline_source == "cached" else "default baseline"
    rows = [(f"host peak RSS ({HOST_PHASES.get(host.peak_phase, host.peak_phase)})", format_bytes(host.peak_bytes),
             source)]
    rows += [(f"  {HOST_PHASES.get(k, k)}", format_bytes(v), "") for k, v in host.phase_peaks.items()]
    held: dict[str, int] = {}
    for part in host.parts:  # the baseline twice (at load, then once a request ran): its larger figure
        held[part.name.removesuffix(" at load")] = max(held.get(part.name.removesuffix(" at load"), 0), part.nbytes)
    rows += [(f"  of which {name}", format_bytes(n), "") for name, n in held.items()]
    caption = "; ".join(("RSS: pinned pages included, the page cache excluded"
                         + ("; live re-plan keeps every master" if host.live_replan else ""), *host.notes))
    return Sheet("host memory forecast", ("figure", "value", "source"), rows, right=frozenset({"value"}),
                 caption=caption)


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f} s"


def ranks_sheet(ranks: planner.RankForecast, kind: str = "DiT") -> Sheet:
    """`--gpus N`: one rank's pinned memory, device peak and traffic (every rank holds the same sizes)."""
    layout, n = ranks.layout, ranks.layout.gpus
    held = f"1/{n} of each streamed block" if layout.sharded else "whole streamed blocks"
    rows = [
        (f"pinned host memory ({held} + staged)", format_bytes(ranks.pinned_host_bytes), "headers"),
        (f"pinned host memory, all {n} ranks", format_bytes(ranks.pinned_host_bytes_all_ranks), "headers"),
        ("device peak" + (" (+2 shard buffers)" if layout.sharded else ""), format_bytes(ranks.device_peak_bytes),
         ranks.device_peak_source),
        (f"host→device per {kind} forward (PCIe)", format_bytes(ranks.pcie_bytes_per_forward), "headers"),
    ]
    if layout.sharded:
        rows.append((f"gathered per {kind} forward ({ranks.gather_link})", format_bytes(ranks.nvlink_bytes_per_forward),
                     "headers"))
    rows.append(("requests at once", str(ranks.requests_at_once), layout.parallel))
    rows.append(("step floor: max(compute, copy" + (" + gather)" if layout.sharded else ")"),
                 _seconds(ranks.step_floor_s), ranks.step_floor_source))
    return Sheet(f"ranks ({n} GPUs, per rank)", ("figure", "value", "source"), rows, right=frozenset({"value"}),
                 caption=ranks.describe)


def vllm_lines(plan: Plan, layout: RankLayout | None = None) -> list[str]:
    """The vLLM-Omni equivalent of the chosen policy, one labelled line each, then what it cannot say."""
    if plan.policy.mode == "resident":
        first = "mode=resident: no offload (baseline); vLLM-Omni without DLO flags"
    else:
        first = f"flags: {planner.vllm_flags(plan)}"
    return [first, f"serve: {planner.vllm_serve_command(plan, layout)}",
            f"python: {planner.vllm_python_call(plan, layout)}",
            *(f"note: {gap}" for gap in planner.vllm_gaps(plan, layout))]


BORDERED_GAP = 3
"""Characters a boxed table spends per column on its borders and padding (plus one for the edge)."""
COMPACT_GAP = 2
"""Between columns of the borderless table used when the boxed one would not fit."""


def rich_table(sheet: Sheet, max_width: int | None = None, variables: Mapping[str, str] | None = None) -> Table:
    """A rich table that fits `max_width` without breaking a word (see `table_fit`): boxed when it fits
    whole, else borderless with cells wrapped at spaces and long free-text words cut with `…`.

    Cell styles are resolved against `variables` (a theme's), the default theme's when None.
    """
    variables = default_variables() if variables is None else variables
    header = sheet.header
    whole = {j for j, col in enumerate(header) if col in sheet.right}
    squeeze = {j for j, col in enumerate(header) if col in sheet.squeeze}
    widths = None
    compact = False
    if max_width is not None:
        boxed_room = max_width - BORDERED_GAP * len(header) - 1
        if fit_widths(header, sheet.rows, boxed_room) is not None:  # the boxed table would wrap: go compact
            compact = True
            header = tuple(sheet.narrow_header.get(col, col) for col in header)
            widths = fit_widths(header, sheet.rows, max_width - COMPACT_GAP * (len(header) - 1), squeeze, whole)
    title = Text(plain(sheet.title), style="table.title")
    caption = Text(plain(sheet.caption), style="table.caption") if sheet.caption else None
    if compact:
        table = Table(title=title, expand=False, show_header=sheet.show_header, caption=caption,
                      box=None, padding=(0, 1), pad_edge=False, show_edge=False, header_style="bold underline")
    else:
        table = Table(title=title, expand=False, show_header=sheet.show_header, caption=caption)
    for j, col in enumerate(header):
        table.add_column(col, justify="right" if j in whole else "left", overflow="ellipsis",
                         no_wrap=widths is None or j in whole, width=None if widths is None else widths[j])
    for i, row in enumerate(sheet.rows):
        table.add_row(*(Text(plain(cell), style=resolve(sheet.styles.get((i, j), ""), variables), overflow="ellipsis")
                        for j, cell in enumerate(row)))
    return table


def component_table(plan: Plan, max_width: int | None = None, variables: Mapping[str, str] | None = None) -> Table:
    return rich_table(component_sheet(plan), max_width, variables)


def blocks_table(plan: Plan, max_width: int | None = None,
                 variables: Mapping[str, str] | None = None) -> Table | None:
    sheet = blocks_sheet(plan)
    return None if sheet is None else rich_table(sheet, max_width, variables)


def _plain(value: str) -> str:
    """One field of one line: a tab or newline inside a value must not split the row, and a control
    character from the data must not reach the terminal (`plain` escapes both visibly)."""
    return plain(value)


def tsv_rows(sheet: Sheet) -> list[str]:
    return ["\t".join(_plain(cell) for cell in row) for row in (sheet.header, *sheet.rows)]


def plan_text(plan: Plan, request: RequestForecast | None = None, reasons: Sequence[str] = (),
              ranks: planner.RankForecast | None = None, on_cpu: bool = False,
              ram_reasons: Sequence[str] | None = None) -> str:
    """The whole plan as plain lines for a pipe or a file (see the module docstring)."""
    sections: list[Sequence[str]] = [[_plain(f"model: {plan.model.path} ({plan.model.pipeline_class})")],
                                     tsv_rows(component_sheet(plan))]
    if plan.model.notes:
        sections.append([_plain(f"note: {note}") for note in plan.model.notes])
    blocks = blocks_sheet(plan)
    if blocks is not None:
        sections.append(tsv_rows(blocks))
        if (experts := experts_caption(plan)) is not None:
            sections.append([_plain(experts)])
    forecast = forecast_sheet(plan, on_cpu)
    sections.append(tsv_rows(forecast))
    sections.append([_plain(forecast.caption or "")])  # its own paragraph: a table section is rows only
    if request is not None:
        sheet = request_sheet(request, on_cpu)
        sections.append(tsv_rows(sheet))
        if sheet.caption:
            sections.append([_plain(sheet.caption)])
        if request.host is not None:
            host = host_sheet(request.host)
            sections += [tsv_rows(host), [_plain(host.caption or "")]]
    if ranks is not None and ranks.layout.distributed:
        sections.append(tsv_rows(ranks_sheet(ranks, plan.model.block_kind)))
        sections.append([_plain(ranks.describe), *(_plain(f"note: {note}") for note in ranks.notes)])
    if reasons:
        sections.append(["auto-plan (--vram-budget)", *(_plain(line) for line in reasons)])
    if ram_reasons:
        sections.append(["host tiers (--ram-budget)", *(_plain(line) for line in ram_reasons)])
    layout = ranks.layout if ranks is not None else None
    sections.append(["vLLM-Omni equivalent", *(_plain(line) for line in vllm_lines(plan, layout))])
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def render_plan(plan: Plan, console: Console | None = None, forecast: RequestForecast | None = None,
                reasons: Sequence[str] = (), variables: Mapping[str, str] | None = None,
                ranks: planner.RankForecast | None = None, on_cpu: bool = False,
                ram_reasons: Sequence[str] | None = None) -> None:
    """Rich tables on a terminal; plain tab-separated rows when the output is a pipe or a file.

    On a terminal the colours are `variables`' (a theme's), the default theme's when None; a pipe gets
    no colour, so it never imports Textual or the themes.
    """
    console = console or Console()
    if not console.is_terminal:
        console.file.write(plan_text(plan, forecast, reasons, ranks, on_cpu, ram_reasons))
        console.file.flush()
        return
    variables = default_variables() if variables is None else variables
    console.print(component_table(plan, console.width, variables))
    for note in plan.model.notes:  # files discovery ignored on purpose (code, pickles)
        console.print(Text(plain(f"note: {note}"), style="dim"))
    blocks = blocks_table(plan, console.width, variables)
    if blocks is not None:
        console.print(blocks)
    console.print(rich_table(forecast_sheet(plan, on_cpu), console.width, variables))
    if forecast is not None:
        console.print(rich_table(request_sheet(forecast, on_cpu), console.width, variables))
        if forecast.host is not None:
            console.print(rich_table(host_sheet(forecast.host), console.width, variables))
    if ranks is not None and ranks.layout.distributed:
        console.print(rich_table(ranks_sheet(ranks, plan.model.block_kind), console.width, variables))
        for note in ranks.notes:
            console.print(Text(plain(f"note: {note}"), style="dim"))
    if reasons:
        console.print(Panel(Group(*(Text(plain(line)) for line in reasons)), title="--vram-budget", expand=False))
    if ram_reasons:
        console.print(Panel(Group(*(Text(plain(line)) for line in ram_reasons)), title="--ram-budget", expand=False))
    layout = ranks.layout if ranks is not None else None
    lines = [Text("vLLM-Omni equivalent", style="bold"), *(Text(plain(line)) for line in vllm_lines(plan, layout))]
    console.print(Panel(Group(*lines), expand=False))
