"""What every benchmark shares: its common flags, the machine it ran on, and how it writes results.

Run a benchmark from the repository root as a module (`python -m benchmarks.dlo_stream --help`); the
scripts import each other as the `benchmarks` package, never through `sys.path`.

- `parser(...)`: an argparse parser with the common flags a script asks for (`--out`, `--device`,
  `--iters`) and `--csv`, so every script spells them alike.
- `environment(device)`: date (UTC), host, CPU, GPU name and driver, and the versions of Python, torch,
  CUDA, diffusers, transformers and textual: what a figure needs beside it to be compared later.
- `write(report, args)`: the report as JSON at `--out` (with `environment` added), and with `--csv` its
  every number as `key,value` rows, ratios included as the script computed them.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

AUTO = "auto"
"""`--device` default: cuda when torch sees a GPU, else cpu."""


def parser(doc: str | None, *, out: str | None = None, device: str | None = None, iters: int | None = None,
           has_out: bool = True) -> argparse.ArgumentParser:
    """A parser with the common flags. `out`: `--out`'s default (None: no file unless given); `device`:
    `--device`'s default (AUTO: cuda if available; None: no such flag); `iters`: `--iters`' default
    (None: no such flag)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if has_out:
        p.add_argument("--out", type=Path, default=None if out is None else Path(out),
                       help="write the JSON report here" + (f" (default {out})" if out else ""))
        p.add_argument("--csv", type=Path, default=None, metavar="PATH",
                       help="also write the report's numbers as key,value rows")
    if device is not None:
        p.add_argument("--device", default=default_device() if device == AUTO else device,
                       help="torch device (default: %(default)s)")
    if iters is not None:
        p.add_argument("--iters", type=int, default=iters, help="timed repetitions (default: %(default)s)")
    return p


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else the platform's word for it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _driver() -> str | None:
    """The NVIDIA driver's version (NVML, else nvidia-smi), or None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - no NVML library or no GPU: try the command, else none
        pass
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True)
        return done.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def environment(device: str | None = None) -> dict[str, Any]:
    """The machine and versions a report was measured with."""
    import torch

    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "kernel": platform.release(), "cpu": cpu_model(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "diffusers": _version("diffusers"), "transformers": _version("transformers"),
        "textual": _version("textual"), "device": device,
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["gpus"] = torch.cuda.device_count()
        env["driver"] = _driver()
    return env


def rows(report: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every scalar of a nested report as (dotted key, value); list items keyed by their index."""
    for key, value in report.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from rows(value, name + ".")
        elif isinstance(value, list | tuple):
            if all(not isinstance(v, Mapping | list | tuple) for v in value):
                yield name, " ".join(str(v) for v in value)
            else:
                yield from rows({str(i): v for i, v in enumerate(value)}, name + ".")
        else:
            yield name, value


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline rounded to 4 places (None when either is missing or the baseline is 0)."""
    if value is None or not baseline:
        return None
    return round(value / baseline, 4)


def write(report: dict[str, Any], args: argparse.Namespace, *, device: str | None = None) -> None:
    """Add the environment and write the report where the flags say (`--out` JSON, `--csv` rows)."""
    report.setdefault("environment", environment(device if device is not None else getattr(args, "device", None)))
    out = getattr(args, "out", None)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2, default=str) + "\n")  # paths among the flags
    target = getattr(args, "csv", None)
    if target:
        with open(target, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["key", "value"])
            writer.writerows(rows(report))
