"""`sloline validate` loads every model and reports every problem at once (with `-o json`
for scripts), draws the DAG as a DAG; `plan -o json` prints the plan as JSON."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from sloline.cli import main, planning
from sloline.lab.synthetic import random_problem
from sloline.planner.planner import plan
from tests.support.serve import NOOP, build_example

DIGITS = "digits-cascade"


def noop_copy(tmp_path: Path, edit: Any = None) -> Path:
    """The no-op pipeline's folder copied, its spec changed by `edit(doc)`."""
    folder = tmp_path / "p"
    shutil.copytree(NOOP.parent, folder)
    doc = yaml.safe_load(NOOP.read_text())
    if edit is not None:
        edit(doc)
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def diamond(doc: dict[str, Any]) -> None:
    """s1 feeds s2 and s3; s4 joins them."""
    stages = doc["spec"]["stages"]
    stages[2]["inputs"] = [{"name": "x", "from": "s1.x"}]
    join = {**stages[2], "name": "s4", "inputs": [{"name": "x", "from": "s2.x"}]}
    join["model"] = {"runtime": "python", "entrypoint": "noop_stages:identity"}
    stages.append(join)
    stages[3]["when"] = "has(s3.x) && size(s3.x) > 0"
    doc["spec"]["output"] = "s4"


def validate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["validate", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_the_summary_draws_a_dag_not_a_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = validate(capsys, str(noop_copy(tmp_path, diamond)))
    assert code == 0
    assert "  s1 -> s2, s3\n" in out and "  s2 -> s4\n" in out and "  s3 -> s4" in out
    code, out, _ = validate(capsys, "-o", "json", str(noop_copy(tmp_path / "j", diamond)))
    summary = json.loads(out)
    assert code == 0 and summary["ok"] is True and summary["output"] == "s4"
    assert summary["edges"] == [["s1", "s2"], ["s1", "s3"], ["s2", "s4"], ["s3", "s4"]]


def test_a_bad_entrypoint_and_a_missing_function_are_reported_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["spec"]["stages"][0]["model"]["entrypoint"] = "noop_stages:nope"
        doc["spec"]["stages"][2]["model"]["entrypoint"] = "absent_module:f"

    code, _, err = validate(capsys, str(noop_copy(tmp_path, edit)))
    assert code == 2
    assert "spec.stages[0].model" in err and "nope" in err
    assert "spec.stages[2].model.entrypoint" in err and "absent_module" in err


def test_json_lists_every_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["spec"]["stages"][0]["model"]["entrypoint"] = "noop_stages:nope"
        doc["spec"]["stages"][1]["when"] = "s1.x < 1 and s1.x > 0"

    code, out, _ = validate(capsys, "-o", "json", str(noop_copy(tmp_path, edit)))
    result = json.loads(out)
    assert code == 2 and result["ok"] is False
    paths = {issue["path"]: issue["reason"] for issue in result["issues"]}
    assert "use && instead of and" in paths["spec.stages[1].when"]


@pytest.fixture(scope="module")
def digits() -> Path:
    return build_example(DIGITS)


def digits_copy(tmp_path: Path, digits: Path, edit: Any) -> Path:
    folder = tmp_path / "d"
    shutil.copytree(digits.parent, folder)
    doc = yaml.safe_load(digits.read_text())
    edit(doc)
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_models_that_disagree_with_the_spec_or_are_missing(
    tmp_path: Path, digits: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def edit(doc: dict[str, Any]) -> None:
        stages = doc["spec"]["stages"]
        stages[1]["outputs"][0]["shape"] = [7]  # fast.onnx gives [10]
        stages[2]["model"]["uri"] = "models/absent.onnx"

    code, _, err = validate(capsys, str(digits_copy(tmp_path, digits, edit)))
    assert code == 2
    assert "spec.stages[1].model" in err and "probabilities" in err
    assert "spec.stages[2].model" in err and "absent.onnx" in err


def test_the_digits_cascade_is_ok_and_drawn_as_a_dag(
    digits: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = validate(capsys, str(digits))
    assert code == 0
    assert "  preprocess -> fast, accurate\n" in out and "  fast -> accurate, combine\n" in out


def test_reference_errors_are_reported_beside_type_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["spec"]["slo"]["latencyMs"] = "fast"
        doc["spec"]["stages"][1]["inputs"][0]["from"] = "s9.x"
        doc["spec"]["stages"][2]["when"] = "s1.y > 0"
        doc["spec"]["output"] = "nope"

    code, _, err = validate(capsys, str(noop_copy(tmp_path, edit)))
    assert code == 2
    assert "spec.slo.latencyMs" in err
    assert "spec.stages[1].inputs[0].from" in err and "s9.x" in err
    assert "spec.stages[2].when: stage 's1' has no output 'y'" in err
    assert "spec.output: no stage named 'nope'" in err


def test_an_unexpected_exception_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(_path: object) -> None:
        raise TypeError("boom")

    monkeypatch.setattr(planning, "load_pipeline", broken)
    assert main(["validate", str(NOOP)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unexpected TypeError: boom") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_plan_json_for_scripts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan -o json` prints the plan as `--out` writes it (profiling and planning are the
    planner's tests: a synthetic problem's plan stands in for the file's)."""
    problem = random_problem(3, duration_s=10.0, rate_rps=20.0)
    planned = plan(dataclasses.replace(problem, slo_s=problem.slo_s * 1.5))
    monkeypatch.setattr(planning, "load_pipeline", lambda file: file)
    monkeypatch.setattr(planning, "plan_session", lambda *_: SimpleNamespace(plan=planned))
    assert main(["plan", "p.yaml", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(planned.to_dict()))
