"""The Planner (§4.3): plans meet the SLO, no single action lowers their cost, looser SLOs
never cost more, infeasibility is explained, and the greedy is near the optimum."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.common.trace import gamma_arrivals
from sloline.lab.cg import cg_baselines
from sloline.lab.optimum import optimal_config
from sloline.lab.problems import cloud_problem
from sloline.lab.synthetic import random_problem
from sloline.planner.config import Config, StageConfig
from sloline.planner.describe import HEADROOM_MAX, HEADROOM_STEP
from sloline.planner.estimator import Workload, estimate
from sloline.planner.evaluator import Evaluation, Evaluator
from sloline.planner.overhead import ServingOverhead
from sloline.planner.planner import (
    InfeasibleError,
    initialize,
    minimize_cost,
    plan,
    plan_sweep,
)
from sloline.planner.problem import PlanningProblem, StageOverride
from sloline.planner.profile import PipelineProfile, StageProfile
from sloline.planner.topology import Topology


def small_problem(seed: int, **changes: object) -> PlanningProblem:
    problem = random_problem(seed, duration_s=8.0, max_replicas=16)
    return dataclasses.replace(problem, **changes)  # type: ignore[arg-type]


def tail_s(problem: PlanningProblem, config: Config) -> float:
    """The SLO-percentile latency of a configuration, by a fresh estimator run."""
    workload = Workload.build(
        problem.topology, problem.profile, problem.arrivals_s, seed=problem.seed
    )
    result = estimate(problem.topology, problem.profile, config, workload, seed=problem.seed)
    return result.percentile_s(problem.percentile)


def meets_slo(problem: PlanningProblem, config: Config) -> bool:
    return tail_s(problem, config) <= problem.slo_s


def swap(config: Config, m: int, stage: StageConfig) -> Config:
    return (*config[:m], stage, *config[m + 1 :])


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10_000))
def test_plans_meet_the_slo_and_no_single_action_lowers_their_cost(seed: int) -> None:
    problem = small_problem(seed)
    try:
        planned = plan(problem)
    except InfeasibleError:
        return
    config = planned.config
    assert meets_slo(problem, config)
    assert planned.tail_s <= problem.slo_s
    assert planned.cost_per_hour == pytest.approx(problem.cost_per_hour(config))
    for m, name in enumerate(problem.topology.stages):
        c = config[m]
        lo, _ = problem.replica_bounds(name)
        options = problem.batch_options(name, c.hardware)
        # RemoveReplica, at any batch size, breaks the SLO.
        if c.replicas > lo:
            for batch in options:
                assert not meets_slo(
                    problem, swap(config, m, StageConfig(c.hardware, batch, c.replicas - 1))
                )
        # IncreaseBatch (free, so the search would have taken it) breaks the SLO.
        if c.max_batch < max(options):
            doubled = StageConfig(c.hardware, min(2 * c.max_batch, max(options)), c.replicas)
            assert not meets_slo(problem, swap(config, m, doubled))
        # DowngradeHW: on the next cheaper class no (batch, replicas) that saves money holds.
        price = problem.hardware_costs[c.hardware]
        cheaper = [h for h in problem.usable_hardware(name) if problem.hardware_costs[h] < price]
        if cheaper:
            target = max(
                cheaper,
                key=lambda h: (problem.hardware_costs[h], -problem.single_latency_s(name, h)),
            )
            unit = problem.hardware_costs[target]
            for batch in problem.batch_options(name, target):
                for r in range(lo, c.replicas * int(price / unit) + 1):
                    if r * unit < c.replicas * price - 1e-9:
                        trial = swap(config, m, StageConfig(target, batch, r))
                        assert not meets_slo(problem, trial), (name, target, batch, r)


def test_cost_never_rises_as_the_slo_loosens() -> None:
    # Independent greedy runs on this case cost $1.30/h at 0.85 x SLO but $1.80/h at 1 x.
    problem = random_problem(29, n_stages=3, duration_s=8.0, max_replicas=16)
    slos = [problem.slo_s * f for f in (0.85, 1.0, 1.3, 3.0)]
    results = plan_sweep(problem, slos)
    costs = []
    for slo, result in zip(slos, results, strict=True):
        if isinstance(result, InfeasibleError):
            costs.append(math.inf)
            continue
        assert result.slo_s == slo
        assert meets_slo(dataclasses.replace(problem, slo_s=slo), result.config)
        costs.append(result.cost_per_hour)
    assert costs == sorted(costs, reverse=True)
    assert costs[0] > costs[-1]  # the sweep spans real trade-offs


def test_warm_start_never_returns_something_dearer() -> None:
    problem = small_problem(24)
    loose = dataclasses.replace(problem, slo_s=problem.slo_s * 1.25)
    tight_plan = plan(problem)
    assert plan(loose, warm_start=tight_plan.config).cost_per_hour <= tight_plan.cost_per_hour


def two_stage(rate_rps: float, slo_s: float, **overrides: StageOverride) -> PlanningProblem:
    pre = {1: 0.002, 2: 0.004, 4: 0.008}  # no faster on the GPU (Fig. 3's preprocess)
    profiles = {
        "pre": {
            "cpu": StageProfile.from_latencies("cpu", pre),
            "gpu": StageProfile.from_latencies("gpu", pre),
        },
        "dnn": {
            "cpu": StageProfile.from_latencies("cpu", {1: 0.040, 2: 0.080, 4: 0.160}),
            "gpu": StageProfile.from_latencies("gpu", {1: 0.005, 2: 0.006, 4: 0.008}),
        },
    }
    return PlanningProblem(
        topology=Topology.chain(["pre", "dnn"]),
        profile=PipelineProfile(profiles, hop_s=0.0005),
        hardware_costs={"cpu": 0.05, "gpu": 0.9},
        slo_s=slo_s,
        arrivals_s=gamma_arrivals(rate_rps, 20.0, seed=1),
        overrides=overrides,
        max_replicas=32,
        name="two-stage",
    )


def test_infeasible_slo_is_reported_with_a_reason() -> None:
    with pytest.raises(InfeasibleError) as info:
        plan(two_stage(50.0, slo_s=0.006))
    assert info.value.reason == "ServiceTimeExceedsSLO"
    assert "pre (cpu, 2.5 ms) -> dnn (gpu, 5.5 ms)" in str(info.value)
    assert "SLO 6.0 ms" in str(info.value)
    capped = two_stage(2000.0, slo_s=0.05, dnn=StageOverride(max_replicas=1, hardware="gpu"))
    with pytest.raises(InfeasibleError) as info:
        plan(capped)
    assert info.value.reason == "ReplicaLimit"
    assert "raise maxReplicas" in str(info.value)


def shared_cores_chain(cores: int, **changes: object) -> PlanningProblem:
    """Two stages in a chain on `cores` shared cores, each on 'cpu-1' (6 ms at batch 1) or
    the two-thread 'cpu-2' (5 ms by its profile), at 10 rps evenly spaced: nothing
    queues."""
    overhead = ServingOverhead(0.0, 0.0, 0.0, 0.0, (1e-5,), (0.0,), cores=cores)
    two_threads = StageProfile.from_latencies("cpu-2", {1: 0.005, 2: 0.008})
    stage = {
        "cpu-1": StageProfile.from_latencies("cpu-1", {1: 0.006, 2: 0.010}),
        "cpu-2": dataclasses.replace(two_threads, cores=2),
    }
    problem = PlanningProblem(
        topology=Topology.chain(["a", "b"]),
        profile=PipelineProfile({"a": stage, "b": stage}, hop_s=1e-5, overhead=overhead),
        hardware_costs={"cpu-1": 0.05, "cpu-2": 0.10},
        slo_s=0.015,
        arrivals_s=np.arange(0.0, 20.0, 0.1),
        max_replicas=4,
        name="shared",
    )
    return dataclasses.replace(problem, **changes)  # type: ignore[arg-type]


def test_with_shared_cores_a_start_other_than_the_fastest_hardware_is_found() -> None:
    """On one shared core a two-thread replica runs at half speed, so 'cpu-2' (fastest by
    its profile: 5 ms) takes 10 ms in situ and 'cpu-1' 6 ms; more replicas add nothing.
    Two stages in a chain at low load: 20 ms from the paper's start, 12 ms on cpu-1."""
    problem = shared_cores_chain(1)
    fastest = tuple(StageConfig("cpu-2", 1, 1) for _ in range(2))
    assert tail_s(problem, fastest) > problem.slo_s  # the paper's start, at any growth
    planned = plan(problem)
    assert [s.hardware for s in planned.stages] == ["cpu-1", "cpu-1"]
    assert planned.tail_s <= problem.slo_s


def test_with_shared_cores_no_stage_grows_past_the_replicas_that_fit_on_them() -> None:
    """Two cores shared: a third one-thread replica (a second two-thread one) of a stage
    adds no throughput. A load far beyond the cores is declared infeasible without growing
    any stage further, naming the cores, where the bound of 256 took minutes."""
    problem = shared_cores_chain(
        2,
        slo_s=0.05,
        arrivals_s=gamma_arrivals(2000.0, 2.0, seed=1),  # 12 cores of work at batch 1
        max_replicas=256,
    )
    seen: list[Config] = []

    class Recording(Evaluator):
        def evaluate(self, config: Config) -> Evaluation:
            seen.append(config)
            return super().evaluate(config)

    with pytest.raises(InfeasibleError) as info:
        plan(problem, Recording(problem))
    assert info.value.reason == "ReplicaLimit"
    assert "or on all 2 cores the workers share" in str(info.value)
    assert seen
    for config in seen:
        for c in config:
            assert c.replicas <= (1 if c.hardware == "cpu-2" else 2), config


def test_a_loose_slo_moves_the_dnn_to_the_cheaper_hardware_and_batches() -> None:
    tight = plan(two_stage(60.0, slo_s=0.03))
    loose = plan(two_stage(60.0, slo_s=0.5))
    assert tight.stage("dnn").hardware == "gpu"
    assert loose.stage("dnn").hardware == "cpu"
    assert loose.cost_per_hour < tight.cost_per_hour
    assert tight.tail_s <= 0.03
    assert loose.tail_s <= 0.5


def test_batch_sizes_whose_batch_alone_misses_the_slo_are_not_options() -> None:
    problem = two_stage(60.0, slo_s=0.1)
    assert problem.batch_options("dnn", "cpu") == (1, 2)  # b=4 takes 160 ms > 100 ms
    assert problem.batch_options("dnn", "gpu") == (1, 2, 4)
    dnn = plan(problem).stage("dnn")
    assert dnn.hardware == "gpu" or dnn.max_batch <= 2


def test_pins_and_replica_bounds_are_respected() -> None:
    problem = two_stage(
        60.0,
        slo_s=0.5,
        pre=StageOverride(replicas=3),
        dnn=StageOverride(hardware="gpu", max_batch=2, min_replicas=2),
    )
    planned = plan(problem)
    assert planned.stage("pre").replicas == 3
    dnn = planned.stage("dnn")
    assert (dnn.hardware, dnn.max_batch) == ("gpu", 2)
    assert dnn.replicas >= 2
    with pytest.raises(ValueError, match="pinned to 'tpu'"):
        two_stage(60.0, 0.5, dnn=StageOverride(hardware="tpu"))
    with pytest.raises(ValueError, match="maxBatch 8 exceeds the profiled batch cap"):
        two_stage(60.0, 0.5, dnn=StageOverride(max_batch=8))


def test_plan_carries_what_the_tuner_needs() -> None:
    problem = two_stage(80.0, slo_s=0.05)
    planned = plan(problem)
    rate = planned.rate_rps
    arrivals = problem.arrivals_s
    assert rate == pytest.approx((arrivals.size - 1) / (arrivals[-1] - arrivals[0]))
    for stage in planned.stages:
        profile = problem.stage_profile(stage.name, stage.hardware)
        assert stage.throughput_rps == pytest.approx(
            stage.max_batch / profile.latency_s(stage.max_batch)
        )
        assert stage.rho == pytest.approx(
            rate * stage.scale_factor / (stage.replicas * stage.throughput_rps)
        )
        # Algorithm 3 scales the planned replicas with the rate: k_m = ceil(reps * r_max / λ).
        r_max = 3.0 * rate
        k_m = math.ceil(r_max * stage.scale_factor / (stage.throughput_rps * stage.rho) - 1e-9)
        assert k_m == math.ceil(stage.replicas * 3.0 - 1e-9)
    windows = planned.envelope.windows_s
    assert windows[-1] <= 20.0
    assert all(b == pytest.approx(2 * a) for a, b in itertools.pairwise(windows))
    assert planned.envelope.rates_rps[-1] == pytest.approx(rate, rel=0.1)


@pytest.mark.parametrize("seed", [3, 8, 21])
def test_headroom_is_the_rate_multiple_at_which_the_plan_stops_meeting_the_slo(
    seed: int,
) -> None:
    problem = random_problem(seed, duration_s=20.0)
    planned = plan(problem)

    def holds(x: float) -> bool:
        faster = dataclasses.replace(problem, arrivals_s=problem.arrivals_s / x)
        return Evaluator(faster).feasible(planned.config)

    x = planned.headroom
    assert 1.0 <= x < HEADROOM_MAX
    assert holds(x) and not holds(x * HEADROOM_STEP)


def test_cg_baselines_replicate_the_whole_pipeline() -> None:
    problem = two_stage(80.0, slo_s=0.03)
    evaluator = Evaluator(problem)
    planned = plan(problem, evaluator)
    mean, peak = cg_baselines(problem, evaluator)
    assert (mean.name, peak.name) == ("cg-mean", "cg-peak")
    assert peak.rate_rps > mean.rate_rps > 70.0
    assert mean.hardware == peak.hardware == "gpu"  # the CPU cannot serve dnn within 30 ms
    # Largest batch whose service time fits: pre 8 ms + dnn 8 ms + 2 hops at batch 4.
    assert mean.max_batch == peak.max_batch == 4
    # Units: every stage keeps up with the rate (pre on the GPU class serves 500 rps).
    assert mean.units == max(1, math.ceil(mean.rate_rps / 500.0))
    assert peak.units >= mean.units
    assert mean.cost_per_hour == pytest.approx(mean.units * 2 * 0.9)
    assert planned.cost_per_hour < mean.cost_per_hour  # fine-grained beats coarse-grained


@pytest.mark.parametrize("seed", range(10))
def test_greedy_is_near_the_optimum_on_small_random_pipelines(seed: int) -> None:
    problem = random_problem(seed, n_stages=2 + seed % 2, duration_s=10.0, max_replicas=16)
    optimum = optimal_config(problem, budget=5_000)
    assert optimum.proven
    evaluator = Evaluator(problem)
    try:
        greedy = minimize_cost(problem, evaluator, initialize(problem, evaluator))
    except InfeasibleError:
        assert optimum.config is None  # never infeasible when a feasible plan exists
        return
    assert optimum.config is not None
    cost = problem.cost_per_hour(greedy)
    assert cost >= optimum.cost_per_hour - 1e-9  # the search is exact: nothing beats it
    assert cost <= 1.10 * optimum.cost_per_hour


def test_the_paper_literal_greedy_can_stall_where_ours_does_not() -> None:
    problem = random_problem(18, n_stages=2, duration_s=10.0, max_replicas=16)
    evaluator = Evaluator(problem)
    start = initialize(problem, evaluator)
    literal = problem.cost_per_hour(minimize_cost(problem, evaluator, start, "inferline"))
    ours = problem.cost_per_hour(minimize_cost(problem, evaluator, start, "sloline"))
    optimum = optimal_config(problem, evaluator)
    assert optimum.proven
    assert optimum.config is not None
    assert meets_slo(problem, optimum.config)
    assert np.isclose(optimum.cost_per_hour, problem.cost_per_hour(optimum.config))
    assert ours == pytest.approx(optimum.cost_per_hour)
    assert literal > 1.5 * optimum.cost_per_hour


def seeded_problems() -> list[PlanningProblem]:
    synthetic = [random_problem(s, duration_s=8.0, max_replicas=16) for s in (24, 41, 5)]
    cloud = [cloud_problem(s, duration_s=8.0, max_replicas=16) for s in (29, 32, 33, 46)]
    return synthetic + cloud


@pytest.mark.parametrize("problem", seeded_problems(), ids=lambda p: p.name)
def test_multi_start_is_never_dearer_than_the_greedy_and_meets_the_slo(
    problem: PlanningProblem,
) -> None:
    greedy = plan(problem, search="greedy")
    ours = plan(problem)
    assert ours.cost_per_hour <= greedy.cost_per_hour + 1e-9
    assert meets_slo(problem, ours.config)
    assert meets_slo(problem, greedy.config)


def affine(hardware: str, fixed_s: float, per_item_s: float) -> StageProfile:
    return StageProfile.from_latencies(
        hardware, {b: fixed_s + b * per_item_s for b in (1, 2, 4, 8, 16, 32)}
    )


def test_multi_start_escapes_a_cheap_slow_class_that_spends_the_latency_budget() -> None:
    # Two GPU stages; the slow class costs a third and is 2.5x slower. The greedy's biggest
    # first saving moves a stage to it, which leaves too little of the SLO for batching:
    # both stages on the fast class at a large batch are cheaper.
    profiles = {
        name: {"fast": affine("fast", 0.010, 0.0005), "slow": affine("slow", 0.025, 0.00125)}
        for name in ("a", "b")
    }
    problem = PlanningProblem(
        topology=Topology.chain(["a", "b"]),
        profile=PipelineProfile(profiles, hop_s=0.0005),
        hardware_costs={"fast": 3.0, "slow": 1.0},
        slo_s=0.060,
        arrivals_s=gamma_arrivals(200.0, 10.0, cv2=1.0, seed=1),
        max_replicas=16,
    )
    optimum = optimal_config(problem, budget=20_000)
    assert optimum.proven
    assert optimum.config is not None
    greedy = plan(problem, search="greedy")
    ours = plan(problem)
    assert greedy.cost_per_hour > 1.25 * optimum.cost_per_hour
    assert ours.cost_per_hour == pytest.approx(optimum.cost_per_hour)
    assert meets_slo(problem, ours.config)
    assert {c.hardware for c in ours.config} == {"fast"}


def test_multi_start_takes_a_gpu_replica_off_where_the_stage_before_must_grow() -> None:
    # The greedy stops at two GPU replicas at batch 16; one suffices only once the CPU
    # stage before it has three or more replicas: no single action gets there.
    problem = random_problem(47)
    optimum = optimal_config(problem, budget=20_000)
    assert optimum.proven
    greedy = plan(problem, search="greedy")
    ours = plan(problem)
    assert greedy.cost_per_hour > 1.5 * optimum.cost_per_hour
    assert ours.cost_per_hour == pytest.approx(optimum.cost_per_hour)
    assert ours.config[1].replicas == 1
    assert meets_slo(problem, ours.config)


def test_multi_start_moves_a_cpu_stage_back_to_two_cores_to_free_a_gpu_replica() -> None:
    # Two CPU stages feed two slow-GPU stages. The descents leave the CPU stages on the
    # one-core class, whose longer service spends the latency budget; the second GPU
    # replica of s2 then cannot go, though with s0 back on two cores it can: a move on
    # two stages at once (one replica fewer on s2, s0 faster), then the descent.
    problem = cloud_problem(1054)
    ours = plan(problem)
    greedy = plan(problem, search="greedy")
    optimum = optimal_config(problem, incumbent=ours.config, budget=100_000)
    assert optimum.proven
    assert greedy.cost_per_hour > 1.25 * optimum.cost_per_hour
    assert ours.cost_per_hour <= 1.10 * optimum.cost_per_hour
    assert sum(c.replicas for c in ours.config if c.hardware == "gpu-slow") == 2
    assert meets_slo(problem, ours.config)
