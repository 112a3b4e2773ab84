"""The closed-loop simulator: dispatch semantics, replica changes over time, the
reactive baselines' arithmetic, the traces, the report and the end-to-end comparison."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.lab.autoscalers import (
    AutoScaleSettings,
    HpaSettings,
    HpaStage,
    KpaSettings,
    KpaStage,
    RaySettings,
    RayStage,
    autoscale_step,
    hpa_recommendation,
    hpa_step,
    kpa_step,
    ray_step,
)
from sloline.lab.engine import EngineSettings, run_closed_loop, simulated_profile
from sloline.lab.loop import Observation, Policy, StageView
from sloline.lab.report import SimulationReport, recovery_times, rolling_tail
from sloline.lab.simulate import POLICIES, SimulationSettings, build_policy, simulate
from sloline.lab.synthetic import random_problem
from sloline.lab.traces import (
    Trace,
    autoscale_trace,
    burst_trace,
    modulated_arrivals,
    ramp_trace,
    spike_trace,
)
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload, estimate
from sloline.planner.overhead import IdlePenalty, ServingOverhead
from sloline.planner.planner import plan
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import BatchLatency, PipelineProfile, StageProfile
from sloline.planner.sim.draws import ServiceMode
from sloline.planner.topology import Topology
from sloline.tuner.replan import ReplanSettings

TICK = 1.0 / 64.0


# -- the engine equals the estimator on static configurations ------------------------------


@st.composite
def cases(draw: st.DrawFn) -> tuple[Topology, PipelineProfile, list[StageConfig], Workload]:
    """Small DAGs with conditional visits and times on a 1/64 s grid, so that arrivals,
    completions and skip cascades tie exactly."""
    n_stages = draw(st.integers(1, 4))
    names = [f"s{m}" for m in range(n_stages)]
    deps = {
        name: draw(st.lists(st.sampled_from(names[:m]), unique=True)) if m else []
        for m, name in enumerate(names)
    }
    topology = Topology.from_deps(deps, names[-1])
    stages = {}
    for name in names:
        b1 = draw(st.integers(1, 12)) * TICK
        points = [BatchLatency(1, b1, b1, b1, (b1, b1 * 2, b1 * 3))]
        latency = b1
        for b in (2, 4):
            latency += draw(st.integers(0, 8)) * TICK
            points.append(BatchLatency(b, latency, latency, latency, (latency, latency + TICK)))
        stages[name] = {"hw": StageProfile("hw", tuple(points))}
    n_queries = draw(st.integers(1, 40))
    ticks = sorted(draw(st.lists(st.integers(0, 200), min_size=n_queries, max_size=n_queries)))
    visits = None
    if draw(st.booleans()):
        rows = draw(st.integers(1, 6))
        flat = draw(st.lists(st.booleans(), min_size=rows * n_stages, max_size=rows * n_stages))
        visits = np.array(flat, dtype=np.bool_).reshape(rows, n_stages)
    profile = PipelineProfile(
        stages,
        hop_s=draw(st.integers(0, 3)) * TICK,
        visits=visits,
        visit_stages=tuple(names) if visits is not None else (),
    )
    config = [
        StageConfig("hw", draw(st.sampled_from([1, 2, 3, 4])), draw(st.integers(1, 3)))
        for _ in names
    ]
    workload = Workload.build(
        topology, profile, np.array(ticks) * TICK, seed=draw(st.integers(0, 3))
    )
    return topology, profile, config, workload


@st.composite
def overheads(draw: st.DrawFn) -> ServingOverhead | None:
    """None, or a router with CPU per request, batch and item (from nothing to enough to
    saturate it), an idle penalty, hop and request-path samples, and maybe shared cores."""
    if not draw(st.booleans()):
        return None
    cpu = [draw(st.integers(0, 4)) * TICK / 4 for _ in range(3)]
    return ServingOverhead(
        cpu[0],
        cpu[1],
        cpu[2] / 4,
        draw(st.integers(0, 2)) * TICK / 8,
        tuple(draw(st.integers(0, 4)) * TICK / 4 for _ in range(3)),
        tuple(draw(st.integers(0, 4)) * TICK / 4 for _ in range(2)),
        cores=draw(st.sampled_from([None, 1, 2])),
        router_idle=IdlePenalty((TICK, 4 * TICK), (0.0, TICK / 2)) if draw(st.booleans()) else None,
    )


@pytest.mark.parametrize("mode", ["p50", "samples", "exponential"])
@settings(max_examples=30, deadline=None)
@given(case=cases(), seed=st.integers(0, 5), overhead=overheads(), routers=st.integers(1, 3))
def test_static_policy_gives_the_estimators_latencies_exactly(
    mode: ServiceMode,
    case: tuple[Topology, PipelineProfile, list[StageConfig], Workload],
    seed: int,
    overhead: ServingOverhead | None,
    routers: int,
) -> None:
    """The engine is the estimator's event simulation: the same latencies as the estimate
    of the profile it simulates, the router, hops, request paths, shared cores and
    several routers included, up to where the router saturates; to rounding, as its
    ticks split the shared cores' clocks into more steps (for a profile without a
    measured overhead, a router that costs nothing; ``tests/unit/planner/
    test_equivalence.py`` shows that this is the stage-by-stage estimate)."""
    topology, profile, config, workload = case
    profile = dataclasses.replace(profile, overhead=overhead)
    expected = estimate(
        topology,
        simulated_profile(profile),
        config,
        workload,
        service=mode,
        seed=seed,
        routers=routers,
    )
    run = run_closed_loop(
        topology,
        profile,
        workload,
        Policy("static", tuple(config), routers=routers),
        duration_s=float(workload.arrivals_s[-1]) + 1.0,
        settings=EngineSettings(service=mode, seed=seed),
    )
    np.testing.assert_allclose(run.latencies_s, expected.latencies_s, rtol=0.0, atol=1e-9)


def test_a_planned_pipeline_matches_the_estimator_query_by_query() -> None:
    problem = random_problem(5, duration_s=20.0)
    chosen = plan(problem)
    config = tuple(StageConfig(s.hardware, s.max_batch, s.replicas) for s in chosen.stages)
    workload = Workload.build(problem.topology, problem.profile, problem.arrivals_s)
    expected = estimate(problem.topology, problem.profile, config, workload)
    run = run_closed_loop(
        problem.topology, problem.profile, workload, Policy("plan", config), duration_s=20.0
    )
    # the stage-by-stage estimate adds each hop whole, the engine in two halves
    np.testing.assert_allclose(run.latencies_s, expected.latencies_s, rtol=0.0, atol=1e-12)
    # Static: no events, the billed replicas are the plan's for the whole horizon.
    assert run.events == ()
    assert run.replica_s == pytest.approx([c.replicas * 20.0 for c in config])


# -- replicas changing over time ------------------------------------------------------------


def one_stage(service_s: float, max_batch: int = 1) -> tuple[Topology, PipelineProfile]:
    sizes = {b: service_s for b in (1, 2, 4) if b <= max(1, max_batch)}
    stage = StageProfile.from_latencies("hw", sizes)
    return Topology.chain(["a"]), PipelineProfile({"a": {"hw": stage}})


def scripted(name: str, replicas: int, script: dict[float, int], max_batch: int = 1) -> Policy:
    """A policy that sets the replicas at given tick times and otherwise keeps them."""

    def step(observation: Observation, state: None) -> tuple[tuple[int, ...], None]:
        current = observation.stages[0].desired
        return (script.get(observation.now_s, current),), state

    return Policy(name, (StageConfig("hw", max_batch, replicas),), step)


@pytest.mark.parametrize("packing", [False, True])
def test_idle_replicas_take_work_longest_idle_first_or_packed(packing: bool) -> None:
    """Three replicas, one query of 10 ms every 100 ms: the router's rule spreads them
    over all three (none idle for long); AutoScale's index packing serves them all on
    one, so that the other two stay idle from the start."""
    topology, profile = one_stage(0.01)
    workload = Workload.build(topology, profile, np.arange(0.05, 5.0, 0.1))
    seen: list[tuple[float, ...]] = []

    def step(observation: Observation, state: None) -> tuple[tuple[int, ...], None]:
        seen.append(observation.stages[0].idle_for_s)
        return (3,), state

    policy = Policy("p", (StageConfig("hw", 1, 3),), step, index_packing=packing)
    run_closed_loop(topology, profile, workload, policy, duration_s=4.0)
    assert len(seen) == 4 and all(len(idle) == 3 for idle in seen)
    long_idle = [sum(1 for s in idle if s > 0.5) for idle in seen]
    assert long_idle == ([2, 2, 2, 2] if packing else [0, 0, 0, 0])


def test_a_scale_up_serves_only_after_the_activation_delay() -> None:
    topology, profile = one_stage(10.0)
    workload = Workload.build(topology, profile, [0.5, 0.5, 0.5])
    run = run_closed_loop(topology, profile, workload, scripted("up", 1, {2.0: 3}), duration_s=12.0)
    # q0 takes the only replica at 0.5; q1 and q2 wait for the two replicas that the
    # decision at t = 2 starts and that serve from t = 2 + 5 = 7.
    np.testing.assert_array_equal(run.latencies_s, [10.0, 16.5, 16.5])
    ticks = run.ticks_s.tolist()
    assert run.desired[ticks.index(2.0), 0] == 3  # asked for (and paid) at once
    assert run.billed[ticks.index(2.0), 0] == 3
    assert run.ready[ticks.index(6.0), 0] == 1
    assert run.ready[ticks.index(7.0), 0] == 3  # ready at t + delay, not earlier
    assert [(e.time_s, e.from_replicas, e.to_replicas) for e in run.events] == [(2.0, 1, 3)]


def test_the_activation_delay_is_a_setting() -> None:
    topology, profile = one_stage(10.0)
    workload = Workload.build(topology, profile, [0.5, 0.5])
    run = run_closed_loop(
        topology,
        profile,
        workload,
        scripted("up", 1, {2.0: 2}),
        duration_s=4.0,
        settings=EngineSettings(activation_delay_s=0.0),
    )
    np.testing.assert_array_equal(run.latencies_s, [10.0, 11.5])  # served from t = 2


def test_a_starting_replica_is_not_requested_twice() -> None:
    topology, profile = one_stage(1.0)
    workload = Workload.build(topology, profile, [0.1])
    # The policy keeps asking for 2 while the second replica is still starting.
    run = run_closed_loop(
        topology, profile, workload, scripted("up", 1, {1.0: 2, 2.0: 2, 3.0: 2}), duration_s=8.0
    )
    assert run.billed.max() == 2
    assert len(run.events) == 1


def test_scale_down_removes_an_idle_replica_and_lets_a_busy_one_finish() -> None:
    topology, profile = one_stage(10.0)
    workload = Workload.build(topology, profile, [0.5, 12.0])
    run = run_closed_loop(
        topology, profile, workload, scripted("down", 2, {1.0: 1}), duration_s=14.0
    )
    ticks = run.ticks_s.tolist()
    # At t = 1 one replica is busy with q0 (until 10.5), the other idle: the idle one goes.
    assert run.billed[ticks.index(1.0), 0] == 1
    np.testing.assert_array_equal(run.latencies_s, [10.0, 10.0])


def test_a_busy_replica_that_is_removed_finishes_its_batch_first() -> None:
    topology, profile = one_stage(10.0, max_batch=1)
    workload = Workload.build(topology, profile, [0.5, 0.5, 0.5])
    run = run_closed_loop(
        topology, profile, workload, scripted("down", 2, {1.0: 1}), duration_s=25.0
    )
    ticks = run.ticks_s.tolist()
    # Both replicas are busy at t = 1: one is marked to leave and is paid until 10.5.
    assert run.billed[ticks.index(10.0), 0] == 2
    assert run.billed[ticks.index(11.0), 0] == 1
    assert run.ready[ticks.index(1.0), 0] == 1
    np.testing.assert_array_equal(run.latencies_s, [10.0, 10.0, 20.0])


@settings(max_examples=25, deadline=None)
@given(
    targets=st.lists(st.integers(1, 4), min_size=1, max_size=30),
    gaps=st.lists(st.integers(0, 40), min_size=5, max_size=60),
    delay=st.sampled_from([0.0, 1.0, 5.0]),
)
def test_scaling_never_drops_or_delays_a_query_beyond_reason(
    targets: list[int], gaps: list[int], delay: float
) -> None:
    topology = Topology.chain(["a", "b"])
    stage = StageProfile.from_latencies("hw", {1: 0.3, 2: 0.4, 4: 0.6})
    profile = PipelineProfile({"a": {"hw": stage}, "b": {"hw": stage}})
    arrivals = np.cumsum(np.array(gaps, dtype=np.float64) * 0.05)
    workload = Workload.build(topology, profile, arrivals)
    script = {float(k + 1): t for k, t in enumerate(targets)}

    def step(observation: Observation, state: None) -> tuple[tuple[int, ...], None]:
        target = script.get(observation.now_s, observation.stages[0].desired)
        return (target, target), state

    policy = Policy("flap", (StageConfig("hw", 4, 2), StageConfig("hw", 4, 2)), step)
    run = run_closed_loop(
        topology, profile, workload, policy, duration_s=len(targets) + 2.0,
        settings=EngineSettings(activation_delay_s=delay),
    )  # fmt: skip
    assert np.all(np.isfinite(run.latencies_s))  # every query answered
    assert np.all(run.latencies_s >= 0.6 - 1e-12)  # at least the service of both stages
    for k, t in enumerate(targets):
        assert run.desired[k, 0] == t
    assert np.all(run.ready <= run.desired)
    assert np.all(run.desired <= run.billed)


def two_classes() -> tuple[Topology, PipelineProfile]:
    slow = StageProfile.from_latencies("slow", {1: 10.0})
    fast = StageProfile.from_latencies("fast", {1: 2.0})
    return Topology.chain(["a"]), PipelineProfile({"a": {"slow": slow, "fast": fast}})


def test_a_reconfiguration_hands_over_once_the_new_replicas_serve() -> None:
    topology, profile = two_classes()
    workload = Workload.build(topology, profile, [0.5, 3.0, 8.0])
    fast = StageConfig("fast", 1, 1)

    def step(observation: Observation, state: None) -> tuple[tuple[int | StageConfig, ...], None]:
        return ((fast if observation.now_s == 2.0 else observation.stages[0].desired),), state

    run = run_closed_loop(
        topology,
        profile,
        workload,
        Policy("swap", (StageConfig("slow", 1, 1),), step),
        duration_s=12.0,
        settings=EngineSettings(prices_per_hour={"slow": 1.0, "fast": 3.0}),
    )
    # q0: the slow replica, 0.5 -> 10.5. q1 waits for the fast replica, which serves from
    # 2 + 5 = 7 (3.0 -> 9.0); q2 waits for it too (8.0 -> 11.0). The slow replica is not
    # counted from the decision on, and leaves after its batch.
    np.testing.assert_array_equal(run.latencies_s, [10.0, 6.0, 3.0])
    ticks = run.ticks_s.tolist()
    assert run.desired[ticks.index(2.0), 0] == 1
    assert run.ready[ticks.index(6.0), 0] == 0
    assert run.billed[ticks.index(10.0), 0] == 2
    assert run.billed[ticks.index(11.0), 0] == 1
    assert run.cost_per_hour[ticks.index(2.0)] == 4.0
    assert run.cost_per_hour[ticks.index(11.0)] == 3.0
    # Billed: slow 0 -> 10.5 at $1/h, fast 2 -> 12 at $3/h.
    assert run.cost_usd == pytest.approx((10.5 * 1.0 + 10.0 * 3.0) / 3600.0)
    assert [(e.time_s, e.from_replicas, e.to_replicas, e.config) for e in run.events] == [
        (2.0, 1, 1, fast)
    ]


def test_idle_replicas_of_the_old_configuration_leave_at_the_handover() -> None:
    topology, profile = two_classes()
    workload = Workload.build(topology, profile, [0.5, 11.0])

    def step(observation: Observation, state: None) -> tuple[tuple[int | StageConfig, ...], None]:
        swap = observation.now_s == 1.0
        return ((StageConfig("fast", 1, 2) if swap else observation.stages[0].desired),), state

    run = run_closed_loop(
        topology, profile, workload, Policy("swap", (StageConfig("slow", 1, 3),), step), 14.0
    )
    ticks = run.ticks_s.tolist()
    assert run.billed[ticks.index(5.0), 0] == 5  # 3 slow serve on while 2 fast start
    assert run.billed[ticks.index(6.0), 0] == 3  # at 6 the idle slow ones went; one is busy
    assert run.billed[ticks.index(11.0), 0] == 2
    np.testing.assert_array_equal(run.latencies_s, [10.0, 2.0])  # q1 on a fast replica


@settings(max_examples=25, deadline=None)
@given(
    script=st.lists(
        st.one_of(
            st.integers(1, 4), st.tuples(st.sampled_from(["slow", "fast"]), st.integers(1, 3))
        ),
        min_size=1,
        max_size=20,
    ),
    gaps=st.lists(st.integers(0, 40), min_size=5, max_size=60),
    delay=st.sampled_from([0.0, 1.0, 5.0]),
)
def test_reconfigurations_never_drop_a_query(
    script: list[int | tuple[str, int]], gaps: list[int], delay: float
) -> None:
    slow = StageProfile.from_latencies("slow", {1: 0.5, 2: 0.6})
    fast = StageProfile.from_latencies("fast", {1: 0.2, 2: 0.3, 4: 0.4})
    topology = Topology.chain(["a", "b"])
    profile = PipelineProfile({m: {"slow": slow, "fast": fast} for m in ("a", "b")})
    workload = Workload.build(topology, profile, np.cumsum(np.array(gaps) * 0.05))
    targets = {
        float(k + 1): t if isinstance(t, int) else StageConfig(t[0], 2, t[1])
        for k, t in enumerate(script)
    }

    def step(observation: Observation, state: None) -> tuple[tuple[int | StageConfig, ...], None]:
        target = targets.get(observation.now_s, observation.stages[0].desired)
        return (target, observation.stages[1].desired), state

    policy = Policy("flap", (StageConfig("slow", 2, 2), StageConfig("fast", 4, 1)), step)
    run = run_closed_loop(
        topology, profile, workload, policy, duration_s=len(script) + 2.0,
        settings=EngineSettings(activation_delay_s=delay),
    )  # fmt: skip
    assert np.all(np.isfinite(run.latencies_s))  # every query answered
    assert np.all(run.latencies_s >= 0.2 + 0.2 - 1e-12)
    assert np.all(run.ready <= run.desired)
    assert np.all(run.desired <= run.billed)


def test_the_replanning_tuner_changes_batch_or_hardware_when_that_is_cheaper() -> None:
    """Load steps from 40 to 200 rps and stays: replicas of the planned batch 4 cost more
    than the plan for 200 rps (batch 2), which the re-planning tuner adopts."""
    profile = PipelineProfile(
        {
            "m": {
                "small": StageProfile.from_latencies("small", {1: 0.02, 2: 0.04, 4: 0.08}),
                "big": StageProfile.from_latencies("big", {1: 0.02, 2: 0.021, 4: 0.022, 8: 0.024}),
            }
        },
        hop_s=0.001,
    )
    problem = PlanningProblem(
        Topology.from_deps({"m": []}, "m"),
        profile,
        {"small": 0.05, "big": 0.2},
        0.1,
        np.array([0.0, 1.0]),
    )
    trace = ramp_trace(
        40.0, 200.0, warm_s=30.0, ramp_s=10.0, hold_s=120.0, tail_s=10.0, planning_s=30.0, seed=1
    )
    settings = SimulationSettings(replan=ReplanSettings(interval_s=20.0, lookback_s=20.0))
    both = simulate(problem, [trace], policies=("inferline", "inferline-replan"), settings=settings)
    tuner, replanning = both.result("ramp", "inferline"), both.result("ramp", "inferline-replan")
    assert tuner is not None and replanning is not None
    planned = (replanning.config[0].hardware, replanning.config[0].max_batch)
    changes = [e.config for e in replanning.run.events if e.config is not None]
    assert changes and all((c.hardware, c.max_batch) != planned for c in changes[:1])
    assert replanning.cost_usd < 0.8 * tuner.cost_usd
    assert replanning.attainment >= tuner.attainment - 0.001
    assert np.all(np.isfinite(replanning.run.latencies_s))


def test_replanning_waits_for_a_steady_rate() -> None:
    settings = ReplanSettings(lookback_s=60.0, max_drift=0.1)
    steady = np.linspace(0.0, 60.0, 6001)[:-1]
    climbing = np.sqrt(np.linspace(0.0, 3600.0, 6000))  # the rate doubles within the minute
    assert settings.steady(steady)
    assert not settings.steady(climbing)
    assert not settings.steady(np.array([]))
    with pytest.raises(ValueError, match="min_saving"):
        ReplanSettings(min_saving=1.0)


# -- the baselines' arithmetic --------------------------------------------------------------


def view(
    *,
    desired: int = 4,
    ready: int | None = None,
    starting: int = 0,
    ongoing: float = 0.0,
    busy_s: float = 0.0,
    idle_for: tuple[float, ...] = (),
) -> StageView:
    ready = desired - starting if ready is None else ready
    return StageView(
        name="a",
        desired=desired,
        ready=ready,
        starting=starting,
        queued=0,
        in_service=0,
        mean_ongoing=ongoing,
        busy_replica_s=busy_s,
        ready_replica_s=float(ready),
        idle_for_s=idle_for,
    )


def test_hpa_replica_formula_tolerance_and_unready_pods() -> None:
    hpa = HpaSettings()
    assert hpa_recommendation(0.9, 4, 0, 4, hpa) == math.ceil(4 * 0.9 / 0.7)  # 6
    assert hpa_recommendation(0.75, 4, 0, 4, hpa) == 4  # |0.75/0.7 - 1| <= 10 %
    assert hpa_recommendation(0.35, 4, 0, 4, hpa) == 2
    # Two pods still starting count as 0 % used: 3.6 / (0.7 * 6) < 1, no scale-up.
    assert hpa_recommendation(0.9, 4, 2, 6, hpa) == 6
    # One starting: 3.6 / (0.7 * 5) = 1.03, within the tolerance.
    assert hpa_recommendation(0.9, 4, 1, 5, hpa) == 5
    assert hpa_recommendation(1.0, 4, 1, 5, hpa) == math.ceil(4 * 1.0 / 0.7)  # 6


def test_hpa_syncs_every_15_s_and_limits_the_scale_up_rate() -> None:
    hpa = HpaSettings()
    state = HpaStage()
    targets = []
    for t in range(1, 16):
        target, state = hpa_step(view(desired=2, busy_s=2.0), float(t), state, hpa)
        targets.append(target)
    assert targets[:14] == [2] * 14  # no sync before 15 s
    # Saturated: ceil(2 · 1.0 / 0.7) = 3; limited to max(2 + 4, 2 · 2) = 6 anyway.
    assert targets[14] == 3
    fast = HpaSettings(target_utilisation=0.05)
    target, _ = hpa_step(view(desired=2, busy_s=2.0), 15.0, HpaStage(), fast)
    assert target == 6  # wants 40, limited to +4 pods in 15 s


def test_hpa_scale_down_waits_for_the_stabilisation_window() -> None:
    hpa = HpaSettings()
    state = HpaStage()
    desired = 10
    history = {}
    for t in range(1, 400):
        busy = 7.0 if t <= 15 else 1.4  # 70 % of 10 pods, then 14 %
        desired, state = hpa_step(
            view(desired=desired, busy_s=busy * desired / 10), float(t), state, hpa
        )
        history[t] = desired
    # The first sync recommends 10 (at target); later ones recommend 2, but the highest
    # recommendation of the last 300 s (10, made at t = 15) holds until t = 315.
    assert history[300] == 10
    assert history[330] == 2


def test_kpa_panics_on_a_burst_and_does_not_scale_down_while_panicking() -> None:
    kpa = KpaSettings()  # target 70 concurrent requests per pod
    state = KpaStage()
    desired = 1
    seen = {}
    for t in range(1, 200):
        ongoing = 700.0 if 100 <= t < 106 else 10.0
        desired, state = kpa_step(view(desired=desired, ongoing=ongoing), float(t), state, kpa)
        seen[t] = (desired, state.panic_s is not None)
    assert seen[98] == (1, False)
    # At t = 100 the 6 s panic window averages (4·10 + 700)/... >= 2 pods per ready pod.
    assert seen[100][1]
    assert seen[104][0] >= 4
    peak = max(d for d, _ in seen.values())
    # Panic holds the peak for a stable window (60 s) after the last over-threshold tick.
    assert all(seen[t][0] == peak for t in range(106, 160) if t % 2 == 0)
    assert seen[198] == (1, False)


def test_kpa_stable_mode_is_concurrency_over_target_with_rate_limits() -> None:
    kpa = KpaSettings()

    def settle(desired: int, ongoing: float) -> int:
        state, target = KpaStage(), desired
        for t in range(1, 61):
            target, state = kpa_step(view(desired=desired, ongoing=ongoing), float(t), state, kpa)
        return target

    assert settle(3, 140.0) == 2  # ceil(140 / (100 · 70 %))
    assert settle(10, 140.0) == 5  # at most halved per tick (max-scale-down-rate 2)
    assert settle(2, 100.0) == 2


def test_ray_serve_waits_for_the_upscale_and_downscale_delays() -> None:
    ray = RaySettings()
    state = RayStage()
    decisions = {}
    for t in range(1, 80):
        target, state = ray_step(view(desired=2, ongoing=8.0), float(t), 1.0, state, ray)
        decisions[t] = target
    # Metrics first reach the controller at t = 10; desired = 8 / 2 = 4 replicas; the
    # decision must be made in more than 30 control-loop periods of 1 s in a row.
    assert decisions[39] == 2
    assert decisions[40] == 4
    state = RayStage()
    for t in range(1, 700):
        target, state = ray_step(view(desired=4, ongoing=2.0), float(t), 1.0, state, ray)
        decisions[t] = target
    assert decisions[609] == 4  # more than 600 s of consistent downscale decisions first
    assert decisions[610] == 1


def test_autoscale_adds_units_for_requests_in_system_and_removes_idle_ones() -> None:
    auto = AutoScaleSettings(packing_factor=10.0)

    def observe(in_system: float, idle: tuple[float, ...]) -> Observation:
        stage = view(desired=3, idle_for=idle)
        return Observation(1.0, 1.0, (stage, stage), 0, int(in_system), in_system)

    assert autoscale_step(observe(45.0, (0.0, 0.0, 0.0)), auto) == (5, 5)  # ceil(45 / 10)
    assert autoscale_step(observe(20.0, (0.0, 0.0, 130.0)), auto) == (2, 2)  # one idle 120 s+
    assert autoscale_step(observe(20.0, (0.0, 10.0, 30.0)), auto) == (3, 3)  # not yet


def test_the_packing_factor_scale_is_autoscales_cost_knob() -> None:
    """The benchmark sweeps AutoScale's cost through p: units = ceil(n_sys / (p x scale))."""
    problem, trace = tiny_problem(), tiny_trace()
    sample = dataclasses.replace(problem, arrivals_s=trace.planning_s)
    start = plan(sample)
    stage = view(desired=1)
    observation = Observation(1.0, 1.0, (stage,) * len(problem.topology.stages), 0, 45, 45.0)

    def units(scale: float) -> int:
        settings = SimulationSettings(packing_factor=10.0, packing_factor_scale=scale)
        policy = build_policy("cg-autoscale", sample, start, trace, settings)
        assert policy.step is not None
        targets, _ = policy.step(observation, policy.state)
        assert len(set(targets)) == 1  # one unit: every stage scales together
        return targets[0]

    assert [units(0.5), units(1.0), units(2.0), units(4.0)] == [9, 5, 3, 2]
    with pytest.raises(ValueError, match="packing_factor_scale"):
        SimulationSettings(packing_factor_scale=0.0)


# -- traces, metrics, the comparison --------------------------------------------------------


def test_traces_have_the_rates_and_burstiness_they_promise() -> None:
    ramp = ramp_trace(100.0, 200.0, warm_s=30.0, ramp_s=10.0, hold_s=40.0, tail_s=20.0)
    counts = np.histogram(ramp.arrivals_s, bins=[0.0, 30.0, 40.0, 80.0, 90.0, 110.0])[0]
    assert counts[0] / 30.0 == pytest.approx(100.0, rel=0.1)
    assert counts[1] / 10.0 == pytest.approx(150.0, rel=0.1)
    assert counts[2] / 40.0 == pytest.approx(200.0, rel=0.1)
    assert ramp.changes_s == (30.0, 80.0)
    burst = burst_trace(200.0, warm_s=50.0, burst_s=100.0, tail_s=10.0)
    gaps = np.diff(burst.arrivals_s[(burst.arrivals_s > 50.0) & (burst.arrivals_s < 150.0)])
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(4.0, rel=0.2)
    assert 1.0 / gaps.mean() == pytest.approx(200.0, rel=0.1)
    spike = spike_trace(100.0, at_s=20.0, decay_s=10.0, duration_s=100.0)
    assert np.count_nonzero((spike.arrivals_s >= 20.0) & (spike.arrivals_s < 22.0)) > 300
    auto = autoscale_trace(100.0, minutes=8, step_s=5.0)
    assert auto.duration_s == pytest.approx(30.0)
    assert auto.planning_s.max() < 10.0
    for trace in (ramp, burst, spike, auto):
        assert np.all(np.diff(trace.arrivals_s) >= 0.0)
        assert trace.arrivals_s[-1] < trace.duration_s


def test_a_recorded_trace_is_split_into_a_planning_sample_and_a_live_part() -> None:
    trace = Trace.from_timestamps("mine", [10.0, 10.5, 11.0, 12.0, 13.0, 14.0])
    np.testing.assert_array_equal(trace.planning_s, [0.0, 0.5])  # the first 25 % of 4 s
    np.testing.assert_array_equal(trace.arrivals_s, [0.0, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="too short"):
        Trace.from_timestamps("short", [0.0, 4.0])


def test_traces_are_deterministic_in_their_seed() -> None:
    knots = [(0.0, 50.0), (10.0, 100.0)]
    a = modulated_arrivals(knots, 20.0, cv2=((0.0, 2.0),), seed=3)
    np.testing.assert_array_equal(a, modulated_arrivals(knots, 20.0, cv2=((0.0, 2.0),), seed=3))
    assert not np.array_equal(a, modulated_arrivals(knots, 20.0, cv2=((0.0, 2.0),), seed=4))


def test_recovery_is_measured_from_each_load_change() -> None:
    ticks = np.arange(1.0, 21.0)
    tail = np.full(20, 0.1)
    tail[[4, 5, 6]] = 1.0  # violating at t = 5, 6, 7 (after the change at 3)
    tail[[17, 18, 19]] = 1.0  # still violating at the end (after the change at 15)
    assert recovery_times(ticks, tail, (3.0, 10.0, 15.0), slo_s=0.5) == (5.0, 0.0, math.inf)


def test_a_trace_without_load_changes_has_no_recovery_times() -> None:
    ticks = np.arange(1.0, 21.0)
    tail = np.full(20, 1.0)  # violating throughout, but there is no change to recover from
    assert recovery_times(ticks, tail, (), slo_s=0.5) == ()


def test_rolling_tail_uses_the_queries_that_arrived_in_the_window() -> None:
    arrivals = np.array([0.1, 0.2, 1.5, 2.5])
    latencies = np.array([1.0, 3.0, 2.0, 4.0])
    tail = rolling_tail(arrivals, latencies, np.array([1.0, 2.0, 3.0]), window_s=1.0, percentile=99)
    np.testing.assert_array_equal(tail, [3.0, 2.0, 4.0])


def tiny_problem() -> PlanningProblem:
    problem = random_problem(5, duration_s=20.0, rate_rps=40.0)
    return dataclasses.replace(problem, slo_s=problem.slo_s * 1.5)


def tiny_trace() -> Trace:
    return ramp_trace(40.0, 80.0, warm_s=5.0, ramp_s=3.0, hold_s=8.0, tail_s=4.0, planning_s=20.0)


COMPARED = ("plan", "inferline", "hpa", "ray-serve", "knative-kpa")


@pytest.fixture(scope="module")
def report() -> SimulationReport:
    return simulate(tiny_problem(), [tiny_trace()], policies=COMPARED)


def test_policies_are_compared_on_the_same_trace_deterministically(
    report: SimulationReport,
) -> None:
    again = simulate(tiny_problem(), [tiny_trace()], policies=COMPARED)
    assert [r.policy for r in report.results] == list(COMPARED)
    for first, second in zip(report.results, again.results, strict=True):
        np.testing.assert_array_equal(first.run.latencies_s, second.run.latencies_s)
        np.testing.assert_array_equal(first.run.desired, second.run.desired)
        assert first.cost_usd == second.cost_usd
    assert len({r.queries for r in report.results}) == 1  # the same arrivals for all
    plan_only = report.result("ramp", "plan")
    assert plan_only is not None
    assert plan_only.scale_events == 0
    table = report.to_markdown()
    assert all(f"| ramp | {name} |" in table for name in COMPARED)


def test_the_report_plots_one_png_per_trace(report: SimulationReport, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    one_policy = dataclasses.replace(report, results=report.results[:1])
    (path,) = one_policy.plot(tmp_path, dpi=30)
    assert path.name.endswith("-ramp.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_unknown_policies_are_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match="inferline"):
        simulate(tiny_problem(), [tiny_trace()], policies=("magic",))
    assert {"oracle", "cg-autoscale"} <= set(POLICIES)


def test_at_the_planned_load_the_tuner_stays_near_the_plan_where_r_max_over_provisions() -> None:
    """A stationary stream like the planning sample: §5's r_max reads sampling noise at
    short windows as sustained load; the default estimate does not."""
    profile = PipelineProfile(
        {"m": {"cpu-1": StageProfile.from_latencies("cpu-1", {1: 0.02, 2: 0.03, 4: 0.05})}},
        hop_s=0.001,
    )
    problem = PlanningProblem(
        Topology.from_deps({"m": []}, "m"), profile, {"cpu-1": 0.05}, 0.05, np.array([0.0, 1.0])
    )
    steady = burst_trace(150.0, cv2_to=1.0, warm_s=10.0, burst_s=10.0, tail_s=10.0, seed=1)
    both = simulate(problem, [steady], policies=("plan", "inferline", "inferline-paper"))
    plan_only, ours, paper = (
        both.result("burst", p) for p in ("plan", "inferline", "inferline-paper")
    )
    assert plan_only is not None and ours is not None and paper is not None
    planned = plan_only.config[0].replicas
    assert planned > 1  # the planner chose this stage's slack
    assert ours.cost_usd < paper.cost_usd
    assert int(ours.run.desired.max()) <= planned + 1 < int(paper.run.desired.max())


def test_the_simulated_tuner_keeps_to_the_device_bound_as_the_live_one() -> None:
    """A GPU stage on a class of 3 devices, a x5 surge that asks for 5 replicas: the tuner
    scales it up to the devices and no further."""
    from tests.unit.planner.test_devices import gpu_chain

    problem = gpu_chain(150.0, 0.1, hardware_devices={"gpu": 3})
    trace = spike_trace(150.0, factor=5.0, at_s=10.0, decay_s=60.0, duration_s=40.0, seed=2)
    start = plan(dataclasses.replace(problem, arrivals_s=trace.planning_s))
    (result,) = simulate(problem, [trace], plan=start, policies=["inferline"]).results
    gpu = [m for m, c in enumerate(start.config) if c.hardware == "gpu"]
    assert gpu and int(result.run.desired[:, gpu].sum(axis=1).max()) == 3
