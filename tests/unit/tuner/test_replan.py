"""The re-planning rule (sloline.tuner.replan): when a plan made on recent traffic is
adopted, and what adopting it asks of each stage; that the re-planner plans with what
serving measured; and that a planning problem crosses to the planner's process intact."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle

import numpy as np
import pytest

from sloline.lab.synthetic import random_problem
from sloline.planner.calibration import Calibration
from sloline.planner.config import StageConfig
from sloline.planner.plan import Plan
from sloline.planner.planner import plan
from sloline.planner.problem import PlanningProblem
from sloline.tuner.replan import (
    Replan,
    Replanner,
    ReplanSettings,
    choose,
    plan_recent,
    running_config,
)

PRICES = {"cpu-1": 0.05, "cpu-2": 0.10}
SLO_S = 0.1


def with_stages(base: Plan, *stages: tuple[str, str, int, int]) -> Plan:
    """``base`` with (name, hardware, max batch, replicas) per stage and its cost."""
    planned = tuple(
        dataclasses.replace(
            base.stages[0],
            name=name,
            hardware=hw,
            max_batch=batch,
            replicas=n,
            cost_per_hour=n * PRICES[hw],
        )
        for name, hw, batch, n in stages
    )
    return dataclasses.replace(
        base, stages=planned, cost_per_hour=sum(s.cost_per_hour for s in planned)
    )


@pytest.fixture(scope="module")
def base() -> Plan:
    return plan(random_problem(1, duration_s=10.0))


def test_a_cheaper_plan_with_another_batch_is_adopted_stage_by_stage(base: Plan) -> None:
    running = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 16, 3))
    # The tuner runs 1 and 6 replicas now ($0.35/h); the new plan: b at batch 8 x 4 ($0.25/h).
    candidate = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 8, 4))
    targets, why = choose(running, Replan(candidate), [1, 6], PRICES, ReplanSettings(), SLO_S)
    assert targets == (1, StageConfig("cpu-1", 8, 4))
    assert "saves $0.100/hour of the $0.350/hour running: b 4 x cpu-1 batch 8" in why


def test_a_saving_in_the_stages_it_leaves_as_they_are_does_not_count(base: Plan) -> None:
    """The plan for the look-back is $0.20/hour against $0.35/hour running, but all of it
    is b's count, which stays (the tuner's business); a's new batch saves nothing."""
    running = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 16, 3))
    candidate = with_stages(base, ("a", "cpu-1", 8, 1), ("b", "cpu-1", 16, 3))
    targets, why = choose(running, Replan(candidate), [1, 6], PRICES, ReplanSettings(), SLO_S)
    assert targets is None
    assert "would save $0.000/hour of the $0.350/hour running" in why


def test_an_unchanged_stage_keeps_the_replicas_it_runs(base: Plan) -> None:
    running = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-2", 16, 2))
    candidate = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 16, 2))
    assert choose(running, Replan(candidate), [3, 2], PRICES, ReplanSettings(), SLO_S)[0] == (
        3,
        StageConfig("cpu-1", 16, 2),
    )


def test_not_adopted_when_the_saving_is_small_or_only_replicas_change(base: Plan) -> None:
    running = with_stages(base, ("a", "cpu-1", 16, 2))
    settings = ReplanSettings(min_saving=0.1)
    # One replica of 20 fewer at another batch: 5 % of what runs, below min_saving.
    cheaper = with_stages(base, ("a", "cpu-1", 8, 19))
    targets, why = choose(running, Replan(cheaper), [20], PRICES, settings, SLO_S)
    assert targets is None
    assert why.endswith(
        "save $0.050/hour of the $1.000/hour running, by the stages it reconfigures"
    )
    dearer = Replan(with_stages(base, ("a", "cpu-1", 8, 17)))
    assert choose(running, dearer, [20], PRICES, settings, SLO_S)[0]
    # Fewer replicas of the same configuration: the tuner's business.
    fewer = with_stages(base, ("a", "cpu-1", 16, 1))
    assert choose(running, Replan(fewer), [2], PRICES, settings, SLO_S)[0] is None
    assert choose(running, Replan(None), [2], PRICES, settings, SLO_S)[0] is None  # infeasible


def test_a_running_configuration_that_misses_the_slo_is_rescued_at_any_cost(base: Plan) -> None:
    """Estimated over the SLO on the look-back, the running configuration takes the plan
    for it: more replicas where only counts change (never fewer than run now), the new
    configuration where one changes, though it costs more."""
    running = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 16, 2))
    more = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 16, 4))
    settings = ReplanSettings()
    targets, why = choose(running, Replan(more, 0.15), [2, 3], PRICES, settings, SLO_S)
    assert targets == (2, 4)
    assert why.startswith("the running configuration misses the SLO on the look-back's")
    assert "(estimated 150.0 ms > 100.0 ms)" in why and why.endswith("b 3 -> 4")
    other = with_stages(base, ("a", "cpu-2", 8, 1), ("b", "cpu-1", 16, 3))
    targets, why = choose(running, Replan(other, 0.15), [1, 3], PRICES, settings, SLO_S)
    assert targets == (StageConfig("cpu-2", 8, 1), 3) and "a 1 x cpu-2 batch 8" in why
    # Within the SLO, the same plan is only a change of counts: the tuner's business.
    assert choose(running, Replan(more, 0.09), [2, 3], PRICES, settings, SLO_S)[0] is None
    # On a rate that is not steady only a rescue is adopted.
    unsteady = Replan(more, 0.15, steady=False)
    assert choose(running, unsteady, [2, 3], PRICES, settings, SLO_S)[0] == (2, 4)
    cheaper = with_stages(base, ("a", "cpu-1", 8, 1), ("b", "cpu-1", 8, 1))
    targets, why = choose(
        running, Replan(cheaper, 0.09, steady=False), [2, 3], PRICES, settings, SLO_S
    )
    assert targets is None and why.startswith("not a steady rate")
    # Nothing to add, or no plan at all: kept.
    same = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 16, 3))
    targets, why = choose(running, Replan(same, 0.15), [2, 3], PRICES, settings, SLO_S)
    assert targets is None and "and so does the plan's" in why
    assert choose(running, Replan(None, 0.15), [2, 3], PRICES, settings, SLO_S)[0] is None


def test_the_running_configuration_is_estimated_on_the_look_back() -> None:
    """The plan's own configuration meets the SLO on its arrivals; one replica less of a
    stage that the plan replicates is estimated over it."""
    problem = random_problem(1, duration_s=10.0)
    planned = plan(problem)
    desired = [s.replicas for s in planned.stages]
    kept = plan_recent(problem, problem.arrivals_s, planned.envelope.windows_s, planned.config)
    assert kept.candidate is not None and kept.running_tail_s is not None
    assert kept.running_tail_s <= problem.slo_s
    m = max(range(len(desired)), key=lambda i: desired[i])
    assert desired[m] > 1
    desired[m] -= 1
    fewer = running_config(planned, desired)
    short = plan_recent(problem, problem.arrivals_s, planned.envelope.windows_s, fewer)
    assert short.running_tail_s is not None and short.running_tail_s > problem.slo_s
    assert plan_recent(problem, problem.arrivals_s, (1.0,)).running_tail_s is None
    # Not steady: planned only to rescue a configuration that misses.
    windows = planned.envelope.windows_s
    unsteady = plan_recent(problem, problem.arrivals_s, windows, planned.config, steady=False)
    assert unsteady.candidate is None and not unsteady.steady
    assert plan_recent(problem, problem.arrivals_s, windows, fewer, steady=False).candidate


class FakeServing:
    """What the re-planner drives, in memory: steady arrivals and a calibration."""

    def __init__(self, desired: dict[str, int], arrivals_s: np.ndarray, measured) -> None:
        self.counts = dict(desired)
        self.arrivals_s = arrivals_s
        self.calibration = measured
        self.adopted: list[Plan] = []

    def recent_arrivals(self, since_s: float) -> np.ndarray:
        return self.arrivals_s + since_s

    def measured(self, since_s: float) -> Calibration | None:  # noqa: ARG002 - one look-back
        return self.calibration

    def desired(self) -> dict[str, int]:
        return dict(self.counts)

    def reconfigure(self, stage: str, config: StageConfig) -> None:
        self.counts[stage] = config.replicas

    def scale(self, stage: str, replicas: int) -> None:
        self.counts[stage] = replicas

    def adopt(self, plan: Plan) -> None:
        self.adopted.append(plan)

    def handed_over(self, stage: str) -> bool:  # noqa: ARG002 - nothing starts
        return True


def slow_calibration(problem: PlanningProblem, planned: Plan, factor: float) -> Calibration:
    """A calibration that measured every stage's batches ``factor`` times its profile."""
    served = {s.name: (s.hardware, s.max_batch) for s in planned.stages}
    sizes = {n: np.full(200, float(b)) for n, (_, b) in served.items()}
    service = {
        n: np.full(200, factor * problem.profile.stage(n, hw).latency_s(b))
        for n, (hw, b) in served.items()
    }
    return Calibration.measure(
        problem.profile,
        served,
        sizes,
        service,
        {n: v + problem.profile.hop_s for n, v in service.items()},
        pipeline=problem.name,
        duration_s=60.0,
        requests=1000,
    )


@pytest.mark.parametrize(("factor", "adopted"), [(1.0, False), (1.3, True)])
def test_the_replanner_plans_as_served(factor: float, adopted: bool) -> None:
    """Served as profiled, the plan holds and is kept; served 1.3 times as slow (the
    calibration of the look-back says so), the plan for the same arrivals, made with that
    calibration, is adopted with more replicas."""
    problem = random_problem(1, duration_s=60.0)
    planned = plan(problem)
    desired = {s.name: s.replicas for s in planned.stages}
    measured = slow_calibration(problem, planned, factor)
    serving = FakeServing(desired, problem.arrivals_s, measured)
    replanner = Replanner(
        problem=problem,
        plan=planned,
        serving=serving,
        settings=ReplanSettings(lookback_s=60.0, max_drift=1.0),
        windows_s=planned.envelope.windows_s,
        clock=lambda: 100.0,
    )
    result = asyncio.run(replanner.step(None))
    assert (result is not None) == adopted
    if adopted:
        assert serving.adopted == [result]
        assert sum(serving.counts.values()) > sum(desired.values())
    else:
        assert serving.counts == desired and not serving.adopted


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        ReplanSettings(interval_s=0.0)
    with pytest.raises(ValueError, match="max_drift"):
        ReplanSettings(max_drift=-0.1)


def test_a_planning_problem_pickles_to_the_same_plan() -> None:
    problem = random_problem(3, duration_s=10.0)
    again = pickle.loads(pickle.dumps(problem))  # noqa: S301 - our own bytes
    assert dict(again.hardware_costs) == dict(problem.hardware_costs)
    np.testing.assert_array_equal(again.arrivals_s, problem.arrivals_s)
    assert plan(again).config == plan(problem).config
