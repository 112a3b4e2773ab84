"""Topologies from pipeline specs, and planning traces (§6's gamma workloads)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.common.trace import (
    gamma_arrivals,
    mean_rate_rps,
    peak_rate_rps,
    trace_from_timestamps,
)
from sloline.planner.topology import Topology
from sloline.planner.workload import trace_for_workload
from sloline.spec import parse_pipeline
from sloline.spec.models import WorkloadSpec
from tests.unit.planner.specs import CASCADE


def test_topology_from_graph_follows_the_routers_skip_rules() -> None:
    topology = Topology.from_graph(parse_pipeline(CASCADE))
    assert topology.stages == ("fast", "slow", "combine")
    assert topology.deps == ((), (0,), (0, 1))
    # slow's condition reads fast (a skip of fast skips slow); combine reads slow optionally.
    assert topology.required == ((), (0,), (0,))
    assert topology.stages[topology.output] == "combine"


def test_longest_path_and_validation() -> None:
    topology = Topology.from_deps({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}, "d")
    assert topology.longest_path([1.0, 2.0, 5.0, 1.0]) == (7.0, ("a", "c", "d"))
    assert Topology.chain(["x", "y"]).longest_path([1.0, 2.0]) == (3.0, ("x", "y"))
    with pytest.raises(ValueError, match="cycle"):
        Topology.from_deps({"a": ["b"], "b": ["a"]}, "a")
    with pytest.raises(ValueError, match="unknown stages"):
        Topology.from_deps({"a": ["zz"]}, "a")
    with pytest.raises(ValueError, match="earlier stages"):
        Topology(("a", "b"), ((1,), ()), ((), ()), 1)


# No deadline: each example takes ~2 ms, but a scheduling stall on a loaded machine can
# stretch one past hypothesis's 200 ms and fail the test for nothing.
@settings(max_examples=30, deadline=None)
@given(st.floats(5.0, 500.0), st.sampled_from([0.25, 1.0, 4.0]), st.integers(0, 2**31))
def test_gamma_arrivals_have_the_requested_rate_and_burstiness(
    rate: float, cv2: float, seed: int
) -> None:
    arrivals = gamma_arrivals(rate, 20_000.0 / rate, cv2=cv2, seed=seed)  # ~20k arrivals
    gaps = np.diff(arrivals)
    assert np.all(gaps >= 0.0)
    assert arrivals[0] >= 0.0
    assert arrivals[-1] < 20_000.0 / rate
    assert mean_rate_rps(arrivals) == pytest.approx(rate, rel=0.05)
    assert np.var(gaps) / np.mean(gaps) ** 2 == pytest.approx(cv2, rel=0.15)
    np.testing.assert_array_equal(
        arrivals, gamma_arrivals(rate, 20_000.0 / rate, cv2=cv2, seed=seed)
    )


def test_given_timestamps_and_workload_specs() -> None:
    np.testing.assert_array_equal(trace_from_timestamps([12.0, 10.0, 10.5]), [0.0, 0.5, 2.0])
    with pytest.raises(ValueError, match="finite"):
        trace_from_timestamps([0.0, float("inf")])
    inline = trace_for_workload(WorkloadSpec(trace=[3.0, 1.0, 2.0], rate_rps=5.0))
    np.testing.assert_array_equal(inline, [0.0, 1.0, 2.0])
    generated = trace_for_workload(WorkloadSpec(rate_rps=50.0, duration_s=10.0, seed=3))
    np.testing.assert_array_equal(generated, gamma_arrivals(50.0, 10.0, seed=3))
    with pytest.raises(ValueError, match="read by the caller"):
        trace_for_workload(WorkloadSpec(trace_uri="trace.csv"))


def test_peak_rate_uses_a_sliding_window() -> None:
    arrivals = np.array([0.0, 0.01, 0.02, 0.03, 5.0, 10.0])
    assert peak_rate_rps(arrivals, 0.1) == pytest.approx(40.0)
    assert mean_rate_rps(arrivals) == pytest.approx(0.5)
