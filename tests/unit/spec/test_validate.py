"""Pipeline validation: every problem is reported with its exact field path and reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sloline.spec import PipelineError, parse_pipeline

BASE: dict[str, Any] = {
    "apiVersion": "sloline.dev/v1alpha1",
    "kind": "PredictionPipeline",
    "metadata": {"name": "demo"},
    "spec": {
        "slo": {"latencyMs": 50},
        "workload": {"rateRps": 10},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "stages": [
            {
                "name": "a",
                "model": {"runtime": "python", "entrypoint": "m:f"},
                "inputs": [{"name": "x", "from": "x"}],
                "outputs": [
                    {"name": "y", "datatype": "FP32", "shape": [4]},
                    {"name": "score", "datatype": "FP32", "shape": [1]},
                ],
            },
            {
                "name": "b",
                "model": {"runtime": "onnx", "uri": "b.onnx"},
                "inputs": [{"name": "y", "from": "a.y"}],
                "outputs": [{"name": "z", "datatype": "FP32", "shape": [4]}],
                "when": "a.score < 0.5",
            },
            {
                "name": "c",
                "model": {"runtime": "python", "entrypoint": "m:g"},
                "inputs": [
                    {"name": "y", "from": "a.y"},
                    {"name": "z", "from": "b.z", "optional": True},
                ],
                "outputs": [{"name": "out", "datatype": "FP32", "shape": [4]}],
            },
        ],
        "output": "c",
    },
}


def doc(**edits: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for path, value in edits.items():
        node: Any = data
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if key.isdigit() else node[key]
        last = keys[-1]
        node[int(last) if last.isdigit() else last] = value
    return data


def issues_of(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(PipelineError) as info:
        parse_pipeline(data)
    return [(i.path, i.reason) for i in info.value.issues]


def test_valid_pipeline_builds_graph() -> None:
    graph = parse_pipeline(BASE)
    assert graph.order == ("a", "b", "c")
    assert graph.stages["b"].deps == ("a",)
    assert graph.stages["c"].deps == ("a", "b")
    assert graph.children["a"] == ("b", "c")
    assert graph.longest_path({"a": 1.0, "b": 2.0, "c": 3.0}) == 6.0


def test_duplicate_stage_names() -> None:
    data = doc(spec__stages__2__name="a")
    assert ("spec.stages[2].name", "duplicate stage 'a'") in issues_of(data)


def test_dangling_input_names_field() -> None:
    (path, reason), *_ = issues_of(doc(spec__stages__1__inputs__0__from="a.nope"))
    assert path == "spec.stages[1].inputs[0].from"
    assert "has no output 'nope'" in reason


def test_unknown_source() -> None:
    (path, reason), *_ = issues_of(doc(spec__stages__0__inputs__0__from="ghost"))
    assert path == "spec.stages[0].inputs[0].from"
    assert "neither a pipeline input" in reason


def test_cycle_is_reported() -> None:
    data = doc(spec__stages__0__inputs=[{"name": "x", "from": "c.out"}])
    found = issues_of(data)
    assert any("cycle" in reason and "a" in reason for _, reason in found), found


def test_unknown_output() -> None:
    assert issues_of(doc(spec__output="nope"))[0][0] == "spec.output"


def test_bad_condition_syntax_and_grammar() -> None:
    assert issues_of(doc(spec__stages__1__when="a.score <"))[0][0] == "spec.stages[1].when"
    (path, reason), *_ = issues_of(doc(spec__stages__1__when="__import__('os').system('x')"))
    assert path == "spec.stages[1].when" and "not allowed" in reason


def test_condition_must_reference_known_values() -> None:
    (path, reason), *_ = issues_of(doc(spec__stages__1__when="a.missing > 1"))
    assert path == "spec.stages[1].when" and "has no output 'missing'" in reason


def test_pydantic_errors_carry_wire_paths() -> None:
    found = issues_of(doc(spec__stages__1__model__runtime="tensorflow"))
    assert found[0][0] == "spec.stages[1].model.runtime"
    found = issues_of(doc(spec__slo__latencyMs=-1))
    assert found[0][0] == "spec.slo.latencyMs"
    found = issues_of(doc(spec__stages__0__typo=1))
    assert found[0] == ("spec.stages[0].typo", "unknown field")


def test_runtime_specific_fields() -> None:
    found = issues_of(doc(spec__stages__1__model={"runtime": "onnx"}))
    assert ("spec.stages[1].model.uri", "onnx stages need a model file") in found
    found = issues_of(doc(spec__stages__1__inputs__0__optional=True))
    assert (
        "spec.stages[1].inputs[0].optional",
        "optional inputs are only for python stages",
    ) in found


def test_workload_needs_exactly_one_source() -> None:
    found = issues_of(doc(spec__workload={"cv2": 2}))
    assert found[0][0] == "spec.workload"
    found = issues_of(doc(spec__workload={"trace": [0.0, 2.0, 1.0]}))
    assert found[0][0] == "spec.workload.trace"


def test_all_problems_reported_at_once() -> None:
    data = doc(spec__stages__2__name="a", spec__output="zzz")
    paths = {p for p, _ in issues_of(data)}
    assert {"spec.stages[2].name", "spec.output"} <= paths
