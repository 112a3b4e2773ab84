"""Memoised feasibility checks: the planner's only contact with the Estimator (§4.3).

Greedy search, branch-and-bound and the baselines all ask the same question of many
configurations: does it meet the SLO on the planning trace, at what cost and tail latency?
An :class:`Evaluator` prepares the planning workload once, caches the answer per
configuration, so revisiting a configuration never re-runs the simulation, and shares a
:class:`~sloline.planner.estimator.StageCache`, so a configuration that differs from an
earlier one in one stage only re-simulates that stage and the stages downstream of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sloline.planner.config import Config
from sloline.planner.estimator import Estimate, StageCache, Workload, estimate
from sloline.planner.problem import PlanningProblem

__all__ = ["Evaluation", "Evaluator"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The estimator's verdict on one configuration."""

    feasible: bool  # tail_s <= SLO
    cost_per_hour: float
    tail_s: float  # latency at the SLO percentile
    p50_s: float
    p99_s: float
    attainment: float  # fraction of queries within the SLO


class Evaluator:
    """Runs the estimator for one problem and memoises each configuration's verdict."""

    __slots__ = ("_memo", "problem", "simulations", "stage_cache", "workload")

    def __init__(self, problem: PlanningProblem) -> None:
        self.problem = problem
        self.workload = Workload.build(
            problem.topology, problem.profile, problem.arrivals_s, seed=problem.seed
        )
        self.stage_cache = StageCache(problem.topology)
        self._memo: dict[Config, Evaluation] = {}
        self.simulations = 0  # estimator runs so far (cache misses)

    def estimate(self, config: Config) -> Estimate:
        """The full simulation result (not memoised: it holds per-query arrays)."""
        problem = self.problem
        self.simulations += 1
        return estimate(
            problem.topology,
            problem.profile,
            config,
            self.workload,
            service=problem.service,
            seed=problem.seed,
            cache=self.stage_cache,
            routers=problem.routers,
        )

    def evaluate(self, config: Config) -> Evaluation:
        cached = self._memo.get(config)
        if cached is not None:
            return cached
        problem = self.problem
        result = self.estimate(config)
        tail, p50, p99 = result.percentiles_s((problem.percentile, 50.0, 99.0))
        evaluation = Evaluation(
            feasible=tail <= problem.slo_s,
            cost_per_hour=problem.cost_per_hour(config),
            tail_s=tail,
            p50_s=p50,
            p99_s=p99,
            attainment=result.attainment(problem.slo_s),
        )
        self._memo[config] = evaluation
        return evaluation

    def feasible(self, config: Config) -> bool:
        return self.evaluate(config).feasible
