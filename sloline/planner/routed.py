"""The estimate of a pipeline with a measured serving overhead: the whole pipeline through
the routed simulation (:mod:`sloline.planner.sim.pipeline`), the router, hops, request
paths and shared cores included.

:func:`~sloline.planner.estimator.estimate` imports this module on the first profile with
an overhead, so that planners of profiles without one do not compile its kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sloline.planner.config import StageConfig
from sloline.planner.estimator import Estimate, StageStats, Workload
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import PipelineProfile
from sloline.planner.sim.draws import ServiceDraws, ServiceMode, overhead_draws, service_draws
from sloline.planner.sim.pipeline import PipelineInputs, simulate_pipeline
from sloline.planner.sim.rule import dependants
from sloline.planner.topology import Topology

__all__ = ["estimate_routed", "routed_inputs", "router_of", "with_configurations"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# SeedSequence spawn key of stage m's hop draws, (m + 1, 1); the request paths' is (0, 1),
# the routers the requests reach (0, 2).
_HOP_STREAM = 1
_ROUTER_STREAM = 2


def _service_arrays(
    draws: Sequence[ServiceDraws], config: Sequence[StageConfig], n_batches: int
) -> tuple[FloatArray, IntArray, FloatArray, FloatArray]:
    """The stages' service draws as arrays over stages: tables, columns, scales and idle
    penalties (padded with points beyond the last gap, holding the last extra time)."""
    n_stages = len(draws)
    width = max(d.table_s.shape[1] for d in draws)
    tables = np.zeros((n_stages, max(c.max_batch for c in config) + 1, width))
    cols = np.zeros((n_stages, n_batches), dtype=np.int64)
    scales = np.ones((n_stages, n_batches))
    points = max(d.idle_s.shape[1] for d in draws)
    idle = np.zeros((n_stages, 2, points))
    for m, d in enumerate(draws):
        tables[m, : d.table_s.shape[0], : d.table_s.shape[1]] = d.table_s
        if d.cols.size:
            cols[m] = d.cols[:n_batches]
        if d.scales.size:
            scales[m] = d.scales[:n_batches]
        k = d.idle_s.shape[1]
        idle[m, :, :k] = d.idle_s
        idle[m, 0, k:] = d.idle_s[0, -1] + np.arange(1, points - k + 1)
        idle[m, 1, k:] = d.idle_s[1, -1]
    return tables, cols, scales, idle


def _requests(
    overhead: ServingOverhead, workload: Workload, service: ServiceMode, seed: int
) -> FloatArray:
    """Each query's request path outside the router. A co-located client is simulated
    with its own CPU; the measured request path then loses the measuring client's share
    of it."""
    client_share = overhead.client_cpu_s if workload.client_cpu_s > 0.0 else 0.0
    request_table = np.maximum(overhead.request_table_s() - client_share, 0.0)
    return overhead_draws(request_table, service, workload.size, seed, (0, _HOP_STREAM))


def router_of(routers: int, size: int, seed: int) -> IntArray:
    """The router each of ``size`` requests reaches: uniformly at random among
    ``routers`` (a stream keyed by (seed, 0, 2)), as a kernel's ``SO_REUSEPORT`` or a
    Service spreads many client connections; one router: all 0."""
    if routers == 1:
        return np.zeros(size, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, _ROUTER_STREAM)))
    return rng.integers(0, routers, size=size, dtype=np.int64)


def _rows(
    topology: Topology,
    profile: PipelineProfile,
    rows: Sequence[tuple[int, StageConfig]],
    service: ServiceMode,
    seed: int,
    n_batches: int,
) -> dict[str, Any]:
    """The per-configuration inputs of ``rows`` (stage, configuration): batch limits,
    cores, service draws and hops. A stage's rows share its streams of draws."""
    overhead = profile.overhead
    if overhead is None:
        raise ValueError("the profile has no serving overhead to simulate")
    config = [c for _, c in rows]
    profiles = [profile.stage(topology.stages[m], c.hardware) for m, c in rows]
    draws = [
        service_draws(p, c.max_batch, service, 0.0, n_batches, seed=seed, stage=m)
        for (m, c), p in zip(rows, profiles, strict=True)
    ]
    tables, cols, scales, idle = _service_arrays(draws, config, n_batches)
    hop_table = np.maximum(overhead.hop_table_s() - overhead.worker_batch_cpu_s, 0.0)
    hops = np.stack(
        [overhead_draws(hop_table, service, n_batches, seed, (m + 1, _HOP_STREAM)) for m, _ in rows]
    )
    return {
        "max_batch": np.array([c.max_batch for c in config], dtype=np.int64),
        "replica_cores": np.array([float(p.cores) for p in profiles]),
        "tables": tables,
        "cols": cols,
        "scales": scales,
        "hops": hops,
        "idle": idle,
    }


def routed_inputs(
    topology: Topology,
    profile: PipelineProfile,
    config: Sequence[StageConfig],
    workload: Workload,
    service: ServiceMode,
    seed: int,
    routers: int = 1,
) -> PipelineInputs:
    """The routed simulation's inputs for ``config`` and ``routers`` routers (the profile
    must have an overhead)."""
    counts = [workload.size if ix is None else ix.size for ix in workload.visit_index]
    rows = _rows(topology, profile, list(enumerate(config)), service, seed, max(1, *counts))
    overhead = profile.overhead
    assert overhead is not None  # checked by _rows
    child_ptr, child_idx = dependants(topology)
    return PipelineInputs(
        arrivals_s=workload.arrivals_s,
        visits=workload.visits,
        child_ptr=child_ptr,
        child_idx=child_idx,
        n_deps=np.array([len(d) for d in topology.deps], dtype=np.int64),
        output=topology.output,
        replicas=np.array([c.replicas for c in config], dtype=np.int64),
        requests=_requests(overhead, workload, service, seed),
        router_cpu_s=np.array(
            [
                overhead.router_request_cpu_s,
                overhead.router_batch_cpu_s,
                overhead.router_item_cpu_s,
            ]
        ),
        router_idle=overhead.router_idle_table()[None],
        worker_cpu_s=overhead.worker_batch_cpu_s,
        client_cpu_s=workload.client_cpu_s,
        cores=float(overhead.cores or 0),
        worker_weight=overhead.worker_weight,
        routers=routers,
        router_of=router_of(routers, workload.size, seed),
        **rows,
    )


def with_configurations(
    inputs: PipelineInputs,
    topology: Topology,
    profile: PipelineProfile,
    rows: Sequence[tuple[int, StageConfig]],
    service: ServiceMode,
    seed: int,
) -> PipelineInputs:
    """``inputs`` with one configuration row per (stage, configuration) of ``rows``, drawn
    as :func:`routed_inputs` draws them (a closed loop's reconfigurations)."""
    return inputs._replace(**_rows(topology, profile, rows, service, seed, inputs.cols.shape[1]))


def estimate_routed(
    topology: Topology,
    profile: PipelineProfile,
    config: Sequence[StageConfig],
    workload: Workload,
    service: ServiceMode,
    seed: int,
    routers: int = 1,
) -> Estimate:
    """The estimate of ``config`` with ``routers`` routers for a profile with a serving
    overhead."""
    run = simulate_pipeline(
        routed_inputs(topology, profile, config, workload, service, seed, routers)
    )
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
    return Estimate(
        run.answered_s - arrivals,
        stats,
        run.router_busy_s,
        run.router_cpu_s,
        routers,
        run.router_busy_s / (routers * span) if span > 0.0 else 0.0,
    )
