"""Memoised feasibility checks: the planner's only contact with the Estimator (§4.3).

Greedy search, branch-and-bound and the baselines all ask the same question of many
configurations: does it meet the SLO on the planning trace, at what cost and tail latency?
An :class:`Evaluator` prepares the planning workload once, caches the answer per
configuration, so revisiting a configuration never re-runs the simulation, and shares a
:class:`~sloline.planner.estimator.StageCache`, so a configuration that differs from an
earlier one in one stage only re-simulates that stage and the stages downstream of it.

With ``problem.resamples`` a configuration is feasible only where it meets the SLO on the
planning trace and on each resample of it (:func:`~sloline.planner.workload.resample_arrivals`;
checked in turn, stopping at the first miss): the planner then plans for the arrival
process rather than for one sample of it. A configuration with more replicas of a class
than the class has devices (:meth:`~sloline.planner.problem.PlanningProblem.fits_devices`)
is never feasible, whatever its estimate: it cannot run as simulated.
"""

from __future__ import annotations

from dataclasses import dataclass

from sloline.planner.config import Config
from sloline.planner.estimator import Estimate, StageCache, Workload, estimate
from sloline.planner.problem import PlanningProblem
from sloline.planner.workload import resample_arrivals

__all__ = ["Evaluation", "Evaluator"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The estimator's verdict on one configuration."""

    feasible: bool  # tail_s <= SLO, on no more replicas of a class than it has devices
    cost_per_hour: float
    tail_s: float  # latency at the SLO percentile: the worst over the traces checked
    p50_s: float  # on the planning trace, as the rest
    p99_s: float
    attainment: float  # fraction of queries within the SLO


class Evaluator:
    """Runs the estimator for one problem and memoises each configuration's verdict."""

    __slots__ = ("_memo", "_resampled", "problem", "simulations", "stage_cache", "workload")

    def __init__(self, problem: PlanningProblem) -> None:
        self.problem = problem
        self.workload = Workload.build(
            problem.topology, problem.profile, problem.arrivals_s, seed=problem.seed
        )
        self.stage_cache = StageCache(problem.topology)
        # each resample draws its conditional visits afresh too; their stage caches share
        # one bound, as large as the planning trace's
        share = self.stage_cache.max_bytes // max(1, problem.resamples)
        self._resampled = [
            (
                Workload.build(problem.topology, problem.profile, trace, seed=problem.seed + k),
                StageCache(problem.topology, max_bytes=share),
            )
            for k, trace in enumerate(
                resample_arrivals(problem.arrivals_s, problem.resamples, seed=problem.seed), 1
            )
        ]
        self._memo: dict[Config, Evaluation] = {}
        self.simulations = 0  # estimator runs so far (cache misses)

    def estimate(self, config: Config) -> Estimate:
        """The full simulation result on the planning trace (not memoised: it holds
        per-query arrays)."""
        return self._estimate(config, self.workload, self.stage_cache)

    def _estimate(self, config: Config, workload: Workload, cache: StageCache) -> Estimate:
        problem = self.problem
        self.simulations += 1
        return estimate(
            problem.topology,
            problem.profile,
            config,
            workload,
            service=problem.service,
            seed=problem.seed,
            cache=cache,
            routers=problem.routers,
        )

    def evaluate(self, config: Config) -> Evaluation:
        cached = self._memo.get(config)
        if cached is not None:
            return cached
        problem = self.problem
        result = self.estimate(config)
        tail, p50, p99 = result.percentiles_s((problem.percentile, 50.0, 99.0))
        worst = tail
        fits = problem.fits_devices(config)
        for workload, cache in self._resampled:
            if worst > problem.slo_s or not fits:
                break
            (other,) = self._estimate(config, workload, cache).percentiles_s((problem.percentile,))
            worst = max(worst, other)
        evaluation = Evaluation(
            feasible=fits and worst <= problem.slo_s,
            cost_per_hour=problem.cost_per_hour(config),
            tail_s=worst,
            p50_s=p50,
            p99_s=p99,
            attainment=result.attainment(problem.slo_s),
        )
        self._memo[config] = evaluation
        return evaluation

    def feasible(self, config: Config) -> bool:
        return self.evaluate(config).feasible
