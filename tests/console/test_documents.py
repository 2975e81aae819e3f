"""The JSON documents (`plan --json`, `run --json`): real outputs are exactly what their pydantic models
describe, and the schemas published in docs/schemas/ are exactly what those models generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from omni_console.console.cli import main
from omni_console.console.schemas import SCHEMAS, schema_text
from omni_console.engine.planning.documents import PlanDocument
from omni_console.engine.service.run_report import RunReport

PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "schemas"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_published_schema_is_what_the_model_generates(name):
    published = PUBLISHED / name
    assert published.is_file(), f"{published} missing: python -m omni_console.console.schemas docs/schemas"
    assert published.read_text(encoding="utf-8") == schema_text(SCHEMAS[name]), (
        f"{published} is stale: regenerate it with python -m omni_console.console.schemas docs/schemas")


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_published_schema_names_its_version(name):
    schema = json.loads((PUBLISHED / name).read_text(encoding="utf-8"))
    version = schema["properties"]["schema"]["const"]
    assert version == {"plan.schema.json": "omni-console.plan/1",
                       "run-report.schema.json": "omni-console.run-report/1"}[name]
    assert "schema" in schema["required"]


def exact(model, document: dict) -> None:
    """`document` is valid and holds nothing the model does not: validating and printing it again changes nothing."""
    assert model.model_validate(document).to_json_dict() == document


def plan_json(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fixture", ["demo_model_dir", "sd3_model_dir", "pixart_model_dir", "wan_model_dir"])
def test_plan_json_is_a_plan_document(request, capsys, fixture):
    model_dir = request.getfixturevalue(fixture)
    document = plan_json(capsys, "--model", str(model_dir))
    assert document["schema"] == "omni-console.plan/1"
    exact(PlanDocument, document)


@pytest.mark.parametrize("policy", [
    ["--dlo-offload-components", '{"vae": false, "default": true}', "--resident-layers", "2"],
    ["--mode", "resident"],
])
def test_plan_json_under_other_policies_is_a_plan_document(demo_model_dir, capsys, policy):
    document = plan_json(capsys, "--model", str(demo_model_dir), *policy)
    exact(PlanDocument, document)
    assert {c["residency"] for c in document["components"]} >= {"resident"}


def test_run_json_of_an_image_is_a_run_report(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "out.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--json",
                 "--dlo-offload-components", '{"vae": false}']) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "omni-console.run-report/1" and report["files"] == [str(out)]
    exact(RunReport, report)


def test_run_json_of_a_video_is_a_run_report(wan_model_dir, wan_loadable, tmp_path, capsys):
    out = tmp_path / "clip.mp4"
    assert main(["run", "--model", str(wan_model_dir), "--output", str(out), "--height", "32", "--width", "32",
                 "--steps", "2", "--max-sequence-length", "32", "--frames", "5", "--fps", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "omni-console.run-report/1" and report["is_video"] and report["fps"] == 8
    exact(RunReport, report)


def test_models_refuse_what_the_schema_does_not_allow(demo_model_dir, capsys):
    """A consumer validating with these models (or the published schema) is told about a changed document."""
    document = plan_json(capsys, "--model", str(demo_model_dir))
    for broken in (
        {**document, "schema": "omni-console.plan/2"},
        {**document, "extra_key": 1},
        {**document, "components": [{**document["components"][0], "residency": "somewhere"}]},
        {**document, "forecast": {**document["forecast"], "pinned_host_bytes": -1}},
        {k: v for k, v in document.items() if k != "notes"},
    ):
        with pytest.raises(ValidationError):
            PlanDocument.model_validate(broken)
