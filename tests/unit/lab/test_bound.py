"""The reactive bound: a perfect reaction from the plan at a trace's first load change,
replicas serving after the activation delay."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sloline.common.envelope import Envelope
from sloline.lab.bound import bound_policy, reactive_bound
from sloline.lab.heldout.pipelines import random_pipeline
from sloline.lab.heldout.shapes import flash_crowd, growth
from sloline.lab.loop import Observation, StageView
from sloline.lab.traces import Trace
from sloline.planner.plan import Plan
from sloline.planner.planner import plan as make_plan
from sloline.planner.problem import PlanningProblem


def _pipeline_and_trace() -> tuple[PlanningProblem, Trace, Plan]:
    pipeline = random_pipeline(3)
    trace = flash_crowd(
        pipeline.rate_rps, 60.0, 0, peak=4.0, start_s=30.0, ramp_s=2.0, hold_s=15.0, decay_s=5.0
    )
    start = make_plan(dataclasses.replace(pipeline.problem, arrivals_s=trace.planning_s))
    return pipeline.problem, trace, start


def _view(name: str, desired: int) -> StageView:
    return StageView(name, desired, desired, 0, 0, 0, 0.0, 0.0, 0.0, ())


def test_the_bound_policy_keeps_the_plan_until_the_change_then_takes_every_replica() -> None:
    problem, _, start = _pipeline_and_trace()
    policy = bound_policy(problem, start, change_s=30.0)
    assert policy.step is not None
    assert policy.config == start.config
    views = tuple(_view(s.name, s.replicas) for s in start.stages)
    before = Observation(29.0, 1.0, views, 0, 0, 0.0, Envelope((1.0,), (1.0,)))
    after = dataclasses.replace(before, now_s=30.0)
    assert policy.step(before, None)[0] == tuple(s.replicas for s in start.stages)
    top = tuple(problem.replica_bounds(s.name)[1] for s in start.stages)
    assert policy.step(after, None)[0] == top


def test_a_trace_without_a_load_change_has_nothing_to_miss() -> None:
    pipeline = random_pipeline(3)
    trace = growth(pipeline.rate_rps, 60.0, 0)
    assert trace.changes_s == ()
    assert reactive_bound(pipeline.problem, trace) == 1.0


def test_a_step_within_the_activation_delay_is_missed_even_by_a_perfect_reaction() -> None:
    problem, trace, start = _pipeline_and_trace()
    at_5s = reactive_bound(problem, trace, plan=start)
    instant = reactive_bound(problem, trace, plan=start, activation_delay_s=0.0)
    # A 4x step over 2 s outruns the plan's capacity for the 5 s its replicas take.
    assert at_5s < 0.99
    assert instant > at_5s
    assert instant == pytest.approx(1.0, abs=0.01)
    # Queries before the change count as met: the bound is about the change alone.
    before = np.count_nonzero(trace.arrivals_s < min(trace.changes_s))
    assert 1.0 - at_5s <= 1.0 - before / trace.arrivals_s.size
