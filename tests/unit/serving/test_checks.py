"""RequestChecks: the router's one check of a client request's model, version and outputs."""

from __future__ import annotations

import numpy as np
import pytest

from sloline.common.tensors import InvalidInput, ModelNotFound, StageFailed, Tensor
from sloline.serving.checks import RequestChecks
from sloline.spec import load_pipeline
from tests.support.serve import NOOP


@pytest.fixture(scope="module")
def checks() -> RequestChecks:
    graph = load_pipeline(NOOP).graph
    return RequestChecks(graph, default_timeout_s=0.2, max_timeout_factor=60, max_timeout_s=600)


def test_model_name_and_version(checks: RequestChecks) -> None:
    checks.model("noop")
    checks.model("noop", "1")
    with pytest.raises(ModelNotFound, match="unknown model 'ghost'; this router serves 'noop'"):
        checks.model("ghost", "1")
    with pytest.raises(ModelNotFound, match=r"model 'noop' has no version '7'; it has \['1'\]"):
        checks.model("noop", "7")


def test_outputs_are_checked_before_and_picked_after(checks: RequestChecks) -> None:
    checks.outputs(None)
    checks.outputs(("x",))
    with pytest.raises(InvalidInput, match=r"unknown output\(s\) \['y'\]; available \['x'\]"):
        checks.outputs(("y", "x"))
    x = Tensor.from_array(np.ones(3, np.float32))
    outputs = {"x": x}
    assert checks.shape_outputs([outputs], None, None) == {"x": x}
    assert checks.shape_outputs([outputs], ("x",), 1)["x"].shape == (1, 3)


def test_rows_are_split_and_joined_in_order(checks: RequestChecks) -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    rows, count = checks.inputs({"x": Tensor.from_array(data)})
    assert count == 2
    assert [row["x"].array().tolist() for row in rows] == data.tolist()
    joined = checks.shape_outputs(rows, None, count)["x"]
    assert joined.shape == (2, 3)
    assert joined.array().tolist() == data.tolist()
    rows, count = checks.inputs({"x": Tensor.from_array(data[0])})
    assert count is None and rows[0]["x"].shape == (3,)


def test_rows_over_the_cap_or_zero_are_refused() -> None:
    graph = load_pipeline(NOOP).graph
    capped = RequestChecks(
        graph, default_timeout_s=0.2, max_timeout_factor=60, max_timeout_s=600, max_rows=4
    )
    capped.inputs({"x": Tensor.from_array(np.ones((4, 2), np.float32))})
    for rows in (5, 0):
        with pytest.raises(InvalidInput, match=rf"has {rows} rows .*takes 1 to 4 rows"):
            capped.inputs({"x": Tensor.from_array(np.ones((rows, 2), np.float32))})


def test_rows_of_different_shapes_cannot_be_answered_together(checks: RequestChecks) -> None:
    short = {"x": Tensor.from_array(np.ones(2, np.float32))}
    long = {"x": Tensor.from_array(np.ones(3, np.float32))}
    with pytest.raises(StageFailed, match="rows cannot be stacked"):
        checks.shape_outputs([short, long], None, 2)
