"""The coarse-grained baselines CG-Mean and CG-Peak (InferLine §6).

Today's practice treats the pipeline as one black box: every stage on one hardware class
with one maximum batch size — the largest whose service time through the pipeline meets
the SLO — and the whole pipeline replicated as a unit until it sustains the target rate.
CG-Mean provisions for the planning trace's mean rate, CG-Peak for its peak rate over a
sliding window as wide as the SLO. For each, the cheapest hardware class wins; its tail
latency and SLO attainment on the planning trace come from the same Estimator, so they
sit beside the planner's plan on equal terms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sloline.common.trace import mean_rate_rps, peak_rate_rps
from sloline.planner.config import StageConfig
from sloline.planner.estimator import no_queue_latencies
from sloline.planner.evaluator import Evaluator
from sloline.planner.problem import PlanningProblem
from sloline.planner.sim.draws import summary_stat

__all__ = ["Baseline", "cg_baseline", "cg_baselines"]

Kind = Literal["cg-mean", "cg-peak"]


@dataclass(frozen=True, slots=True)
class Baseline:
    """A coarse-grained baseline (§6): the whole pipeline replicated ``units`` times as one
    unit, every stage on ``hardware`` with ``max_batch``, provisioned for ``rate_rps``."""

    name: Kind
    hardware: str
    max_batch: int
    units: int
    rate_rps: float
    cost_per_hour: float
    tail_s: float  # estimated latency at the SLO percentile on the planning trace
    attainment: float  # estimated fraction of queries within the SLO


def _largest_batch(problem: PlanningProblem, evaluator: Evaluator, hardware: str) -> int | None:
    """The largest batch of 1, 2, 4, ..., cap (the smallest cap over stages) whose pure
    service time meets the SLO at its percentile, as a black-box profile would show."""
    stages = problem.topology.stages
    stat = summary_stat(problem.service)
    cap = min(problem.stage_profile(n, hardware).cap for n in stages)
    best = None
    batch = 1
    while True:
        occupancy = [
            problem.stage_profile(n, hardware).latency_s(batch, stat) + problem.profile.hop_s
            for n in stages
        ]
        latencies = no_queue_latencies(problem.topology, evaluator.workload, occupancy)
        if np.percentile(latencies, problem.percentile, method="inverted_cdf") > problem.slo_s:
            return best
        best = batch
        if batch == cap:
            return best
        batch = min(2 * batch, cap)


def cg_baseline(problem: PlanningProblem, evaluator: Evaluator, kind: Kind) -> Baseline | None:
    """The cheapest coarse-grained configuration of ``kind``; None when no allowed hardware
    class runs every stage within the SLO."""
    arrivals = problem.arrivals_s
    rate = mean_rate_rps(arrivals) if kind == "cg-mean" else peak_rate_rps(arrivals, problem.slo_s)
    stages = problem.topology.stages
    best: tuple[tuple[float, float, str], Baseline] | None = None
    for hardware in problem.hardware_costs:
        if any(hardware not in problem.profile.stages[n] for n in stages):
            continue
        batch = _largest_batch(problem, evaluator, hardware)
        if batch is None:
            continue
        # Units needed so that every stage keeps up with its share s_m of the rate.
        need = max(
            rate
            * problem.profile.scale_factors[n]
            / problem.stage_profile(n, hardware).throughput_rps(batch)
            for n in stages
        )
        units = max(1, math.ceil(need - 1e-9))
        config = tuple(StageConfig(hardware, batch, units) for _ in stages)
        verdict = evaluator.evaluate(config)
        baseline = Baseline(
            name=kind,
            hardware=hardware,
            max_batch=batch,
            units=units,
            rate_rps=rate,
            cost_per_hour=verdict.cost_per_hour,
            tail_s=verdict.tail_s,
            attainment=verdict.attainment,
        )
        key = (verdict.cost_per_hour, verdict.tail_s, hardware)
        if best is None or key < best[0]:
            best = (key, baseline)
    return None if best is None else best[1]


def cg_baselines(problem: PlanningProblem, evaluator: Evaluator) -> tuple[Baseline, ...]:
    """CG-Mean and CG-Peak, those that exist."""
    found = (cg_baseline(problem, evaluator, k) for k in ("cg-mean", "cg-peak"))
    return tuple(b for b in found if b is not None)
