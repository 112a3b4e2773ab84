"""DagRun: parallel branches, joins, conditional skips and optional inputs."""

from __future__ import annotations

import numpy as np
import pytest

from sloline.common.tensors import StageFailed, Tensor
from sloline.serving.dag import DagRun
from sloline.spec import parse_pipeline
from tests.unit.spec.test_validate import BASE, doc


def t(*values: float) -> Tensor:
    return Tensor.from_array(np.asarray(values, dtype=np.float32))


def test_condition_true_runs_branch_and_join_waits() -> None:
    run = DagRun(parse_pipeline(BASE), {"x": t(1, 2, 3, 4)})
    ready = run.start()
    assert [r.name for r in ready] == ["a"]
    assert ready[0].inputs["x"].array().tolist() == [1, 2, 3, 4]
    ready = run.complete("a", {"y": t(1, 1, 1, 1), "score": t(0.2)})
    assert [r.name for r in ready] == ["b"], "c waits for b"
    ready = run.complete("b", {"z": t(9, 9, 9, 9)})
    assert [r.name for r in ready] == ["c"]
    assert set(ready[0].inputs) == {"y", "z"}
    assert not run.finished
    run.complete("c", {"out": t(0, 0, 0, 0)})
    assert run.finished and "out" in run.output()


def test_condition_false_skips_and_optional_input_is_absent() -> None:
    run = DagRun(parse_pipeline(BASE), {"x": t(1, 2, 3, 4)})
    run.start()
    ready = run.complete("a", {"y": t(1, 1, 1, 1), "score": t(0.9)})
    assert [r.name for r in ready] == ["c"]
    assert set(ready[0].inputs) == {"y"}
    assert run.skipped == {"b"}


def test_required_input_from_skipped_stage_skips_consumer() -> None:
    data = doc(spec__stages__2__inputs__1__optional=False)
    run = DagRun(parse_pipeline(data), {"x": t(1, 2, 3, 4)})
    run.start()
    assert run.complete("a", {"y": t(1, 1, 1, 1), "score": t(0.9)}) == []
    assert run.finished and run.skipped == {"b", "c"}
    with pytest.raises(StageFailed, match="output stage 'c' was skipped"):
        run.output()


def test_parallel_roots_start_together() -> None:
    data = doc(spec__stages__1__inputs__0__from="x", spec__stages__1__when=None)
    data["spec"]["stages"][1]["inputs"][0]["name"] = "y"
    ready = DagRun(parse_pipeline(data), {"x": t(1, 2, 3, 4)}).start()
    assert [r.name for r in ready] == ["a", "b"]
