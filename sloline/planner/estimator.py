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
queue is one compiled pass over batches (:mod:`sloline.planner.queueing`). This is exactly
the global event simulation (a test proves it on random cases), at ~10 ns per item.

A profile with a measured serving overhead (router CPU, hop and request-path
distributions, shared cores: :mod:`sloline.planner.overhead`) couples the stages through
the router and the cores they share; then the whole pipeline is simulated at once, event
by event (:mod:`sloline.planner.shared`), with the same dispatch rules. That module is
imported on the first such estimate: where numba's cache is empty (a fresh container's
``NUMBA_CACHE_DIR``) its kernel takes 13-15 s to compile, which planners of profiles
without a serving overhead (the operator's) need not pay.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from sloline.planner.config import StageConfig
from sloline.planner.profile import PipelineProfile, StageProfile, Stat
from sloline.planner.queueing import ServiceDraws, serve
from sloline.planner.topology import Topology

if TYPE_CHECKING:
    from sloline.planner.shared import SharedInputs

__all__ = [
    "Estimate",
    "ServiceMode",
    "StageCache",
    "StageStats",
    "Workload",
    "estimate",
    "no_queue_latencies",
    "service_draws",
    "summary_stat",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# How a batch's service time is drawn from its profile: a fixed statistic (p50 is the
# default, as InferLine's profiles are medians), a draw from the raw samples, or an
# exponential with the profiled mean (for checks against M/M/c closed forms).
ServiceMode = Literal["p50", "mean", "p99", "samples", "exponential"]
_SUMMARY: dict[str, Stat] = {"p50": "p50", "mean": "mean", "p99": "p99"}
# SeedSequence spawn keys of the random streams: the Bernoulli visits (0,); stage m's
# service draws (m + 1,) and hop draws (m + 1, 1); the request paths (0, 1).
_VISIT_STREAM = 0
_HOP_STREAM = 1


def summary_stat(mode: ServiceMode) -> Stat:
    """The fixed statistic that stands for ``mode`` in service-time screens."""
    return _SUMMARY.get(mode, "mean" if mode == "exponential" else "p50")


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
    router is simulated, how long it was busy and the CPU it spent."""

    latencies_s: FloatArray
    stages: tuple[StageStats, ...]
    router_busy_s: float = 0.0
    router_cpu_s: float = 0.0

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


_NO_INTS = np.empty(0, dtype=np.int64)
_NO_FLOATS = np.empty(0, dtype=np.float64)
_NO_IDLE = np.zeros((2, 1), dtype=np.float64)


def service_draws(
    profile: StageProfile,
    max_batch: int,
    mode: ServiceMode,
    hop_s: float,
    n_batches: int,
    *,
    seed: int = 0,
    stage: int = 0,
) -> ServiceDraws:
    """Service times of one stage's batches under ``mode``. Random modes pre-draw one value
    per possible batch from a stream keyed by (seed, stage), so the b-th batch of a stage
    always gets the b-th draw whatever the other stages do."""
    idle = profile.idle.table() if profile.idle is not None else _NO_IDLE
    if mode in _SUMMARY:
        table = profile.latency_table_s(max_batch, _SUMMARY[mode])[:, None]
        return ServiceDraws(np.ascontiguousarray(table), _NO_INTS, _NO_FLOATS, hop_s, idle)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stage + 1,)))
    if mode == "samples":
        table = profile.quantile_table_s(max_batch)
        cols = rng.integers(0, table.shape[1], size=n_batches, dtype=np.int64)
        return ServiceDraws(table, cols, _NO_FLOATS, hop_s, idle)
    table = np.ascontiguousarray(profile.latency_table_s(max_batch, "mean")[:, None])
    return ServiceDraws(table, _NO_INTS, rng.standard_exponential(n_batches), hop_s, idle)


def _overhead_draws(
    sorted_s: FloatArray, mode: ServiceMode, count: int, seed: int, key: tuple[int, ...]
) -> FloatArray:
    """``count`` values of a measured overhead distribution (sorted samples) under
    ``mode``: its statistic for the summary modes (the median for ``exponential``, whose
    exponential draws are for service times only), else draws from a stream keyed by
    (seed, key)."""
    if mode == "samples":
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
        return sorted_s[rng.integers(0, sorted_s.size, size=count)]
    if mode == "mean":
        value = float(sorted_s.mean())
    elif mode == "p99":
        value = float(np.percentile(sorted_s, 99.0, method="inverted_cdf"))
    else:
        value = float(np.median(sorted_s))
    return np.full(count, value)


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
) -> Estimate:
    """Simulate ``workload`` through the pipeline configured by ``config`` (one entry per
    stage, topology order). Deterministic: same inputs and seed, same result, with or
    without a ``cache`` (which only skips re-simulating stages whose inputs are unchanged)."""
    if len(config) != len(topology):
        raise ValueError(f"{len(config)} stage configs for {len(topology)} stages")
    if profile.overhead is not None:
        return _estimate_shared(topology, profile, config, workload, service, seed)
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


def _shared_inputs(
    topology: Topology,
    profile: PipelineProfile,
    config: Sequence[StageConfig],
    workload: Workload,
    service: ServiceMode,
    seed: int,
) -> SharedInputs:
    from sloline.planner.shared import SharedInputs

    overhead = profile.overhead
    assert overhead is not None
    n, n_stages = workload.size, len(topology)
    counts = [workload.size if ix is None else ix.size for ix in workload.visit_index]
    n_batches = max(1, *counts)
    profiles = [
        profile.stage(name, c.hardware) for name, c in zip(topology.stages, config, strict=True)
    ]
    draws = [
        service_draws(p, c.max_batch, service, 0.0, n_batches, seed=seed, stage=m)
        for m, (p, c) in enumerate(zip(profiles, config, strict=True))
    ]
    width = max(d.table_s.shape[1] for d in draws)
    tables = np.zeros((n_stages, max(c.max_batch for c in config) + 1, width))
    cols = np.zeros((n_stages, n_batches), dtype=np.int64)
    scales = np.ones((n_stages, n_batches))
    hops = np.empty((n_stages, n_batches))
    points = max(d.idle_s.shape[1] for d in draws)
    idle = np.zeros((2, n_stages, points))
    hop_table = np.maximum(overhead.hop_table_s() - overhead.worker_batch_cpu_s, 0.0)
    for m, d in enumerate(draws):
        tables[m, : d.table_s.shape[0], : d.table_s.shape[1]] = d.table_s
        if d.cols.size:
            cols[m] = d.cols[:n_batches]
        if d.scales.size:
            scales[m] = d.scales[:n_batches]
        hops[m] = _overhead_draws(hop_table, service, n_batches, seed, (m + 1, _HOP_STREAM))
        k = d.idle_s.shape[1]
        idle[:, m, :k] = d.idle_s
        # Pad with points beyond the last gap, holding the last extra time.
        idle[0, m, k:] = d.idle_s[0, -1] + np.arange(1, points - k + 1)
        idle[1, m, k:] = d.idle_s[1, -1]
    # A co-located client is simulated with its own CPU; the measured request path then
    # loses the measuring client's share of it.
    client_share = overhead.client_cpu_s if workload.client_cpu_s > 0.0 else 0.0
    request_table = np.maximum(overhead.request_table_s() - client_share, 0.0)
    requests = _overhead_draws(request_table, service, n, seed, (0, _HOP_STREAM))
    children: list[list[int]] = [[] for _ in range(n_stages)]
    for m, deps in enumerate(topology.deps):
        for dep in deps:
            children[dep].append(m)
    child_ptr = np.zeros(n_stages + 1, dtype=np.int64)
    child_ptr[1:] = np.cumsum([len(c) for c in children])
    return SharedInputs(
        arrivals_s=workload.arrivals_s,
        visits=workload.visits,
        child_ptr=child_ptr,
        child_idx=np.array([c for cs in children for c in cs], dtype=np.int64),
        n_deps=np.array([len(d) for d in topology.deps], dtype=np.int64),
        output=topology.output,
        max_batch=np.array([c.max_batch for c in config], dtype=np.int64),
        replicas=np.array([c.replicas for c in config], dtype=np.int64),
        replica_cores=np.array([float(p.cores) for p in profiles]),
        tables=tables,
        cols=cols,
        scales=scales,
        hops=hops,
        idle_gap=np.ascontiguousarray(idle[0]),
        idle_extra=np.ascontiguousarray(idle[1]),
        requests=requests,
        router_cpu_s=np.array(
            [
                overhead.router_request_cpu_s,
                overhead.router_batch_cpu_s,
                overhead.router_item_cpu_s,
            ]
        ),
        router_idle=overhead.router_idle_table(),
        worker_cpu_s=overhead.worker_batch_cpu_s,
        client_cpu_s=workload.client_cpu_s,
        cores=float(overhead.cores or 0),
        worker_weight=overhead.worker_weight,
    )


def _estimate_shared(
    topology: Topology,
    profile: PipelineProfile,
    config: Sequence[StageConfig],
    workload: Workload,
    service: ServiceMode,
    seed: int,
) -> Estimate:
    from sloline.planner.shared import simulate_shared

    run = simulate_shared(_shared_inputs(topology, profile, config, workload, service, seed))
    arrivals = workload.arrivals_s
    span = max(float(np.max(run.answered_s)), float(arrivals[-1])) - float(arrivals[0])
    stats = tuple(
        StageStats(
            name=name,
            visits=int(run.visits[m]),
            batches=int(run.batches[m]),
            busy_s=float(run.busy_s[m]),
            utilisation=float(run.busy_s[m]) / (cfg.replicas * span) if span > 0.0 else 0.0,
        )
        for m, (name, cfg) in enumerate(zip(topology.stages, config, strict=True))
    )
    return Estimate(run.answered_s - arrivals, stats, run.router_busy_s, run.router_cpu_s)


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
