"""A configuration packaged as a :class:`~sloline.planner.plan.Plan` (InferLine §4.3, §5).

:func:`describe` adds what the tuner needs (per-stage throughput, rho_m, scale factors,
the planning trace's envelope) and the estimator's verdict; :func:`headroom` measures how
much faster the planning trace may run before the configuration misses the SLO.
"""

from __future__ import annotations

import math
from dataclasses import replace

from sloline.common.envelope import Envelope, window_sizes
from sloline.common.trace import mean_rate_rps
from sloline.planner.config import Config
from sloline.planner.evaluator import Evaluator
from sloline.planner.plan import Plan, StagePlan
from sloline.planner.problem import PlanningProblem

__all__ = ["HEADROOM_MAX", "HEADROOM_STEP", "describe", "headroom"]


HEADROOM_MAX = 64.0  # how far headroom() looks
HEADROOM_STEP = 1.01  # and to what precision


def headroom(problem: PlanningProblem, config: Config) -> float:
    """x*: how many times faster the planning trace can be played (every arrival time
    divided by x) while ``config`` still meets the SLO in the estimator (on its resamples
    too, where the problem has them), to within
    ``HEADROOM_STEP``, at most ``HEADROOM_MAX``; 1 if it does not meet it at 1.

    The planner stops where one more action breaks the SLO, so a stage's rho_m says at
    which utilisation it was left, not how much more the plan holds: with whole replicas
    and batch sizes that can be a good deal more (a stage at its replica floor is often
    nowhere near full). Information for the user (``sloline plan`` prints it); the tuner
    does not use it (docs/tuner.md, "Floor stages"). Assumes feasibility falls
    monotonically with the rate (bisection)."""

    def holds(x: float) -> bool:
        faster = replace(problem, arrivals_s=problem.arrivals_s / x)
        return Evaluator(faster).feasible(config)

    if not holds(1.0):
        return 1.0
    low, high = 1.0, 2.0
    while high <= HEADROOM_MAX and holds(high):
        low, high = high, 2.0 * high
    if low >= HEADROOM_MAX:
        return HEADROOM_MAX
    while high / low > HEADROOM_STEP:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if holds(middle) else (low, middle)
    return low


def describe(problem: PlanningProblem, evaluator: Evaluator, config: Config) -> Plan:
    """Package a configuration as a :class:`Plan` with everything the tuner needs (§5)."""
    topology, profile = problem.topology, problem.profile
    verdict = evaluator.evaluate(config)
    result = evaluator.estimate(config)
    rate = mean_rate_rps(problem.arrivals_s)
    stages: list[StagePlan] = []
    occupancy: list[float] = []
    for name, c, stats in zip(topology.stages, config, result.stages, strict=True):
        stage = problem.stage_profile(name, c.hardware)
        latency = stage.latency_s(c.max_batch)
        mu = c.max_batch / latency
        s_m = profile.scale_factors[name]
        occupancy.append(latency + profile.hop_s)
        stages.append(
            StagePlan(
                name=name,
                hardware=c.hardware,
                max_batch=c.max_batch,
                replicas=c.replicas,
                cost_per_hour=round(c.replicas * problem.hardware_costs[c.hardware], 9),
                throughput_rps=mu,
                rho=rate * s_m / (c.replicas * mu),
                scale_factor=s_m,
                service_s=latency,
                mean_batch=stats.mean_batch,
                utilisation=stats.utilisation,
            )
        )
    service_s, _ = topology.longest_path(occupancy)
    router_mu = 0.0
    if profile.overhead is not None:  # one router's CPU per request at these batches
        per_request = profile.overhead.router_request_cpu_s + sum(
            s.scale_factor * profile.overhead.router_visit_cpu_s(max(1.0, s.mean_batch))
            for s in stages
        )
        router_mu = 1.0 / per_request if per_request > 0.0 else 0.0
    span = float(problem.arrivals_s[-1] - problem.arrivals_s[0])
    # Windows from the service time T_s doubling up to 60 s (§5), but no longer than the
    # trace: a window wider than the trace would under-state its rate.
    base = min(service_s, 60.0)
    windows = window_sizes(base, max(base, min(60.0, span)))
    return Plan(
        pipeline=problem.name,
        stages=tuple(stages),
        slo_s=problem.slo_s,
        percentile=problem.percentile,
        cost_per_hour=verdict.cost_per_hour,
        p50_s=verdict.p50_s,
        p99_s=verdict.p99_s,
        tail_s=result.percentiles_s((problem.percentile,))[0],
        attainment=verdict.attainment,
        rate_rps=rate,
        envelope=Envelope.of_trace(problem.arrivals_s, windows),
        headroom=headroom(problem, config),
        routers=problem.routers,
        router_cost_per_hour=round(problem.routers * problem.router_cost_per_hour, 9),
        router_throughput_rps=router_mu,
        router_utilisation=result.router_utilisation,
        resamples=problem.resamples,
        resampled_tail_s=verdict.tail_s if problem.resamples else 0.0,
        devices=dict(problem.hardware_devices),
    )
