"""The stage-by-stage estimator equals a global event-heap simulation, query by query,
and its stage cache never changes a result.

Times live on a 1/64 s grid, so simultaneous arrivals, batch completions and skip
cascades tie exactly and the tie rules are exercised, not just the easy cases.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.planner.config import StageConfig
from sloline.planner.estimator import ServiceMode, StageCache, Workload, estimate
from sloline.planner.profile import BatchLatency, PipelineProfile, StageProfile
from sloline.planner.topology import Topology
from tests.unit.planner.reference_des import simulate_reference

TICK = 1.0 / 64.0


@st.composite
def cases(draw: st.DrawFn) -> tuple[Topology, PipelineProfile, list[StageConfig], Workload]:
    # A coarse grid (8 ticks) makes coincident events the rule rather than the exception.
    unit = draw(st.sampled_from([1, 8])) * TICK
    n_stages = draw(st.integers(1, 4))
    deps: dict[str, list[str]] = {}
    names = [f"s{m}" for m in range(n_stages)]
    for m, name in enumerate(names):
        earlier = names[:m]
        deps[name] = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
    topology = Topology.from_deps(deps, names[-1])
    stages = {}
    for name in names:
        b1 = draw(st.integers(1, 6)) * unit
        points = [BatchLatency(1, b1, b1, b1, (b1, b1 * 2, b1 * 3))]
        latency = b1
        for b in (2, 4):
            latency += draw(st.integers(0, 4)) * unit
            points.append(BatchLatency(b, latency, latency, latency, (latency, latency + unit)))
        stages[name] = {"hw": StageProfile("hw", tuple(points))}
    n_queries = draw(st.integers(1, 40))
    span = draw(st.sampled_from([4, 30]))  # few distinct instants: many simultaneous arrivals
    ticks = draw(st.lists(st.integers(0, span), min_size=n_queries, max_size=n_queries))
    visits = None
    if draw(st.booleans()):
        rows = draw(st.integers(1, 6))
        flat = draw(st.lists(st.booleans(), min_size=rows * n_stages, max_size=rows * n_stages))
        visits = np.array(flat, dtype=np.bool_).reshape(rows, n_stages)
    profile = PipelineProfile(
        stages,
        hop_s=draw(st.integers(0, 2)) * unit,
        visits=visits,
        visit_stages=tuple(names) if visits is not None else (),
    )
    config = [
        StageConfig("hw", draw(st.sampled_from([1, 2, 3, 4])), draw(st.integers(1, 3)))
        for _ in names
    ]
    arrivals = np.sort(np.array(ticks)) * unit
    workload = Workload.build(topology, profile, arrivals, seed=draw(st.integers(0, 3)))
    return topology, profile, config, workload


@pytest.mark.parametrize("mode", ["p50", "samples", "exponential"])
@settings(max_examples=40, deadline=None)
@given(case=cases(), seed=st.integers(0, 5))
def test_stage_by_stage_equals_global_event_simulation(
    mode: ServiceMode,
    case: tuple[Topology, PipelineProfile, list[StageConfig], Workload],
    seed: int,
) -> None:
    topology, profile, config, workload = case
    fast = estimate(topology, profile, config, workload, service=mode, seed=seed)
    slow = simulate_reference(topology, profile, config, workload, service=mode, seed=seed)
    np.testing.assert_array_equal(fast.latencies_s, slow)


def test_a_replica_freeing_as_items_arrive_takes_them_all() -> None:
    """Pushes at an instant come before a completion at that instant (hand-checked)."""
    topology = Topology.chain(["a"])
    stage = StageProfile.from_latencies("hw", {1: 1.0, 2: 1.5})
    profile = PipelineProfile({"a": {"hw": stage}})
    workload = Workload.build(topology, profile, [0.0, 1.0, 1.0])
    config = [StageConfig("hw", 2, 1)]
    # q0: 0 -> 1. At t = 1, q1 and q2 are queued when the replica frees: one batch 1 -> 2.5.
    expected = [1.0, 1.5, 1.5]
    np.testing.assert_array_equal(
        estimate(topology, profile, config, workload).latencies_s, expected
    )
    np.testing.assert_array_equal(simulate_reference(topology, profile, config, workload), expected)


def test_ties_are_exercised() -> None:
    """A batch finishing upstream releases its items downstream at one instant: the idle
    downstream replica takes the first alone, the rest queue and go together next."""
    topology = Topology.chain(["a", "b"])
    stage = StageProfile.from_latencies("hw", {1: 1.0, 2: 1.5, 4: 2.0})
    profile = PipelineProfile({"a": {"hw": stage}, "b": {"hw": stage}})
    workload = Workload.build(topology, profile, [0.0, 0.0, 0.0, 0.0])
    config = [StageConfig("hw", 4, 1), StageConfig("hw", 4, 1)]
    fast = estimate(topology, profile, config, workload)
    slow = simulate_reference(topology, profile, config, workload)
    # a: [q0] 0->1, then [q1 q2 q3] 1->2.75 (batch of 3 interpolates to 1.75).
    # b: [q0] 1->2; q1 pushed first at 2.75 and alone 2.75->3.75; [q2 q3] 3.75->5.25.
    np.testing.assert_array_equal(fast.latencies_s, [2.0, 3.75, 5.25, 5.25])
    np.testing.assert_array_equal(slow, fast.latencies_s)


@settings(max_examples=30, deadline=None)
@given(
    case=cases(),
    changes=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(1, 3)), max_size=6
    ),
    max_bytes=st.sampled_from([0, 1 << 20]),
)
def test_stage_cache_never_changes_results(
    case: tuple[Topology, PipelineProfile, list[StageConfig], Workload],
    changes: list[tuple[int, int, int]],
    max_bytes: int,
) -> None:
    """Reusing unchanged stages (and evicting) gives the uncached result, bit for bit."""
    topology, profile, config, workload = case
    cache = StageCache(topology, max_bytes=max_bytes)
    for stage, batch, replicas in [(0, config[0].max_batch, config[0].replicas), *changes]:
        config = list(config)
        config[stage % len(config)] = StageConfig("hw", batch, replicas)
        cached = estimate(topology, profile, config, workload, cache=cache)
        fresh = estimate(topology, profile, config, workload)
        np.testing.assert_array_equal(cached.latencies_s, fresh.latencies_s)
        assert cached.stages == fresh.stages
    hits = cache.hits
    estimate(topology, profile, config, workload, cache=cache)
    # The last entry always survives eviction; with room, every stage is reused.
    assert cache.hits - hits == (len(topology) if max_bytes else int(len(topology) == 1))
