"""The `omni-console` argument parser: its subcommands and flags, and the argv rules argparse lacks.

Why a module of its own: the parser is most of the command line's text, and tests build it without running a
command. `--flag -5GB` is joined (`normalise_argv`) so the flag's own check answers; `--flag=--` is refused.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ..engine.api import plain, planner, probes
from ..engine.errors import ConfigError
from .args import DEFAULT_RUN_PROMPT
from .compile_flags import add_compile_flags
from .flag_types import path_name, real_number, whole_number
from .help_overview import overview
from .lora_flags import add_lora_flags

SUBCOMMANDS = ("console", "plan", "run", "demo-model")
EXIT_USAGE = 2

class UsageError(ConfigError):
    """A flag argparse cannot parse (unknown flag, missing value, not a number)."""


class WholeWordsHelpFormatter(argparse.HelpFormatter):
    """Wrap help at spaces only: `omni-high-contrast` or `--dlo-offload-components` is never split at a hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Descriptions and epilogs keep their own lines (the overview's rows), each wrapped at spaces."""
        rows = []
        for line in text.splitlines():
            lead = indent + line[:len(line) - len(line.lstrip())]
            hanging = lead + "    " if line[:1].isspace() else lead  # an indented row continues further in
            rows.append(textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=hanging,
                                      break_on_hyphens=False, break_long_words=False) if line.strip() else "")
        return "\n".join(rows)


class OneLineParser(argparse.ArgumentParser):
    """argparse prints its usage block and exits; here a bad flag is one line, like every other error."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", WholeWordsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{' '.join(message.split())} (see {self.prog} --help)")

    def format_help(self) -> str:
        """Fill help that is costly to build (the theme names import Textual) only when help is shown."""
        for action in self._actions:
            fill = getattr(action, "fill_help", None)
            if fill is not None:
                action.help = fill()
        return super().format_help()


def _theme_help() -> str:
    from ..themes import DEFAULT_THEME, THEMES

    names = ", ".join(f"{name} (default)" if name == DEFAULT_THEME else name for name in THEMES)
    return f"colour theme: {names}; press t in the app to cycle"


def _version() -> str:
    """The installed distribution's version (pyproject.toml), without importing anything heavy."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("omni-console")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _policy_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=path_name, help="diffusers model directory (default: the embedded demo model)")
    parser.add_argument("--variant", help="weight variant to read, e.g. fp16 (files NAME.fp16.safetensors); "
                                          "refused if a component with weights has no such files")
    parser.add_argument("--dlo-offload-components", metavar="JSON",
                        help='per-component policy, e.g. \'{"text_encoder": false, "default": true}\'')
    parser.add_argument("--resident-layers", type=whole_number, default=0, metavar="N",
                        help="DiT blocks kept on the device (0..number of blocks); the leading ones unless "
                             "--placement spread")
    parser.add_argument("--placement", choices=("leading", "spread"), default="leading",
                        help="which blocks stay resident: leading (vLLM-Omni's resident_layers, default) or "
                             "spread evenly between the streamed ones")
    parser.add_argument("--prefetch-slots", type=whole_number, default=2, metavar="K",
                        help="device slots of the streaming ring (>= 2, default 2): copies run K-1 blocks ahead")
    parser.add_argument("--stream-dtype", choices=("float8_e4m3fn", "float8_e5m2"), default=None,
                        help="store the DiT's weights in fp8 (diffusers' layerwise-casting rule: norms, embeddings "
                             "and projections stay in the compute dtype), upcast on the device per block: fewer "
                             "pinned and streamed bytes; outputs differ from the full-precision pipeline "
                             "(default: as the checkpoint stores them; an fp8 checkpoint streams as fp8)")
    parser.add_argument("--fp8-modulation", action="store_true",
                        help="with fp8 storage, also store the AdaLN modulation linears in fp8 (as common fp8 "
                             "checkpoints do; not diffusers' rule)")
    parser.add_argument("--upcast-resident", default="auto", metavar="auto|off|N",
                        help="with fp8 storage: resident DiT blocks kept in the compute dtype (converted once at load, "
                             "twice their fp8 device bytes, no upcast per forward); N: the first N resident blocks; "
                             "auto (default): --vram-budget weighs it, none without a budget; off: never")
    parser.add_argument("--vram-budget", metavar="SIZE",
                        help="choose encoder/VAE residency, resident blocks, placement and K for the fastest "
                             "predicted step within SIZE (e.g. 24GB, 24GiB: the device memory of the process, CUDA "
                             "context included), or auto: what the GPU has free now less a margin; overrides "
                             "--resident-layers, --placement, --prefetch-slots and a number of --upcast-resident")
    parser.add_argument("--ram-budget", metavar="SIZE",
                        help="keep the host's memory within SIZE (e.g. 32GB: the process's RSS, pinned memory "
                             "included, plus the page cache the plan reads through), or auto: what the host has "
                             "available now less a margin; each streamed block and staged encoder/VAE is then "
                             "pinned, read from the page cache or read from disk (O_DIRECT), for the fastest step")
    lean = parser.add_argument_group("lean phases (auto: only where --vram-budget needs them; on: always; off: never)")
    lean.add_argument("--stream-encoders", choices=planner.LEAN_MODES, default="auto",
                      help="stream staged text encoders layer by layer through 2 slots (exact)")
    lean.add_argument("--vae-tiling", choices=planner.LEAN_MODES, default="auto",
                      help="decode in overlapping tiles (diffusers' enable_tiling): far less memory, more time, "
                           "pixels differ")
    lean.add_argument("--vae-slicing", choices=planner.LEAN_MODES, default="auto",
                      help="decode a batch one sample at a time (diffusers' enable_slicing); never chosen by auto")
    lean.add_argument("--ff-chunking", choices=planner.LEAN_MODES, default="auto",
                      help="chunk the denoiser's feed-forward over the batch where its class supports it; "
                           "never chosen by auto")
    parser.add_argument("--mode", choices=("dlo", "resident"), default="dlo",
                        help="dlo: stream DiT blocks (default); resident: no offload (baseline)")
    parser.add_argument("--gpus", type=whole_number, default=1, metavar="N",
                        help="GPUs (ranks) serving the model (default 1); on a CPU, N rank processes")
    gather = parser.add_mutually_exclusive_group()
    gather.add_argument("--dlo-use-allgather", dest="dlo_use_allgather", action="store_true", default=None,
                        help="with --gpus N > 1 (default): each rank pins 1/N of every streamed block and the "
                             "ranks all-gather it before it runs")
    gather.add_argument("--dlo-no-use-allgather", dest="dlo_use_allgather", action="store_false", default=None,
                        help="rank-local: every rank pins and streams whole blocks")
    parser.add_argument("--parallel", choices=("dp", "cfg"), default="dp",
                        help="with --gpus N > 1: dp runs N prompts or seeds at once (default); cfg runs the two "
                             "guidance branches of one request on 2 ranks")
    add_lora_flags(parser)
    add_compile_flags(parser)


def _cache_flag(parser: argparse.ArgumentParser) -> None:
    """`--cache`, for `plan`, `run` and the console app (its first request's; `s` changes it between requests)."""
    parser.add_argument("--cache", metavar="KIND[:key=value,...]",
                        help="diffusers' step cache on the DiT: first-block, mag, taylorseer, faster, pab, sea or "
                             "off (default), its parameters under the config's own names (e.g. "
                             "first-block:threshold=0.2); with first-block and mag the streamer copies only the "
                             "blocks a step runs")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="omni-console",
        description="Operator console for layerwise-offloaded diffusion models. "
                    "Without a subcommand, opens the console app.",
    )
    parser.add_argument("--version", action="version", version=f"omni-console {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="{console,plan,run,demo-model}")

    app = sub.add_parser("console", help="open the Textual console (default)")
    _policy_flags(app)
    _cache_flag(app)
    theme = app.add_argument("--theme", metavar="NAME", help="colour theme (press t in the app to cycle)")
    theme.fill_help = _theme_help  # type: ignore[attr-defined]  # names filled in when help is printed
    app.add_argument("--telemetry-hz", type=real_number, default=probes.DEFAULT_HZ,
                     help=f"telemetry sampling rate (default {probes.DEFAULT_HZ:g})")
    app.add_argument("--preview", choices=("off", "halfblock", "auto"), default="halfblock",
                     help="step and output previews: half-block cells (default), auto (Sixel or Kitty graphics "
                          "where the terminal answers for it, not inside tmux) or off (v toggles them)")
    app.add_argument("--preview-decoder", type=path_name, default=None, metavar="PATH",
                     help="step previews decoded by a tiny autoencoder (TAESD, TAESDXL, TAESD3, TAEF1: diffusers' "
                          "AutoencoderTiny safetensors) instead of the latent→RGB factors")

    plan = sub.add_parser("plan", help="show components, residency and the forecast without loading",
                          description="Show components, residency and the forecast without loading. On a "
                                      "terminal: tables whose long names wrap. Piped or redirected: plain "
                                      "tab-separated rows (a header row per table, every value complete).")
    _policy_flags(plan)
    _cache_flag(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (schema omni-console.plan/1)")
    for name in ("--height", "--width", "--frames", "--max-sequence-length"):
        plan.add_argument(name, type=whole_number, default=None, help="request size the forecast is for (default: the "
                                                              "pipeline's)" if name == "--height" else None)
    plan.add_argument("--guidance", type=real_number, default=None)
    plan.add_argument("--device", default=None, help="device the forecast is for (default: cuda if available)")

    run = sub.add_parser("run", help="load, generate one image or video and report, without the UI")
    _policy_flags(run)
    _cache_flag(run)
    run.add_argument("--headless", action="store_true", help="accepted for compatibility: run is always headless")
    run.add_argument("--prompt", default=None, help=f"default: {DEFAULT_RUN_PROMPT!r} (a pipeline that takes one)")
    run.add_argument("--steps", type=whole_number, default=None, help="denoise steps (default: the model's)")
    run.add_argument("--height", type=whole_number, default=None)
    run.add_argument("--width", type=whole_number, default=None)
    run.add_argument("--seed", type=whole_number, default=0)
    run.add_argument("--guidance", type=real_number, default=None)
    run.add_argument("--frames", type=whole_number, default=None, metavar="N",
                     help="number of frames of a video pipeline (default: the pipeline's)")
    run.add_argument("--max-sequence-length", type=whole_number, default=None, metavar="N",
                     help="text tokens the pipeline encodes the prompt to (default: the pipeline's)")
    run.add_argument("--negative-prompt", default=None, metavar="TEXT")
    run.add_argument("--image", type=path_name, default=None, metavar="PATH",
                     help="conditioning image (image-to-video, image editing pipelines)")
    run.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="any other parameter of the pipeline's call, VALUE as JSON if it parses (repeatable)")
    run.add_argument("--fps", type=real_number, default=None,
                     help="frame rate of a video output (default: the pipeline's, else 16)")
    run.add_argument("--output", type=path_name, default=Path("out.png"),
                     help="file to write; the suffix picks the format: .png/.jpg/… (several frames: NAME-0001.png, "
                          "…), .gif/.webp (animated), .mp4 (video) (default out.png)")
    run.add_argument("--overwrite", action="store_true", help="replace --output (and --trace) if it exists")
    run.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: cuda if available)")
    run.add_argument("--json", action="store_true", help="print the report as JSON")
    run.add_argument("--trace", type=path_name, default=None, metavar="PATH",
                     help="write the request's Chrome/Perfetto trace (JSON) to PATH (--overwrite replaces it)")
    run.add_argument("--telemetry-hz", type=real_number, default=probes.DEFAULT_HZ,
                     help=f"telemetry sampling rate (default {probes.DEFAULT_HZ:g})")

    demo = sub.add_parser("demo-model", help="write the tiny random-weight Flux demo model to PATH")
    demo.add_argument("path", type=path_name)
    demo.add_argument("--seed", type=whole_number, default=0)
    parser.epilog = overview(sub.choices)  # every subcommand's flags, read from the parsers above
    return parser


# Flags whose value may start with "-" (argparse takes "-5GB" for an option and says "expected one argument")
SIGNED_VALUE_FLAGS = frozenset({"--vram-budget", "--height", "--width", "--frames", "--max-sequence-length",
                                "--steps", "--seed", "--guidance", "--fps", "--resident-layers", "--prefetch-slots",
                                "--upcast-resident", "--ram-budget",
                                "--gpus", "--telemetry-hz"})


def normalise_argv(argv: Sequence[str]) -> list[str]:
    """No subcommand means the console app; `--flag -5GB` becomes `--flag=-5GB`, so the flag's own check
    answers (a negative size, height, …) rather than argparse's "expected one argument"."""
    argv = list(argv)
    if not argv or argv[0] not in (*SUBCOMMANDS, "-h", "--help", "--version"):
        argv = ["console", *argv]
    joined: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in SIGNED_VALUE_FLAGS and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and not argv[i + 1].startswith("--"):
            joined.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        joined.append(argv[i])
        i += 1
    return joined


def refuse_dash_dash_values(argv: Sequence[str]) -> list[str]:
    """`--flag=--` is refused: argparse hands such a flag `[]`, past its type check (a traceback later)."""
    for word in argv:
        flag, equals, value = word.partition("=")
        if flag.startswith("--") and equals and value == "--":
            raise UsageError(f"{plain(flag)[:60]}: expected a value, not '--'")
    return list(argv)
