"""Pipeline validation: every problem is reported with its exact field path and reason."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from sloline.common.trace import MAX_PLANNING_ARRIVALS, arrival_problem
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
    assert path == "spec.stages[1].when" and "not supported" in reason


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


# Workloads that the planner cannot plan for: (spec.workload, field path, reason), the
# reason naming the limit where there is one. The CLI tests and the trace file tests
# (`traceUri`, `sloline simulate --trace FILE`) reuse them.
BAD_WORKLOADS: list[tuple[dict[str, Any], str, str]] = [
    ({"trace": []}, "spec.workload.trace", "at least 2 distinct arrival times (got 0"),
    ({"trace": [1.5]}, "spec.workload.trace", "at least 2 distinct arrival times (got 1"),
    ({"trace": [2.0, 2.0, 2.0]}, "spec.workload.trace", "got 3 arrival(s) at 1 distinct"),
    ({"trace": [0.0, float("nan"), 1.0]}, "spec.workload.trace", "finite numbers of seconds"),
    ({"trace": [0.0, float("inf")]}, "spec.workload.trace", "finite numbers of seconds"),
    ({"trace": [-1.0, 0.0, 1.0]}, "spec.workload.trace", ">= 0 seconds (found -1)"),
    ({"trace": [0.0, 1e-6]}, "spec.workload.trace", "planner simulates at most 100,000 rps"),
    ({"rateRps": 1e9}, "spec.workload.rateRps", "less than or equal to 100000"),
    ({"rateRps": 1e6}, "spec.workload.rateRps", "less than or equal to 100000"),
    ({"rateRps": float("inf")}, "spec.workload.rateRps", "less than or equal to 100000"),
    (
        {"rateRps": 1e5, "durationS": 60},
        "spec.workload",
        "6,000,000 arrivals; the planner simulates at most 2,000,000",
    ),
]


@pytest.mark.parametrize(("workload", "path", "reason"), BAD_WORKLOADS)
def test_workloads_the_planner_cannot_simulate_are_rejected(
    workload: dict[str, Any], path: str, reason: str
) -> None:
    found = issues_of(doc(spec__workload=workload))
    assert len(found) == 1 and found[0][0] == path and reason in found[0][1], found


def test_too_many_trace_arrivals_are_rejected() -> None:
    """Counted before anything else is checked, so the limit is cheap to enforce."""
    problem = arrival_problem(np.arange(MAX_PLANNING_ARRIVALS + 1, dtype=np.float64))
    assert problem == "2,000,001 arrivals; the planner simulates at most 2,000,000 arrivals " + (
        "per planning trace"
    )


@pytest.mark.parametrize(
    "workload",
    [
        {"trace": [0.0, 0.0, 0.5]},
        {"trace": [0.0, 1e-5]},  # 100,000 rps exactly
        {"rateRps": 1e5, "durationS": 20},  # 2,000,000 arrivals exactly
        {"rateRps": 0.001, "durationS": 86_400},
    ],
)
def test_workloads_at_the_limits_are_valid(workload: dict[str, Any]) -> None:
    parse_pipeline(doc(spec__workload=workload))


def test_all_problems_reported_at_once() -> None:
    data = doc(spec__stages__2__name="a", spec__output="zzz")
    paths = {p for p, _ in issues_of(data)}
    assert {"spec.stages[2].name", "spec.output"} <= paths
