"""Write tiny test pipelines for `python -m benchmarks.cpu_exactness --tiny-dir DIR` (the benchmark does
not import the tests' fixtures; this script, run from anywhere, writes them for it).

    python tests/write_tiny_families.py DIR [FAMILY ...]    (default: flux sd3 pixart_sigma wan)

Writes DIR/FAMILY (a model directory each, the tests' builders with seed 0) and DIR/families.json:
{family: {"pipeline": class name, "call": the family's small call kwargs}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tiny_families

BUILDERS = {"flux": "build_tiny_flux", "sd3": "build_tiny_sd3", "pixart_sigma": "build_tiny_pixart_sigma",
            "wan": "build_tiny_wan"}


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    root, families = Path(argv[0]), argv[1:] or list(BUILDERS)
    unknown = sorted(set(families) - set(BUILDERS))
    if unknown:
        print(f"unknown families: {', '.join(unknown)} (known: {', '.join(BUILDERS)})", file=sys.stderr)
        return 2
    root.mkdir(parents=True, exist_ok=True)
    index = {}
    for family in families:
        path = getattr(tiny_families, BUILDERS[family])(root / family, seed=0)
        pipeline = json.loads((path / "model_index.json").read_text())["_class_name"]
        index[family] = {"pipeline": pipeline, "call": tiny_families.FAMILY_GENERATION[family]}
    (root / "families.json").write_text(json.dumps(index, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
