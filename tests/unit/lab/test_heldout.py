"""The held-out generators: deterministic per seed, valid problems, documented shapes."""

from __future__ import annotations

import numpy as np
import pytest

from sloline.lab.heldout import fresh_seed
from sloline.lab.heldout.pipelines import CATALOG, random_pipeline
from sloline.lab.heldout.shapes import (
    SHAPES,
    flash_crowd,
    growth,
    heavy_tailed,
    mmpp,
    shape_trace,
)
from sloline.lab.report import recovery_times
from sloline.planner.planner import plan


def _same_problem(seed: int) -> None:
    a, b = random_pipeline(seed), random_pipeline(seed)
    assert a.problem.topology == b.problem.topology
    assert dict(a.problem.hardware_costs) == dict(b.problem.hardware_costs)
    assert a.problem.slo_s == b.problem.slo_s
    np.testing.assert_array_equal(a.problem.arrivals_s, b.problem.arrivals_s)
    for name, per_hw in a.problem.profile.stages.items():
        other = b.problem.profile.stages[name]
        assert set(per_hw) == set(other)
        for hw, prof in per_hw.items():
            assert prof.points == other[hw].points


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_pipeline_is_deterministic_per_seed(seed: int) -> None:
    _same_problem(seed)


def test_pipelines_differ_across_seeds() -> None:
    slos = {random_pipeline(s).problem.slo_s for s in range(10)}
    assert len(slos) == 10


def test_pipelines_cover_the_documented_space() -> None:
    pipelines = [random_pipeline(s) for s in range(40)]
    assert {p.layout for p in pipelines} == {"chain", "fan", "layered"}
    for p in pipelines:
        problem = p.problem
        assert 3 <= len(problem.topology) <= 6
        assert "model" in p.kinds.values()
        assert set(problem.hardware_costs) == set(CATALOG)
        for hw, price in problem.hardware_costs.items():
            assert 0.85 * CATALOG[hw][0] <= price <= 1.15 * CATALOG[hw][0]
        for name, kind in p.kinds.items():
            per_hw = problem.profile.stages[name]
            if kind == "model":  # batch-friendly on the GPU, faster there than on CPUs
                gpu = per_hw["gpu-large"]
                assert gpu.latency_s(gpu.cap) < gpu.cap * gpu.latency_s(1) / 2
                if "cpu-4" in per_hw:
                    assert per_hw["cpu-4"].latency_s(1) > gpu.latency_s(1)
            else:  # per-item dominated: a batch of 8 takes more than 5x one item
                assert per_hw["cpu-1"].latency_s(8) > 5 * per_hw["cpu-1"].latency_s(1)
    # the cloud's price order: the large GPU dearest, one core cheapest
    assert CATALOG["gpu-large"][0] > CATALOG["gpu-small"][0] > CATALOG["cpu-4"][0]
    assert CATALOG["cpu-4"][0] > CATALOG["cpu-1"][0]


def test_conditional_stages_are_visited_by_a_fraction() -> None:
    conditional = [p for p in (random_pipeline(s) for s in range(30)) if p.conditional]
    assert conditional
    for p in conditional:
        assert p.conditional is not None
        factor = p.problem.profile.scale_factors[p.conditional]
        assert 0.1 <= factor <= 0.6
        topo = p.problem.topology
        c = topo.stages.index(p.conditional)
        readers = [m for m, deps in enumerate(topo.deps) if c in deps]
        assert readers
        assert all(c not in topo.required[m] for m in readers)


def test_slo_is_relative_to_the_best_no_queue_latency() -> None:
    for seed in range(10):
        problem = random_pipeline(seed).problem
        fastest = [
            min(p.latency_s(1) for p in problem.profile.stages[name].values())
            + problem.profile.hop_s
            for name in problem.topology.stages
        ]
        floor, _ = problem.topology.longest_path(fastest)
        assert 1.5 * floor <= problem.slo_s <= 4.0 * floor


def test_the_planner_plans_a_held_out_pipeline() -> None:
    problem = random_pipeline(3).problem
    result = plan(problem)
    assert len(result.config) == len(problem.topology)
    assert problem.cost_per_hour(result.config) > 0.0


@pytest.mark.parametrize("shape", list(SHAPES))
def test_traces_are_deterministic_per_seed(shape: str) -> None:
    a, b = shape_trace(shape, 50.0, 60.0, 4), shape_trace(shape, 50.0, 60.0, 4)
    np.testing.assert_array_equal(a.arrivals_s, b.arrivals_s)
    np.testing.assert_array_equal(a.planning_s, b.planning_s)
    assert a.description == b.description
    c = shape_trace(shape, 50.0, 60.0, 5)
    assert not np.array_equal(a.arrivals_s, c.arrivals_s)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_traces_are_sorted_inside_the_run_with_a_separate_planning_sample(shape: str) -> None:
    trace = shape_trace(shape, 80.0, 120.0, 1)
    assert trace.name == shape
    assert np.all(np.diff(trace.arrivals_s) >= 0.0)
    assert trace.arrivals_s[0] >= 0.0 and trace.arrivals_s[-1] < 120.0
    assert trace.planning_s[-1] < 0.25 * 120.0
    assert not np.array_equal(trace.planning_s, trace.arrivals_s[: trace.planning_s.size])


def _rate(arrivals: np.ndarray, lo: float, hi: float) -> float:
    return float(np.count_nonzero((arrivals >= lo) & (arrivals < hi))) / (hi - lo)


def test_flash_crowd_reaches_its_peak_over_the_base() -> None:
    trace = flash_crowd(
        200.0, 300.0, 2, peak=4.0, start_s=100.0, ramp_s=5.0, hold_s=60.0, decay_s=20.0
    )
    base = _rate(trace.arrivals_s, 0.0, 100.0)
    peak = _rate(trace.arrivals_s, 105.0, 165.0)
    after = _rate(trace.arrivals_s, 185.0, 300.0)
    assert base == pytest.approx(200.0, rel=0.05)
    assert peak / base == pytest.approx(4.0, rel=0.05)
    assert after / base == pytest.approx(1.0, rel=0.05)
    assert trace.changes_s == (100.0,)


def test_growth_ends_at_its_factor() -> None:
    trace = growth(200.0, 300.0, 3, factor=2.5)
    start = _rate(trace.arrivals_s, 0.0, 30.0)
    end = _rate(trace.arrivals_s, 270.0, 300.0)
    assert start == pytest.approx(200.0 * (1.0 + 1.5 * 0.05), rel=0.06)
    assert end == pytest.approx(200.0 * (1.0 + 1.5 * 0.95), rel=0.06)


def test_mmpp_rate_is_the_mixture_of_its_states() -> None:
    # time-average rate = base * (calm + k * burst) / (calm + burst) over many cycles
    trace = mmpp(100.0, 4000.0, 5, burst=3.0, calm_s=30.0, burst_s=10.0)
    expected = 100.0 * (30.0 + 3.0 * 10.0) / 40.0
    assert trace.arrivals_s.size / 4000.0 == pytest.approx(expected, rel=0.1)
    counts = np.histogram(trace.arrivals_s, bins=np.arange(0.0, 4001.0, 1.0))[0]
    assert counts.var() > 2.0 * counts.mean()  # over-dispersed: bursts, not Poisson
    onsets = np.array(trace.changes_s)  # each burst's onset is a load change
    assert onsets.size > 50 and np.all(np.diff(onsets) > 0.0)
    after = np.mean([_rate(trace.arrivals_s, t, t + 2.0) for t in onsets[:-1]])
    assert after > 2.0 * 100.0


def test_heavy_tailed_inter_arrivals_have_their_cv2() -> None:
    trace = heavy_tailed(100.0, 2000.0, 6, cv2=6.0)
    gaps = np.diff(trace.arrivals_s)
    assert 1.0 / gaps.mean() == pytest.approx(100.0, rel=0.05)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(6.0, rel=0.3)


def test_diurnal_cycles_around_its_base() -> None:
    trace = shape_trace("diurnal", 100.0, 1000.0, 8)
    assert trace.arrivals_s.size / 1000.0 == pytest.approx(100.0, rel=0.1)
    per_100s = np.histogram(trace.arrivals_s, bins=10, range=(0.0, 1000.0))[0]
    assert per_100s.max() > 1.4 * per_100s.min()


def test_unknown_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown trace shape"):
        shape_trace("sawtooth", 10.0, 10.0, 0)


def test_fresh_seeds_differ() -> None:
    assert fresh_seed() != fresh_seed()


def test_no_load_change_means_no_recovery_times() -> None:
    ticks = np.arange(0.0, 10.0)
    assert recovery_times(ticks, np.zeros(10), (), 1.0) == ()
