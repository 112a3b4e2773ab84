"""The re-planning rule (sloline.tuner.replan): when a plan made on recent traffic is
adopted, and what adopting it asks of each stage; and that a planning problem crosses to
the planner's process intact."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from sloline.lab.synthetic import random_problem
from sloline.planner.config import StageConfig
from sloline.planner.plan import Plan
from sloline.planner.planner import plan
from sloline.tuner.replan import ReplanSettings, choose

PRICES = {"cpu-1": 0.05, "cpu-2": 0.10}


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
    targets, why = choose(running, candidate, [1, 6], PRICES, ReplanSettings())
    assert targets == (1, StageConfig("cpu-1", 8, 4))
    assert "saves $0.100/hour of the $0.350/hour running: b 4 x cpu-1 batch 8" in why


def test_a_saving_in_the_stages_it_leaves_as_they_are_does_not_count(base: Plan) -> None:
    """The plan for the look-back is $0.20/hour against $0.35/hour running, but all of it
    is b's count, which stays (the tuner's business); a's new batch saves nothing."""
    running = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 16, 3))
    candidate = with_stages(base, ("a", "cpu-1", 8, 1), ("b", "cpu-1", 16, 3))
    targets, why = choose(running, candidate, [1, 6], PRICES, ReplanSettings())
    assert targets is None
    assert "would save $0.000/hour of the $0.350/hour running" in why


def test_an_unchanged_stage_keeps_the_replicas_it_runs(base: Plan) -> None:
    running = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-2", 16, 2))
    candidate = with_stages(base, ("a", "cpu-1", 16, 1), ("b", "cpu-1", 16, 2))
    assert choose(running, candidate, [3, 2], PRICES, ReplanSettings())[0] == (
        3,
        StageConfig("cpu-1", 16, 2),
    )


def test_not_adopted_when_the_saving_is_small_or_only_replicas_change(base: Plan) -> None:
    running = with_stages(base, ("a", "cpu-1", 16, 2))
    settings = ReplanSettings(min_saving=0.1)
    # One replica of 20 fewer at another batch: 5 % of what runs, below min_saving.
    cheaper = with_stages(base, ("a", "cpu-1", 8, 19))
    targets, why = choose(running, cheaper, [20], PRICES, settings)
    assert targets is None
    assert why.endswith(
        "save $0.050/hour of the $1.000/hour running, by the stages it reconfigures"
    )
    assert choose(running, with_stages(base, ("a", "cpu-1", 8, 17)), [20], PRICES, settings)[0]
    # Fewer replicas of the same configuration: the tuner's business.
    fewer = with_stages(base, ("a", "cpu-1", 16, 1))
    assert choose(running, fewer, [2], PRICES, settings)[0] is None
    assert choose(running, None, [2], PRICES, settings)[0] is None  # infeasible


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
