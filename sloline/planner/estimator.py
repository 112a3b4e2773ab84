"""The Estimator: end-to-end latency of every query of a trace under one configuration (§4.2).

A deterministic discrete-event simulation of the router's dispatch semantics (docs/architecture.md,
"One request"): one FIFO queue per stage; an idle replica takes ``min(queue, max_batch)``
items at once; a batch occupies its replica for the profiled service time of (hardware,
batch size) plus the hop overhead; a stage becomes ready for a query when all its
dependencies have completed or been skipped; conditional routing replays the profiled
visit matrix (query i follows sample i mod n) or, without one, draws seeded Bernoulli
visits from the scale factors s_m; a skipped stage takes no time and skips the stages that
require it. End-to-end latency is the output stage's completion minus the arrival.

Queues are FIFO with no back-pressure, so each stage depends only on when queries become
ready at it. The simulation therefore runs stage by stage in topological order: ready
times are the element-wise max of the dependencies' completions (numpy), and each stage's
queue is one compiled pass over batches (:mod:`sloline.planner.sim.stage`). This is exactly
the global event simulation (a test proves it on random cases), at ~10 ns per item.

A profile with a measured serving overhead (router CPU, hop and request-path
distributions, shared cores: :mod:`sloline.planner.overhead`) couples the stages through
the router and the cores they share; then the whole pipeline is simulated at once, event
by event (:mod:`sloline.planner.routed`), with the same dispatch rules. That module is
imported on the first such estimate: where numba's cache is empty (a fresh container's
``NUMBA_CACHE_DIR``) its kernel takes 13-15 s to compile, which planners of profiles
without a serving overhead (the operator's) need not pay.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from sloline.planner.config import StageConfig
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import PipelineProfile
from sloline.planner.sim.draws import ServiceMode, service_draws
from sloline.planner.sim.stage import serve
from sloline.planner.topology import Topology

__all__ = [
    "Estimate",
    "StageCache",
    "StageStats",
    "Workload",
    "estimate",
    "no_queue_latencies",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# SeedSequence spawn key of the Bernoulli visits' random stream (stage m's service draws
# use (m + 1,), its hop draws (m + 1, 1), the request paths (0, 1)).
_VISIT_STREAM = 0


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """A planning trace prepared for one topology: arrivals plus who visits what.

    ``visits[i, m]``: query i runs stage m (topology order). ``client_cpu_s``: CPU per
    request of a single-threaded client on the pipeline's own cores (a load generator on
    the same machine, as in the estimator-vs-reality benchmark); 0 for a client elsewhere.
    Build it once per problem with :meth:`build`; every estimator call reuses it.
    """

    arrivals_s: FloatArray
    visits: BoolArray
    visit_index: tuple[npt.NDArray[np.intp] | None, ...]  # per stage; None = every query
    client_cpu_s: float = 0.0

    @classmethod
    def build(
        cls,
        topology: Topology,
        profile: PipelineProfile,
        arrivals_s: npt.ArrayLike,
        *,
        seed: int = 0,
        client_cpu_s: float = 0.0,
    ) -> Workload:
        """Visits from the profile's visit matrix (query i uses sample i mod n), else from
        seeded Bernoulli draws: stage m runs with probability s_m / min(s_d) given that
        its required dependencies d ran (exactly s_m overall when conditional stages form
        a tree, as in cascades), and never when one of them was skipped."""
        arrivals = np.array(arrivals_s, dtype=np.float64).ravel()
        if arrivals.size == 0:
            raise ValueError("the planning trace is empty")
        if not np.all(np.isfinite(arrivals)) or np.any(np.diff(arrivals) < 0.0):
            raise ValueError("arrival times must be finite and sorted (see trace_from_timestamps)")
        missing = [s for s in topology.stages if s not in profile.stages]
        if missing:
            raise ValueError(f"the profile has no stages {missing}")
        n = arrivals.size
        if profile.visits is not None:
            cols = [profile.visit_stages.index(s) for s in topology.stages]
            rows = np.arange(n) % profile.visits.shape[0]
            visits = np.ascontiguousarray(profile.visits[rows][:, cols])
        else:
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_VISIT_STREAM,)))
            draws = rng.random((n, len(topology)))
            visits = np.empty((n, len(topology)), dtype=np.bool_)
            for m, name in enumerate(topology.stages):
                s_m = profile.scale_factors[name]
                req = topology.required[m]
                parent = min((profile.scale_factors[topology.stages[d]] for d in req), default=1.0)
                p = 0.0 if parent <= 0.0 else min(1.0, s_m / parent)
                visits[:, m] = draws[:, m] < p
                for d in req:
                    visits[:, m] &= visits[:, d]
        arrivals.setflags(write=False)
        visits.setflags(write=False)
        index = tuple(None if col.all() else np.flatnonzero(col) for col in visits.T)
        if not (math.isfinite(client_cpu_s) and client_cpu_s >= 0.0):
            raise ValueError(f"client CPU per request must be >= 0 s, got {client_cpu_s!r}")
        return cls(arrivals, visits, index, float(client_cpu_s))

    @property
    def size(self) -> int:
        return int(self.arrivals_s.size)


@dataclass(frozen=True, slots=True)
class StageStats:
    """What one stage did in a simulation."""

    name: str
    visits: int
    batches: int
    busy_s: float
    utilisation: float  # busy time / (replicas x simulated span)

    @property
    def mean_batch(self) -> float:
        return self.visits / self.batches if self.batches else 0.0


@dataclass(frozen=True, slots=True, eq=False)
class Estimate:
    """Per-query end-to-end latencies (arrival order), per-stage statistics and, when the
    routers are simulated, how long they were busy and the CPU they spent (summed over
    the ``routers``) and their mean utilisation (busy time / (routers x simulated span))."""

    latencies_s: FloatArray
    stages: tuple[StageStats, ...]
    router_busy_s: float = 0.0
    router_cpu_s: float = 0.0
    routers: int = 1
    router_utilisation: float = 0.0

    def percentile_s(self, q: float) -> float:
        """Latency percentile with the inverted-CDF definition: the smallest latency that
        at least q% of queries do not exceed, so ``percentile_s(q) <= slo`` exactly when at
        least q% of queries meet the SLO."""
        return self.percentiles_s((q,))[0]

    def percentiles_s(self, qs: Sequence[float]) -> tuple[float, ...]:
        """Several percentiles at once (one partial sort): for each q the k-th smallest
        latency with k = ceil(n·q/100), numpy's ``inverted_cdf`` percentile."""
        n = self.latencies_s.size
        # The relative nudge keeps float noise in n·q/100 from rounding an exact k up.
        ranks = [min(n, max(1, math.ceil(n * q / 100.0 * (1.0 - 1e-12)))) - 1 for q in qs]
        ordered = np.partition(self.latencies_s, sorted(set(ranks)))
        return tuple(float(ordered[k]) for k in ranks)

    def attainment(self, slo_s: float) -> float:
        """Fraction of queries whose latency is within ``slo_s``."""
        return float(np.count_nonzero(self.latencies_s <= slo_s)) / self.latencies_s.size


def _ready_times(
    topology: Topology, m: int, done: list[FloatArray], arrivals: FloatArray
) -> FloatArray:
    deps = topology.deps[m]
    if not deps:
        return arrivals
    ready = done[deps[0]]
    for d in deps[1:]:
        ready = np.maximum(ready, done[d])
    return ready


@dataclass(frozen=True, slots=True, eq=False)
class _StageRun:
    done_s: FloatArray  # per query; a skipped stage is done when its deps are
    visits: int
    batches: int
    busy_s: float
    last_s: float  # latest completion


class StageCache:
    """Per-stage results shared across :func:`estimate` calls.

    A stage's completions depend only on its own configuration and its ancestors', so when
    the planner changes one stage, every stage that does not descend from it is reused
    instead of re-simulated. Entries are keyed by (stage, service mode, seed, the
    configurations of the stage and its ancestors) and bounded by ``max_bytes`` of
    completion arrays, least recently used out first. A cache belongs to one topology,
    profile and workload: use one per planning problem.
    """

    __slots__ = ("_ancestry", "_bytes", "_entries", "hits", "max_bytes", "misses")

    def __init__(self, topology: Topology, max_bytes: int = 128 << 20) -> None:
        ancestry: list[tuple[int, ...]] = []
        for m, deps in enumerate(topology.deps):
            members = {m}.union(*(ancestry[d] for d in deps))
            ancestry.append(tuple(sorted(members)))
        self._ancestry = ancestry
        self._entries: OrderedDict[Hashable, _StageRun] = OrderedDict()
        self._bytes = 0
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0

    def key(self, m: int, config: Sequence[StageConfig], service: str, seed: int) -> Hashable:
        return (m, service, seed, tuple(config[a] for a in self._ancestry[m]))

    def get(self, key: Hashable) -> _StageRun | None:
        run = self._entries.get(key)
        if run is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return run

    def put(self, key: Hashable, run: _StageRun) -> None:
        run.done_s.setflags(write=False)
        self._entries[key] = run
        self._bytes += run.done_s.nbytes
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.done_s.nbytes


def _run_stage(
    topology: Topology,
    profile: PipelineProfile,
    m: int,
    cfg: StageConfig,
    start: FloatArray,
    workload: Workload,
    service: ServiceMode,
    seed: int,
) -> _StageRun:
    index = workload.visit_index[m]
    ready = start if index is None else start[index]
    order: npt.NDArray[np.intp] | None = None
    if ready.size > 1 and np.any(ready[1:] < ready[:-1]):
        order = np.argsort(ready, kind="stable")  # FIFO; ties by sequence number
        ready = ready[order]
    draws = service_draws(
        profile.stage(topology.stages[m], cfg.hardware),
        cfg.max_batch,
        service,
        profile.hop_s,
        ready.size,
        seed=seed,
        stage=m,
    )
    run = serve(ready, cfg.max_batch, cfg.replicas, draws)
    finished = run.done_s
    if order is not None:
        finished = np.empty_like(run.done_s)
        finished[order] = run.done_s
    if index is not None:
        merged = start.copy()  # a skipped stage is done when its deps are
        merged[index] = finished
        finished = merged
    last = float(run.done_s.max()) if run.done_s.size else -math.inf
    return _StageRun(finished, int(ready.size), run.batches, run.busy_s, last)


def estimate(
    topology: Topology,
    profile: PipelineProfile,
    config: Sequence[StageConfig],
    workload: Workload,
    *,
    service: ServiceMode = "p50",
    seed: int = 0,
    cache: StageCache | None = None,
    routers: int = 1,
) -> Estimate:
    """Simulate ``workload`` through the pipeline configured by ``config`` (one entry per
    stage, topology order) behind ``routers`` routers. Deterministic: same inputs and
    seed, same result, with or without a ``cache`` (which only skips re-simulating
    stages whose inputs are unchanged).

    Several routers split the requests (each to a uniformly random one) and keep their
    own queues, so they run through the routed simulation: with the profile's serving
    overhead, else with routers that cost nothing and the profile's constant hop."""
    if len(config) != len(topology):
        raise ValueError(f"{len(config)} stage configs for {len(topology)} stages")
    if routers < 1:
        raise ValueError(f"routers must be >= 1, got {routers}")
    if profile.overhead is not None or routers > 1:
        from sloline.planner.routed import estimate_routed

        if profile.overhead is None:
            free = ServingOverhead(0.0, 0.0, 0.0, 0.0, (profile.hop_s,), (0.0,))
            profile = replace(profile, overhead=free)
        return estimate_routed(topology, profile, config, workload, service, seed, routers)
    arrivals = workload.arrivals_s
    done: list[FloatArray] = []
    runs: list[_StageRun] = []
    for m in range(len(topology)):
        key = cache.key(m, config, service, seed) if cache is not None else None
        run = cache.get(key) if cache is not None else None
        if run is None:
            start = _ready_times(topology, m, done, arrivals)
            run = _run_stage(topology, profile, m, config[m], start, workload, service, seed)
            if cache is not None:
                cache.put(key, run)
        done.append(run.done_s)
        runs.append(run)
    latencies = done[topology.output] - arrivals
    span = max(float(arrivals[-1]), *(r.last_s for r in runs)) - float(arrivals[0])
    stats = tuple(
        StageStats(
            name=name,
            visits=run.visits,
            batches=run.batches,
            busy_s=run.busy_s,
            utilisation=run.busy_s / (cfg.replicas * span) if span > 0.0 else 0.0,
        )
        for name, cfg, run in zip(topology.stages, config, runs, strict=True)
    )
    return Estimate(latencies, stats)


def no_queue_latencies(
    topology: Topology, workload: Workload, occupancy_s: Sequence[float]
) -> FloatArray:
    """Per-query latency with unlimited replicas: each visited stage adds its
    ``occupancy_s`` (service + hop) along the query's critical path. A lower bound of
    :func:`estimate` whenever ``occupancy_s`` is the fastest a stage can serve one item."""
    arrivals = workload.arrivals_s
    done: list[FloatArray] = []
    for m in range(len(topology)):
        start = _ready_times(topology, m, done, arrivals)
        finished = start + occupancy_s[m]
        index = workload.visit_index[m]
        if index is not None:
            finished = np.where(workload.visits[:, m], finished, start)
        done.append(finished)
    return done[topology.output] - arrivals
