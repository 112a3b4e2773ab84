"""What the activation delay alone allows: an upper bound on a reactive policy's SLO
attainment through a trace's load changes.

A replica decided now serves only after the activation delay, so the queries that arrive
while a surge outruns the capacity already running are late whatever the policy decides.
:func:`reactive_bound` measures how many, with the most generous reactive policy there
is, the *bound policy*:

- it serves with the plan (the configuration a tuner starts from, sized for the base
  load) until the trace's first load change (:attr:`~sloline.lab.traces.Trace.changes_s`:
  a flash crowd's onset, an MMPP burst's), which it knows the instant it happens;
- at that instant it raises every stage to its largest replica count and never scales
  down again, so every later surge is served by the whole fleet; those replicas serve
  after the activation delay, as every policy's;
- the queries that arrive before the first change count as met: whatever a policy does
  about the base load, it can do before the change.

Its attainment is an upper bound for any policy that, at the change, runs no more than the
plan's capacity (a policy that bought slack earlier, and pays for it, can do better). A
trace without a load change (diurnal, growth, heavy-tailed) has no step to miss: the
bound is 1. Where the bound is under the target, a 5 s activation makes the target
impossible for a tuner that holds the plan's cost before the surge.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sloline.lab.engine import EngineSettings, run_closed_loop
from sloline.lab.loop import Observation, Policy, Targets
from sloline.lab.traces import Trace
from sloline.planner.estimator import Workload
from sloline.planner.plan import Plan
from sloline.planner.planner import plan as make_plan
from sloline.planner.problem import PlanningProblem

__all__ = ["bound_policy", "reactive_bound"]


def bound_policy(problem: PlanningProblem, plan: Plan, change_s: float) -> Policy:
    """The plan, every stage at its largest replica count from ``change_s`` on."""
    top = tuple(problem.replica_bounds(s.name)[1] for s in plan.stages)

    def step(observation: Observation, state: None) -> tuple[Targets, None]:
        if observation.now_s >= change_s:
            return top, state
        return tuple(v.desired for v in observation.stages), state

    return Policy("reactive-bound", plan.config, step, routers=plan.routers)


def reactive_bound(
    problem: PlanningProblem,
    trace: Trace,
    *,
    plan: Plan | None = None,
    activation_delay_s: float = 5.0,
    tick_s: float = 1.0,
) -> float:
    """The bound policy's attainment on ``trace`` (module docstring): the share of
    queries within the SLO, those before the first load change counted as met; 1.0 for a
    trace without a load change. ``plan`` None plans on the trace's planning sample."""
    if not trace.changes_s:
        return 1.0
    change = min(trace.changes_s)
    start = plan or make_plan(dataclasses.replace(problem, arrivals_s=trace.planning_s))
    engine = EngineSettings(
        tick_s=tick_s,
        activation_delay_s=activation_delay_s,
        service=problem.service,
        seed=problem.seed,
        prices_per_hour=problem.hardware_costs,
    )
    arrivals = trace.arrivals_s
    run = run_closed_loop(
        problem.topology,
        problem.profile,
        Workload.build(problem.topology, problem.profile, arrivals, seed=problem.seed),
        bound_policy(problem, start, change),
        trace.duration_s,
        engine,
    )
    late = (run.latencies_s > problem.slo_s) & (arrivals >= change)
    return 1.0 - float(np.count_nonzero(late)) / max(1, run.latencies_s.size)
