"""The stage-by-stage estimator equals a global event-heap simulation, query by query,
and its stage cache never changes a result; the whole-pipeline simulation of a measured
serving overhead equals both when that overhead costs nothing.

Times live on a 1/64 s grid, so simultaneous arrivals, batch completions and skip
cascades tie exactly and the tie rules are exercised, not just the easy cases.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.planner.config import StageConfig
from sloline.planner.estimator import StageCache, Workload, estimate
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import BatchLatency, IdlePenalty, PipelineProfile, StageProfile
from sloline.planner.sim.draws import ServiceMode
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
        idle = None
        if draw(st.booleans()):
            # Whole ticks at whole-tick gaps, so idle times on the grid hit the points.
            first = draw(st.integers(1, 4))
            idle = IdlePenalty(
                (first * unit, (first + draw(st.integers(1, 8))) * unit),
                (draw(st.integers(0, 1)) * unit, draw(st.integers(1, 2)) * unit),
            )
        stages[name] = {"hw": StageProfile("hw", tuple(points), idle=idle)}
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


FINE = 2.0**-20  # ~1 us: sums of such times up to hours are exact in binary floating point


@st.composite
def continuous_cases(
    draw: st.DrawFn,
) -> tuple[Topology, PipelineProfile, list[StageConfig], Workload]:
    """Random pipelines whose times lie on a very fine binary grid: independent events
    practically never coincide (drawn by numpy from a drawn seed, so that shrinking
    cannot line them up), only structural ties remain (a batch's items released at one
    instant, replicas with equal deterministic service), and sums of times are exact, so
    both simulations see the same instants (latencies agree to rounding: the hop is
    added in two halves there)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def fine(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
        return np.round(np.asarray(values, dtype=np.float64) / FINE) * FINE

    n_stages = int(rng.integers(1, 5))
    names = [f"s{m}" for m in range(n_stages)]
    deps = {n: [e for e in names[:m] if rng.random() < 0.5] for m, n in enumerate(names)}
    topology = Topology.from_deps(deps, names[-1])
    stages = {}
    for name in names:
        latency = float(fine(rng.uniform(0.01, 0.1)))
        points = []
        for b in (1, 2, 4):
            samples = tuple(fine(latency * rng.uniform(0.7, 1.5, 5)).tolist())
            points.append(BatchLatency(b, latency, latency * 1.5, latency, samples))
            latency += float(fine(rng.uniform(0.0, 0.05)))
        idle = None
        if rng.random() < 0.5:
            # Gaps a power of two apart: the interpolation is exact too.
            idle = IdlePenalty((2.0**-6, 2.0**-5), tuple(np.sort(fine(rng.uniform(0, 0.02, 2)))))
        stages[name] = {"hw": StageProfile("hw", tuple(points), idle=idle)}
    visits = None
    if rng.random() < 0.5:
        visits = rng.random((int(rng.integers(1, 7)), n_stages)) < 0.7
    profile = PipelineProfile(
        stages,
        hop_s=float(fine(rng.uniform(0.0, 0.01))),
        visits=visits,
        visit_stages=tuple(names) if visits is not None else (),
    )
    # Replicas of one stage finishing batches at one instant hand their items on batch by
    # batch in the router's order, in query order overall stage by stage: only the output
    # stage, whose items go nowhere, gets several.
    config = [StageConfig("hw", int(rng.choice([1, 2, 4])), 1) for _ in names]
    config[topology.output] = StageConfig("hw", config[topology.output].max_batch, 3)
    span = float(rng.choice([0.5, 3.0]))
    arrivals = np.sort(fine(rng.uniform(0.0, span, int(rng.integers(1, 60)))))
    workload = Workload.build(topology, profile, arrivals, seed=int(rng.integers(0, 4)))
    return topology, profile, config, workload


@pytest.mark.parametrize("mode", ["p50", "samples", "exponential"])
@settings(max_examples=40, deadline=None)
@given(case=continuous_cases(), seed=st.integers(0, 5))
def test_the_shared_simulation_without_shared_costs_is_stage_by_stage(
    mode: ServiceMode,
    case: tuple[Topology, PipelineProfile, list[StageConfig], Workload],
    seed: int,
) -> None:
    """With a router that costs no CPU, no request path, no worker CPU, one constant hop
    and unshared cores, the event-by-event simulation of the whole pipeline is the
    stage-by-stage one, including the items a batch releases at one instant (query
    order). Independent events that coincide — an arrival exactly when a batch finishes —
    go in the router's FIFO order there and in query order stage by stage: both are
    arbitrary, and these cases avoid them."""
    topology, profile, config, workload = case
    free = ServingOverhead(0.0, 0.0, 0.0, 0.0, (profile.hop_s,), (0.0,))
    shared = dataclasses.replace(profile, overhead=free)
    fast = estimate(topology, profile, config, workload, service=mode, seed=seed)
    whole = estimate(topology, shared, config, workload, service=mode, seed=seed)
    np.testing.assert_allclose(whole.latencies_s, fast.latencies_s, rtol=0.0, atol=1e-9)
    assert [s.batches for s in whole.stages] == [s.batches for s in fast.stages]


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
