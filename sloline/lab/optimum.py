"""The cheapest feasible configuration of a small pipeline, by branch and bound.

This measures the greedy planner's optimality gap (§4.3 notes it "occasionally finds
sub-optimal configurations"); it is exact on the planner's search space — per stage every
usable hardware class, every max batch the planner can reach (1, 2, 4, ..., cap) and
replicas within the bounds — under two monotonicity assumptions, which the estimator's FIFO
batching model satisfies in practice and which ``benchmarks/planner_quality.py`` would
expose (a greedy plan cheaper than the "optimum"):

- (A) adding a replica to a stage never makes a feasible configuration infeasible;
- (B) making the *other* stages ideal (fastest batch-1 hardware, maximum replicas) never
  makes a feasible configuration infeasible.

Bounds. For each stage and option (hardware, batch), ``lo`` is the fewest replicas that are
feasible when every other stage is ideal (by (B), a lower bound in any configuration).
Options are combined depth-first, cheapest lower bound first, pruning any partial choice
whose lower bound reaches the incumbent's cost. At a complete choice the bound is tightened
with the other stages at *their* chosen options and maximum replicas (by (A)), and replica
vectors are then visited in increasing cost order until the first feasible one.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from sloline.planner.config import Config, StageConfig
from sloline.planner.evaluator import Evaluator
from sloline.planner.problem import PlanningProblem

__all__ = ["Optimum", "optimal_config"]

Option = tuple[str, int]  # (hardware, max batch)


@dataclass(frozen=True, slots=True)
class Optimum:
    """Result of the search: the best configuration found (None: nothing feasible), and
    whether the search finished within its evaluation budget (else it is only an upper
    bound found so far)."""

    config: Config | None
    cost_per_hour: float
    proven: bool
    simulations: int


class _Budget(Exception):
    """The evaluation budget ran out."""


class _Search:
    def __init__(self, problem: PlanningProblem, evaluator: Evaluator, budget: int) -> None:
        self.problem = problem
        self.evaluator = evaluator
        self.limit = evaluator.simulations + budget
        names = problem.topology.stages
        self.bounds = [problem.replica_bounds(n) for n in names]
        self.options: list[list[Option]] = [
            [(hw, b) for hw in problem.usable_hardware(n) for b in problem.batch_options(n, hw)]
            for n in names
        ]
        self.ideal = tuple(self._ideal_stage(m) for m in range(len(names)))
        self.best: Config | None = None
        self.best_cost = float("inf")

    def _ideal_stage(self, m: int) -> StageConfig:
        name = self.problem.topology.stages[m]
        hw = min(
            self.problem.usable_hardware(name),
            key=lambda h: (self.problem.single_latency_s(name, h), h),
        )
        batch = self.problem.override(name).max_batch or 1
        return StageConfig(hw, batch, self.bounds[m][1])

    def feasible(self, config: Config) -> bool:
        if self.evaluator.simulations >= self.limit:
            raise _Budget
        return self.evaluator.feasible(config)

    def fewest(self, base: Config, m: int, option: Option, low: int) -> int | None:
        """Fewest replicas >= ``low`` of stage m at ``option`` that make ``base`` feasible,
        or None. Galloping up from ``low`` then bisecting (valid by (A)): bounds are
        usually close, so this costs a simulation or two."""
        high = self.bounds[m][1]

        def ok(r: int) -> bool:
            stage = StageConfig(option[0], option[1], r)
            return self.feasible((*base[:m], stage, *base[m + 1 :]))

        if low > high:
            return None
        bad, probe, step = low - 1, low, 1  # bad: largest count known infeasible
        while not ok(probe):
            if probe == high:
                return None
            bad, probe, step = probe, min(probe + step, high), step * 2
        while bad + 1 < probe:
            mid = (bad + 1 + probe) // 2
            if ok(mid):
                probe = mid
            else:
                bad = mid
        return probe

    def context(self, chosen: list[Option]) -> Config:
        """Chosen stages at maximum replicas, the rest ideal."""
        head = tuple(StageConfig(hw, b, self.bounds[m][1]) for m, (hw, b) in enumerate(chosen))
        return (*head, *self.ideal[len(chosen) :])

    def run(self) -> None:
        n = len(self.options)
        lows: list[list[tuple[float, Option, int]]] = []
        for m in range(n):
            per_stage = []
            for option in self.options[m]:
                r = self.fewest(self.ideal, m, option, self.bounds[m][0])
                if r is not None:
                    per_stage.append((self.price(option, r), option, r))
            per_stage.sort()
            lows.append(per_stage)
        rest = [0.0] * (n + 1)
        for m in range(n - 1, -1, -1):
            if not lows[m]:
                return  # some stage cannot meet the SLO even with ideal neighbours
            rest[m] = rest[m + 1] + lows[m][0][0]
        self._branch(lows, rest, [], [], 0.0)

    def price(self, option: Option, replicas: int) -> float:
        return replicas * self.problem.hardware_costs[option[0]]

    def _branch(
        self,
        lows: list[list[tuple[float, Option, int]]],
        rest: list[float],
        chosen: list[Option],
        floors: list[int],
        cost: float,
    ) -> None:
        m = len(chosen)
        if m == len(lows):
            self._leaf(chosen, floors)
            return
        for floor_price, option, r in lows[m]:
            if cost + floor_price + rest[m + 1] >= self.best_cost - 1e-9:
                break  # sorted by price: every later option is at least as dear
            # Tighter floor: the stages chosen so far are no better than ideal, so by (A)
            # and (B) stage m needs at least this many replicas in any completion.
            tight = self.fewest(self.context([*chosen, option]), m, option, r)
            if tight is None:
                continue
            price = self.price(option, tight)
            if cost + price + rest[m + 1] < self.best_cost - 1e-9:
                self._branch(lows, rest, [*chosen, option], [*floors, tight], cost + price)

    def _leaf(self, chosen: list[Option], floors: list[int]) -> None:
        n = len(chosen)
        unit = [self.problem.hardware_costs[hw] for hw, _ in chosen]
        top = self.context(chosen)
        start = list(floors)
        for m in range(n - 1):  # the last floor already saw every other stage's option
            r = self.fewest(top, m, chosen[m], start[m])
            if r is None:
                return
            start[m] = r
            if sum(u * x for u, x in zip(unit, start, strict=True)) >= self.best_cost - 1e-9:
                return
        heap = [(sum(u * r for u, r in zip(unit, start, strict=True)), tuple(start), 0)]
        while heap:
            cost, replicas, first = heapq.heappop(heap)
            if cost >= self.best_cost - 1e-9:
                return
            config = tuple(
                StageConfig(hw, b, r) for (hw, b), r in zip(chosen, replicas, strict=True)
            )
            if self.feasible(config):
                self.best, self.best_cost = config, self.problem.cost_per_hour(config)
                return
            # Canonical successors (increment coordinate j >= the last one incremented)
            # enumerate every vector above ``start`` exactly once.
            for j in range(first, n):
                if replicas[j] < self.bounds[j][1]:
                    bumped = (*replicas[:j], replicas[j] + 1, *replicas[j + 1 :])
                    heapq.heappush(heap, (cost + unit[j], bumped, j))


def optimal_config(
    problem: PlanningProblem,
    evaluator: Evaluator | None = None,
    *,
    incumbent: Config | None = None,
    budget: int = 20_000,
) -> Optimum:
    """Cheapest feasible configuration (see the module docstring for the assumptions).

    ``incumbent``, a known feasible configuration (e.g. the greedy plan), prunes from the
    start; it is returned when nothing cheaper exists. ``budget`` caps estimator runs."""
    evaluator = evaluator or Evaluator(problem)
    search = _Search(problem, evaluator, budget)
    if incumbent is not None and evaluator.feasible(incumbent):
        search.best, search.best_cost = incumbent, problem.cost_per_hour(incumbent)
    start = evaluator.simulations
    proven = True
    try:
        search.run()
    except _Budget:
        proven = False
    return Optimum(search.best, search.best_cost, proven, evaluator.simulations - start)
