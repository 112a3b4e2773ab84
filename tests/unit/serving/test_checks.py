"""RequestChecks: the router's one check of a client request's model, version and outputs."""

from __future__ import annotations

import numpy as np
import pytest

from sloline.common.tensors import InvalidInput, ModelNotFound, Tensor
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
    assert checks.shape_outputs(outputs, None, False) == {"x": x}
    assert checks.shape_outputs(outputs, ("x",), True)["x"].shape == (1, 3)
