"""The Planner: InferLine's greedy, estimator-checked cost minimisation (§4.3).

:func:`initialize` is Algorithm 1: every stage at batch size 1 on its lowest-latency
hardware; infeasible when even the pure service time (no queueing) misses the SLO; else add
a replica to the throughput bottleneck until the Estimator says the SLO holds.

:func:`minimize_cost` is Algorithm 2: from that configuration, repeatedly take the single
feasible action that lowers the cost the most — IncreaseBatch (x2), RemoveReplica or
DowngradeHW — until no action is feasible. Equal costs go to the lower estimated tail
latency, then to the earlier stage and action, so the search is deterministic.

At termination the two guarantees of §4.3 hold: (1) if some configuration in the search
space meets the SLO, a valid one is returned (Algorithm 1 reaches the no-queueing
configuration); (2) no single action lowers the cost without violating the SLO.

Device bounds (:meth:`~sloline.planner.problem.PlanningProblem.fits_devices`: no more
replicas of a class, over all stages, than it has devices) hold in every configuration:
the Evaluator counts one beyond them infeasible, and every replica cap, start and move is
derived from :meth:`~sloline.planner.problem.PlanningProblem.device_room`.

:func:`multi_start` (the default search) adds a way out of Algorithm 2's traps: a second
descent that first keeps every stage on its hardware, moves that take a replica off (or
change the class of) the dearest stages at any batch size while the others grow, and
moves that take a replica off one stage while another gets faster; a downgrade to a
cheap, slow class or a free batch increase that spends the latency budget is then
weighed against the plans it blocks. ``search="greedy"`` is InferLine's single
descent.

:func:`plan` runs Algorithm 1 and the search and packages the result as a :class:`Plan`
(:func:`sloline.planner.describe.describe`, with the plan's headroom). Where the profile
measures the router's CPU it also picks the number of routers (:func:`router_counts`):
the fewest with which a plan meets the SLO, and more while that makes the plan cheaper.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from sloline.common.trace import mean_rate_rps
from sloline.planner.config import Config, StageConfig
from sloline.planner.describe import describe
from sloline.planner.estimator import no_queue_latencies
from sloline.planner.evaluator import Evaluation, Evaluator
from sloline.planner.plan import Plan
from sloline.planner.problem import PlanningProblem

__all__ = [
    "Action",
    "InfeasibleError",
    "Search",
    "Variant",
    "actions",
    "initialize",
    "minimize_cost",
    "multi_start",
    "plan",
    "plan_sweep",
    "router_counts",
    "router_floor",
]

ActionKind = Literal["increase-batch", "remove-replica", "downgrade-hardware"]
Variant = Literal["inferline", "sloline"]
Search = Literal["multi-start", "greedy"]
_EPS = 1e-9  # $/h: float rounding in cost sums
_ACTION_RANK: dict[ActionKind, int] = {
    "increase-batch": 0,
    "remove-replica": 1,
    "downgrade-hardware": 2,
}


class InfeasibleError(ValueError):
    """No configuration meets the SLO; ``reason`` is a CamelCase code for status
    conditions, the message says why and what to change."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Action:
    """One feasible modification of a configuration (Algorithm 2, line 10)."""

    kind: ActionKind
    stage: int
    config: Config
    evaluation: Evaluation


def _with(config: Config, m: int, stage: StageConfig) -> Config:
    return (*config[:m], stage, *config[m + 1 :])


def _best_hardware(problem: PlanningProblem, name: str) -> str:
    """Lowest batch-1 latency, then cheaper, then by name (Algorithm 1, line 5)."""
    return min(
        problem.usable_hardware(name),
        key=lambda hw: (problem.single_latency_s(name, hw), problem.hardware_costs[hw], hw),
    )


def _check_service_time(problem: PlanningProblem, evaluator: Evaluator, config: Config) -> None:
    """Algorithm 1, lines 6-7: even without queueing, is the SLO out of reach?

    Per query, the critical path of batch-1 service plus hop on the fastest hardware, over
    the stages the query visits, plus the request's own serving time (router CPU and
    request path, when measured); with every stage visited this is the paper's
    longest-path service time."""
    topology = problem.topology
    occupancy = [
        problem.single_latency_s(name, c.hardware) + problem.profile.hop_s
        for name, c in zip(topology.stages, config, strict=True)
    ]
    latencies = no_queue_latencies(topology, evaluator.workload, occupancy)
    latencies = latencies + problem.profile.request_s
    floor = float(np.percentile(latencies, problem.percentile, method="inverted_cdf"))
    if floor > problem.slo_s:
        total, path = topology.longest_path(occupancy)
        steps = " -> ".join(
            f"{n} ({config[topology.index(n)].hardware}, "
            f"{occupancy[topology.index(n)] * 1e3:.1f} ms)"
            for n in path
        )
        raise InfeasibleError(
            "ServiceTimeExceedsSLO",
            f"even with no queueing, batch size 1 and the fastest hardware, the "
            f"P{problem.percentile:g} latency is {floor * 1e3:.1f} ms > SLO "
            f"{problem.slo_s * 1e3:.1f} ms (longest path {total * 1e3:.1f} ms: {steps}, "
            f"each including {problem.profile.hop_s * 1e3:.2f} ms hop overhead, plus "
            f"{problem.profile.request_s * 1e3:.2f} ms per request); relax the "
            "SLO, allow faster hardware or speed up these stages",
        )


def _bottleneck(
    problem: PlanningProblem, config: Config, frozen: frozenset[int] = frozenset()
) -> int | None:
    """FindMinThru (Algorithm 1, line 10): the stage with the least throughput per unit of
    load it receives, among stages that can still grow and are not ``frozen``."""
    best: tuple[float, int] | None = None
    for m, (name, c) in enumerate(zip(problem.topology.stages, config, strict=True)):
        s_m = problem.profile.scale_factors[name]
        if s_m <= 0.0 or m in frozen or not _can_grow(problem, config, m):
            continue
        capacity = c.replicas * problem.stage_profile(name, c.hardware).throughput_rps(c.max_batch)
        key = (capacity / s_m, m)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def _replica_cap(problem: PlanningProblem, config: Config, m: int, hardware: str) -> int:
    """The most replicas the search gives stage m of ``config`` on ``hardware``: its bound;
    where the router and workers share the machine's cores (the embedded mode), no more
    than run at once on those cores (one more would only share them, adding no
    throughput: without this cap an unreachable load grew every stage to the bound (256)
    one estimate at a time, for many minutes, before the planner could say that it is
    infeasible); and on a class with a device bound, no more than the devices the other
    stages leave (:meth:`PlanningProblem.device_room`)."""
    name = problem.topology.stages[m]
    lo, hi = problem.replica_bounds(name)
    cores = _shared_cores(problem)
    if cores is not None:
        fit = cores // problem.stage_profile(name, hardware).cores
        hi = max(lo, min(hi, fit or 1))
    room = problem.device_room(config, m, hardware)
    return hi if room is None else min(hi, room)


def _shared_cores(problem: PlanningProblem) -> int | None:
    """The cores the router and every worker share (the embedded mode), else None."""
    overhead = problem.profile.overhead
    return overhead.cores if overhead is not None else None


def _can_grow(problem: PlanningProblem, config: Config, m: int) -> bool:
    name, c = problem.topology.stages[m], config[m]
    return c.replicas < _replica_cap(problem, config, m, c.hardware) or c.max_batch < max(
        problem.batch_options(name, c.hardware)
    )


def _grow(problem: PlanningProblem, config: Config, m: int) -> Config:
    """Add a replica to stage m; at its replica cap, double the batch instead (our
    extension: it keeps guarantee (1) when a replica or device bound, absent from the
    paper, binds)."""
    name, c = problem.topology.stages[m], config[m]
    if c.replicas < _replica_cap(problem, config, m, c.hardware):
        return _with(config, m, replace(c, replicas=c.replicas + 1))
    cap = max(problem.batch_options(name, c.hardware))
    return _with(config, m, replace(c, max_batch=min(2 * c.max_batch, cap)))


def initialize(problem: PlanningProblem, evaluator: Evaluator) -> Config:
    """Algorithm 1: a feasible, latency-minimising starting configuration, or raise
    :class:`InfeasibleError`.

    The paper's start is every stage on its fastest hardware. Where the workers share the
    machine's cores (the embedded mode), a replica with more threads, or one more replica,
    also slows every other stage down, so that start need not be latency-minimising and
    growing it can raise the tail. So each hardware class is a start too (every stage that
    may use it on it); the starts are grown in order of their estimated tail, lowest
    first, until one becomes feasible (docs/planner.md, "Guarantees"). With dedicated
    cores the fastest start has the lowest tail, and this is the paper's Algorithm 1.
    Every start fits the device bounds (:func:`_start`); the SLO floor is checked on the
    fastest hardware regardless of them, the lowest service time of any configuration."""
    _check_service_time(problem, evaluator, _fastest(problem))
    fastest = _start(problem)
    by_price = sorted(problem.hardware_costs, key=lambda hw: (problem.hardware_costs[hw], hw))
    starts = list(dict.fromkeys([fastest] + [_start(problem, prefer=hw) for hw in by_price]))
    if len(starts) > 1:  # lowest estimated tail first; ties keep the paper's start first
        tails = {start: evaluator.evaluate(start).tail_s for start in starts}
        starts.sort(key=lambda start: tails[start])
    for start in starts:
        feasible = _grow_until_feasible(problem, evaluator, start)
        if feasible is not None:
            return feasible
    cores = _shared_cores(problem)
    where = f" or on all {cores} cores the workers share" if cores is not None else ""
    more = "give it more cores or faster hardware, " if cores is not None else ""
    bounded = _device_bounds(problem)
    if bounded:
        where += f", on no more replicas of a class than it has devices ({bounded})"
        more += "raise the classes' devices in the catalog, "
    raise InfeasibleError(
        "ReplicaLimit",
        f"with every stage at its replica bound{where} and at its batch cap the estimated "
        f"P{problem.percentile:g} latency still exceeds the SLO "
        f"({problem.slo_s * 1e3:.1f} ms); {more}raise maxReplicas or relax the SLO",
    )


def _device_bounds(problem: PlanningProblem) -> str:
    """The device bounds of the classes any stage may use, for a message ('' if none)."""
    usable = {hw for name in problem.topology.stages for hw in problem.usable_hardware(name)}
    return ", ".join(
        f"{hw}: devices {n}, for all stages together"
        for hw, n in problem.hardware_devices.items()
        if hw in usable
    )


def _fastest(problem: PlanningProblem) -> Config:
    """Every stage at batch 1 with the fewest replicas on its fastest hardware, whatever
    the device bounds: the lowest service time any configuration has."""
    return tuple(
        StageConfig(
            _best_hardware(problem, name),
            problem.override(name).max_batch or 1,
            problem.replica_bounds(name)[0],
        )
        for name in problem.topology.stages
    )


def _start(problem: PlanningProblem, prefer: str | None = None) -> Config:
    """Every stage at batch 1 (or its pinned batch) with the fewest replicas, on ``prefer``
    where the stage may use it, else on its fastest hardware, within the device bounds
    (:meth:`PlanningProblem.place`): where stages compete for a class's devices, the stage
    that loses the most batch-1 latency on its next choice chooses first."""
    stages = problem.topology.stages
    options = []
    for name in stages:
        ranked = sorted(
            problem.usable_hardware(name),
            key=lambda hw: (problem.single_latency_s(name, hw), problem.hardware_costs[hw], hw),
        )
        if prefer in ranked:
            ranked.insert(0, ranked.pop(ranked.index(prefer)))
        options.append(ranked)

    def loss(m: int) -> float:
        first, *rest = options[m]
        if not rest:
            return math.inf
        name = stages[m]
        return problem.single_latency_s(name, rest[0]) - problem.single_latency_s(name, first)

    order = sorted(range(len(stages)), key=lambda m: -loss(m))
    placed = problem.place(options, order)
    assert placed is not None, "PlanningProblem checks that the stages fit the devices"
    return tuple(
        StageConfig(hw, problem.override(name).max_batch or 1, problem.replica_bounds(name)[0])
        for name, hw in zip(stages, placed, strict=True)
    )


def _grow_until_feasible(
    problem: PlanningProblem,
    evaluator: Evaluator,
    config: Config,
    below_cost: float = math.inf,
    frozen: frozenset[int] = frozenset(),
) -> Config | None:
    """Algorithm 1, lines 9-11: grow the throughput bottleneck until the SLO holds; None
    when nothing can grow any more or the cost reaches ``below_cost``."""
    while not evaluator.feasible(config):
        m = _bottleneck(problem, config, frozen)
        if m is None:
            return None
        config = _grow(problem, config, m)
        if problem.cost_per_hour(config) >= below_cost:
            return None
    return config


def _grow_tail(
    problem: PlanningProblem,
    evaluator: Evaluator,
    config: Config,
    below_cost: float,
    frozen: frozenset[int] = frozenset(),
) -> Config | None:
    """Like :func:`_grow_until_feasible`, but each step adds the replica that lowers the
    estimated tail the most (ties: the cheaper) rather than the throughput bottleneck's:
    where a stage's queue, not the pipeline's throughput, holds the tail over the SLO."""
    while not evaluator.feasible(config):
        grown = [
            _with(config, m, replace(c, replicas=c.replicas + 1))
            for m, c in enumerate(config)
            if m not in frozen and c.replicas < _replica_cap(problem, config, m, c.hardware)
        ]
        affordable = [g for g in grown if problem.cost_per_hour(g) < below_cost - _EPS]
        if not affordable:
            return None
        best = min(affordable, key=lambda g: _ranked(evaluator, g)[::-1])
        if evaluator.evaluate(best).tail_s >= evaluator.evaluate(config).tail_s:
            return None  # no replica helps
        config = best
    return config


def _next_cheaper(problem: PlanningProblem, config: Config, m: int) -> str | None:
    """The dearest class cheaper than stage m's with devices for its fewest replicas."""
    name = problem.topology.stages[m]
    price = problem.hardware_costs[config[m].hardware]
    lo = problem.replica_bounds(name)[0]
    cheaper = [
        hw
        for hw in problem.usable_hardware(name)
        if problem.hardware_costs[hw] < price
        and ((room := problem.device_room(config, m, hw)) is None or room >= lo)
    ]
    if not cheaper:
        return None
    return min(
        cheaper,
        key=lambda hw: (-problem.hardware_costs[hw], problem.single_latency_s(name, hw), hw),
    )


def _downgrade(
    problem: PlanningProblem,
    evaluator: Evaluator,
    config: Config,
    m: int,
    hardware: str,
    variant: Variant,
) -> tuple[Config, Evaluation] | None:
    """DowngradeHW (§4.3): stage m moves to ``hardware``; the cheapest feasible result
    that costs less than ``config``, or None.

    The localised search freezes the other stages and tries every batch size with, per
    batch, the fewest feasible replicas, found by bisection below the break-even count
    (feasibility is monotone in replicas). The ``"sloline"`` variant also tries a repair:
    stage m re-initialised at batch 1, then Algorithm 1's bottleneck growth over *all*
    stages (their hardware and batch frozen) — a downgrade that needs one more replica
    elsewhere is then one action rather than a dead end."""
    candidates = [_downgrade_local(problem, evaluator, config, m, hardware)]
    if variant == "sloline":
        name = problem.topology.stages[m]
        start = _with(
            config,
            m,
            StageConfig(
                hardware, problem.override(name).max_batch or 1, problem.replica_bounds(name)[0]
            ),
        )
        repaired = _grow_until_feasible(
            problem, evaluator, start, below_cost=problem.cost_per_hour(config)
        )
        if repaired is not None:
            candidates.append((repaired, evaluator.evaluate(repaired)))
    found = [c for c in candidates if c is not None]
    if not found:
        return None
    return min(found, key=lambda c: (c[1].cost_per_hour, c[1].tail_s))


def _downgrade_local(
    problem: PlanningProblem, evaluator: Evaluator, config: Config, m: int, hardware: str
) -> tuple[Config, Evaluation] | None:
    name = problem.topology.stages[m]
    budget = config[m].replicas * problem.hardware_costs[config[m].hardware]
    unit = problem.hardware_costs[hardware]
    lo, hi = problem.replica_bounds(name)[0], _replica_cap(problem, config, m, hardware)
    if unit > 0.0:
        hi = min(hi, math.ceil(budget / unit) + 1)
        while hi >= lo and round(hi * unit, 9) >= round(budget, 9):
            hi -= 1
    best: tuple[tuple[float, float, int], Config, Evaluation] | None = None
    for batch in problem.batch_options(name, hardware):

        def at(r: int, batch: int = batch) -> Config:
            return _with(config, m, StageConfig(hardware, batch, r))

        if hi < lo or not evaluator.feasible(at(hi)):
            continue
        low, high = lo, hi
        while low < high:
            mid = (low + high) // 2
            if evaluator.feasible(at(mid)):
                high = mid
            else:
                low = mid + 1
        verdict = evaluator.evaluate(at(high))
        key = (verdict.cost_per_hour, verdict.tail_s, batch)
        if best is None or key < best[0]:
            best = (key, at(high), verdict)
    return None if best is None else (best[1], best[2])


def _remove_replica(
    problem: PlanningProblem, evaluator: Evaluator, config: Config, m: int, variant: Variant
) -> tuple[Config, Evaluation] | None:
    """RemoveReplica on stage m. ``"inferline"``: one replica fewer, nothing else.
    ``"sloline"``: one replica fewer at the smallest batch size that keeps the SLO; if none
    does, a repair from the lowest-latency batch: Algorithm 1's bottleneck growth over the
    *other* stages, kept only if the result is still cheaper (e.g. a GPU replica traded for
    two CPU replicas that absorb the extra queueing)."""
    c = config[m]
    name = problem.topology.stages[m]
    batches = problem.batch_options(name, c.hardware) if variant == "sloline" else (c.max_batch,)
    tried = []
    for batch in sorted(batches):  # the smallest feasible batch wins: stop there
        new = _with(config, m, StageConfig(c.hardware, batch, c.replicas - 1))
        verdict = evaluator.evaluate(new)
        if verdict.feasible:
            return new, verdict
        tried.append((new, verdict))
    if variant == "inferline":
        return None
    start, _ = min(tried, key=lambda t: (t[1].tail_s, t[0][m].max_batch))
    repaired = _grow_until_feasible(
        problem, evaluator, start, problem.cost_per_hour(config), frozen=frozenset({m})
    )
    return None if repaired is None else (repaired, evaluator.evaluate(repaired))


@dataclass(frozen=True, slots=True)
class _Candidate:
    """An action not yet evaluated, with a lower bound on the cost it can reach."""

    floor: float
    kind: ActionKind
    stage: int
    run: Callable[[], tuple[Config, Evaluation] | None]


def _candidates(
    problem: PlanningProblem,
    evaluator: Evaluator,
    config: Config,
    variant: Variant,
    downgrades: bool,
) -> list[_Candidate]:
    """Algorithm 2's actions on ``config``, each with a lower bound on its resulting cost:
    IncreaseBatch keeps the cost; RemoveReplica (with its repair, which only grows the
    others while cheaper) saves at most one replica of the stage; DowngradeHW at most the
    stage's cost less its fewest replicas on the cheaper class."""
    cost = problem.cost_per_hour(config)
    found: list[_Candidate] = []
    for m, name in enumerate(problem.topology.stages):
        c = config[m]
        unit = problem.hardware_costs[c.hardware]
        lo = problem.replica_bounds(name)[0]
        cap = max(problem.batch_options(name, c.hardware))
        if problem.override(name).max_batch is None and c.max_batch < cap:
            new = _with(config, m, replace(c, max_batch=min(2 * c.max_batch, cap)))

            def batch(new: Config = new) -> tuple[Config, Evaluation] | None:
                verdict = evaluator.evaluate(new)
                return (new, verdict) if verdict.feasible else None

            found.append(_Candidate(cost, "increase-batch", m, batch))
        if c.replicas > lo:

            def remove(m: int = m) -> tuple[Config, Evaluation] | None:
                return _remove_replica(problem, evaluator, config, m, variant)

            found.append(_Candidate(cost - unit, "remove-replica", m, remove))
        cheaper = _next_cheaper(problem, config, m) if downgrades else None
        if cheaper is not None:

            def downgrade(m: int = m, hw: str = cheaper) -> tuple[Config, Evaluation] | None:
                return _downgrade(problem, evaluator, config, m, hw, variant)

            floor = cost - c.replicas * unit + lo * problem.hardware_costs[cheaper]
            found.append(_Candidate(floor, "downgrade-hardware", m, downgrade))
    return found


def actions(
    problem: PlanningProblem,
    evaluator: Evaluator,
    config: Config,
    variant: Variant = "sloline",
    *,
    downgrades: bool = True,
) -> list[Action]:
    """Every feasible single action on ``config`` (Algorithm 2, lines 8-13); see
    :func:`_remove_replica` and :func:`_downgrade` for how the variants differ.
    ``downgrades=False`` leaves out DowngradeHW (each stage keeps its hardware)."""
    found: list[Action] = []
    for candidate in _candidates(problem, evaluator, config, variant, downgrades):
        result = candidate.run()
        if result is not None:
            found.append(Action(candidate.kind, candidate.stage, *result))
    return found


def _action_key(action: Action) -> tuple[float, float, int, int]:
    verdict = action.evaluation
    return verdict.cost_per_hour, verdict.tail_s, action.stage, _ACTION_RANK[action.kind]


def minimize_cost(
    problem: PlanningProblem,
    evaluator: Evaluator,
    config: Config,
    variant: Variant = "sloline",
    *,
    downgrades: bool = True,
) -> Config:
    """Algorithm 2 from a feasible ``config``: the most cost-reducing feasible action per
    iteration (IncreaseBatch counts as a zero reduction) until none is feasible
    (``downgrades=False``: with every stage kept on its hardware).

    The actions are tried in order of the lowest cost they can reach, and those that
    cannot match the best found so far are not run: the same choice as running every
    action (:func:`actions`), with fewer estimates."""
    while True:
        best: Action | None = None
        candidates = _candidates(problem, evaluator, config, variant, downgrades)
        for candidate in sorted(candidates, key=lambda c: c.floor):
            if best is not None and candidate.floor > best.evaluation.cost_per_hour + _EPS:
                break
            result = candidate.run()
            if result is None:
                continue
            action = Action(candidate.kind, candidate.stage, *result)
            if best is None or _action_key(action) < _action_key(best):
                best = action
        if best is None:
            return config
        config = best.config


def multi_start(
    problem: PlanningProblem, evaluator: Evaluator, start: Config, variant: Variant = "sloline"
) -> Config:
    """Algorithm 2 with two ways out of its traps, from the feasible ``start``; never
    dearer than Algorithm 2 from ``start``, and no single action lowers the result's cost.

    The greedy takes the biggest saving first, so a downgrade to a cheap, slow class (or a
    free batch increase) can spend the latency budget that later, bigger savings needed.
    So ``start`` is descended twice — by Algorithm 2, and by Algorithm 2 with every stage
    kept on its hardware, then Algorithm 2 — and the cheaper result (ties: lower tail) is
    then improved by :func:`_escape`."""
    direct = minimize_cost(problem, evaluator, start, variant)
    kept = minimize_cost(problem, evaluator, start, variant, downgrades=False)
    kept = minimize_cost(problem, evaluator, kept, variant)
    best = min((direct, kept), key=lambda c: _ranked(evaluator, c))
    return _escape(problem, evaluator, best, variant)


def _escape(
    problem: PlanningProblem, evaluator: Evaluator, config: Config, variant: Variant
) -> Config:
    """Moves that RemoveReplica and DowngradeHW do not make, from a local minimum: stage m
    one replica fewer on its class, or at its fewest replicas on any class (an upgrade
    too) whose price is lower, at *every* batch size (not only the best one alone); the
    other stages grow as in Algorithm 1 while the total stays cheaper, then Algorithm 2
    descends; where none is cheaper, the :func:`_paired_moves` (grown by the tail where
    the bottleneck does not help, :func:`_grow_tail`). The first cheaper result replaces
    ``config`` and the moves start over, the dearest stages first. E.g. a GPU stage at
    batch 16 with one replica fewer, where the CPU stage before it needs two more
    replicas to keep its output steady."""
    stages = problem.topology.stages
    while True:
        cost = problem.cost_per_hour(config)
        order = sorted(range(len(stages)), key=lambda m: -_stage_cost(problem, config, m))
        moves = (
            (m, new)
            for kind in (_moves, _paired_moves)
            for m in order
            for new in kind(problem, config, m)
        )
        for m, new in moves:
            frozen = frozenset({m}) if new[m].hardware == config[m].hardware else frozenset()
            grown = _grow_until_feasible(problem, evaluator, new, cost, frozen)
            if grown is None:
                grown = _grow_tail(problem, evaluator, new, cost, frozen)
            if grown is None:
                continue
            found = minimize_cost(problem, evaluator, grown, variant)
            if problem.cost_per_hour(found) < cost - _EPS:
                config = found
                break
        else:
            return config


def _stage_cost(problem: PlanningProblem, config: Config, m: int) -> float:
    return config[m].replicas * problem.hardware_costs[config[m].hardware]


def _moves(problem: PlanningProblem, config: Config, m: int) -> list[Config]:
    name = problem.topology.stages[m]
    current = config[m]
    lo = problem.replica_bounds(name)[0]
    moves = []
    for hw in problem.usable_hardware(name):
        replicas = current.replicas - 1 if hw == current.hardware else lo
        cheaper = replicas * problem.hardware_costs[hw] < _stage_cost(problem, config, m) - _EPS
        if replicas >= lo and cheaper:
            moves += [
                _with(config, m, StageConfig(hw, batch, replicas))
                for batch in problem.batch_options(name, hw)
            ]
    return [move for move in moves if problem.fits_devices(move)]


def _paired_moves(problem: PlanningProblem, config: Config, m: int) -> list[Config]:
    """Stage m one replica fewer while another stage j gets faster at its replica count:
    on a class with a lower batch-1 latency (at the largest batch up to its own), or on
    its class at a smaller batch. This undoes a downgrade or a batch increase that spent
    the latency budget a saving on m needs (a CPU stage back on two cores so that a GPU
    stage can drop a replica); only moves that start cheaper than ``config``."""
    name = problem.topology.stages[m]
    current = config[m]
    if current.replicas - 1 < problem.replica_bounds(name)[0]:
        return []
    fewer = _with(config, m, replace(current, replicas=current.replicas - 1))
    saving = problem.hardware_costs[current.hardware]
    moves = []
    for j, other in enumerate(problem.topology.stages):
        if j == m:
            continue
        c = config[j]
        latency = problem.single_latency_s(other, c.hardware)
        faster = [
            StageConfig(hw, b, c.replicas)
            for hw in problem.usable_hardware(other)
            if problem.single_latency_s(other, hw) < latency
            for b in problem.batch_options(other, hw)
            if b <= c.max_batch
        ]
        smaller = [
            replace(c, max_batch=b)
            for b in problem.batch_options(other, c.hardware)
            if b < c.max_batch
        ]
        for option in faster + smaller:
            price = problem.hardware_costs[option.hardware] - problem.hardware_costs[c.hardware]
            if c.replicas * price < saving - _EPS:
                moves.append(_with(fewer, j, option))
    return [move for move in moves if problem.fits_devices(move)]


def _ranked(evaluator: Evaluator, config: Config) -> tuple[float, float]:
    verdict = evaluator.evaluate(config)
    return verdict.cost_per_hour, verdict.tail_s


def plan(
    problem: PlanningProblem,
    evaluator: Evaluator | None = None,
    *,
    variant: Variant = "sloline",
    search: Search = "multi-start",
    warm_start: Config | None = None,
) -> Plan:
    """Plan a pipeline: Algorithm 1, then :func:`multi_start` (``search="multi-start"``)
    or Algorithm 2 from Algorithm 1's start alone (``search="greedy"``, InferLine's).

    ``warm_start``, a configuration known to be feasible (the deployed plan when
    re-planning, or a plan for a tighter SLO), is descended from as well and the cheaper
    result kept, so re-planning never proposes something dearer than what already works.
    Raises :class:`InfeasibleError` (with a reason) when no configuration meets the SLO.

    The number of routers: where the profile measures the router's CPU, each count of
    :func:`router_counts` in turn, from the fewest, plans the stages; the first count
    with a feasible plan is kept, and the next while its plan is cheaper (routers
    included). Without a router model the problem's count is kept. ``evaluator``, if
    given, is for the problem's own count."""
    found: tuple[PlanningProblem, Evaluator, Config] | None = None
    failure: InfeasibleError | None = None
    for routers in router_counts(problem):
        current = replace(problem, routers=routers)
        if found is not None and _cost_floor(current) >= found[0].cost_per_hour(found[2]) - _EPS:
            break  # the stages at their cheapest with this many routers cost no less
        own = evaluator if evaluator is not None and routers == problem.routers else None
        judge = own or Evaluator(current)
        try:
            config = _plan_stages(current, judge, variant, search, warm_start)
        except InfeasibleError as exc:
            if found is not None:  # more routers than the cheapest so far: no better
                break
            if exc.reason == "ServiceTimeExceedsSLO":  # more routers cannot help
                raise
            failure = exc
            continue
        if found is not None and current.cost_per_hour(config) >= (
            found[0].cost_per_hour(found[2]) - _EPS
        ):
            break
        found = (current, judge, config)
    if found is None:
        assert failure is not None
        counts = router_counts(problem)
        if len(counts) > 1:
            raise InfeasibleError(
                failure.reason, f"{failure} (tried {counts[0]}-{counts[-1]} routers)"
            )
        raise failure
    return describe(*found)


def _cost_floor(problem: PlanningProblem) -> float:
    """The least any configuration of ``problem`` costs: every stage at its fewest
    replicas on its cheapest usable class, and the routers."""
    stages = sum(
        problem.replica_bounds(name)[0]
        * min(problem.hardware_costs[hw] for hw in problem.usable_hardware(name))
        for name in problem.topology.stages
    )
    return round(stages + problem.routers * problem.router_cost_per_hour, 9)


def router_floor(problem: PlanningProblem) -> int:
    """The fewest routers whose profiled CPU can carry the planning trace's mean rate at
    all: per request its CPU, and per stage visit the CPU per item and per batch at the
    stage's largest batch (a lower bound of what any plan costs the routers)."""
    overhead = problem.profile.overhead
    if overhead is None:
        return 1
    cpu = overhead.router_request_cpu_s
    for name in problem.topology.stages:
        cap = max(max(problem.batch_options(name, hw)) for hw in problem.usable_hardware(name))
        cpu += problem.profile.scale_factors[name] * overhead.router_visit_cpu_s(cap)
    return int(mean_rate_rps(problem.arrivals_s) * cpu) + 1


def router_counts(problem: PlanningProblem) -> range:
    """The router counts :func:`plan` tries, fewest first: from the problem's count, or
    :func:`router_floor` if more, up to ``max_routers`` (where the routers share the
    workers' cores, no more routers than cores: more would only share them). Without a
    measured router (no serving overhead) the problem's count alone."""
    if problem.profile.overhead is None:
        return range(problem.routers, problem.routers + 1)
    lo = max(problem.routers, router_floor(problem))
    hi = problem.max_routers
    cores = _shared_cores(problem)
    if cores is not None:
        hi = min(hi, max(lo, cores))
    return range(min(lo, hi), hi + 1)


def _plan_stages(
    problem: PlanningProblem,
    evaluator: Evaluator,
    variant: Variant,
    search: Search,
    warm_start: Config | None,
) -> Config:
    """:func:`plan`'s stage search at the problem's router count."""
    results: list[Config] = []
    descend = multi_start if search == "multi-start" else minimize_cost
    try:
        results.append(descend(problem, evaluator, initialize(problem, evaluator), variant))
    except InfeasibleError:
        if warm_start is None or not evaluator.feasible(warm_start):
            raise
    if warm_start is not None and evaluator.feasible(warm_start):
        results.append(minimize_cost(problem, evaluator, warm_start, variant))
    return min(results, key=lambda c: (problem.cost_per_hour(c), evaluator.evaluate(c).tail_s))


def plan_sweep(
    problem: PlanningProblem, slos_s: Sequence[float], *, variant: Variant = "sloline"
) -> list[Plan | InfeasibleError]:
    """Plans for several SLOs on the same trace (cost-vs-SLO curves, Fig. 10).

    Independent greedy runs can cost slightly more for a looser SLO (§7.2: the planner
    "occasionally finds sub-optimal configurations"); here each SLO, taken in increasing
    order, is warm-started from the plan for the previous one, so the cost never rises as
    the SLO loosens. Results are in the order of ``slos_s``; an infeasible SLO gives its
    :class:`InfeasibleError`."""
    results: dict[float, Plan | InfeasibleError] = {}
    previous: Config | None = None
    for slo in sorted(set(slos_s)):
        current = replace(problem, slo_s=slo)
        try:
            planned = plan(current, variant=variant, warm_start=previous)
        except InfeasibleError as exc:
            results[slo] = exc
            continue
        results[slo] = planned
        previous = planned.config
    return [results[slo] for slo in slos_s]
