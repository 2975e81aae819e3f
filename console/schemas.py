"""The published JSON schemas of the CLI's documents, generated from their pydantic models.

`python -m omni_console.console.schemas docs/schemas` (in the checkout) writes them;
tests/test_documents.py fails when a published file differs from what the models generate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from ..engine.api import planner, service

SCHEMAS: dict[str, type[BaseModel]] = {
    "plan.schema.json": planner.PlanDocument,
    "run-report.schema.json": service.RunReport,
}


def schema_text(model: type[BaseModel]) -> str:
    """The schema of the document as printed (serialization mode, wire names), as the published file holds it."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              **model.model_json_schema(by_alias=True, mode="serialization")}
    return json.dumps(schema, indent=2) + "\n"


def write_schemas(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in SCHEMAS.items():
        path = folder / name
        path.write_text(schema_text(model), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m omni_console.console.schemas FOLDER", file=sys.stderr)
        return 2
    for path in write_schemas(Path(argv[0])):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
