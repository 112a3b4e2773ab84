"""Seeded planning problems priced like a cloud with two GPU generations, to judge the
planner on problems it was not developed on (``sloline.lab.synthetic`` is the other family).

Stages are *GPU-like* (a batch of b takes ``fixed + b * per_item`` on a GPU; on a CPU no
batching gain and 8-40x slower per item) or *CPU-like* (pre/post-processing: the same time
per item on every class, no batching gain). Hardware classes, 2-4 per problem, drawn from:
``gpu-fast`` ($3.06/h, a V100-like card), ``gpu-slow`` ($0.90/h, 2-4x slower per item and
in fixed cost, a K80-like card), ``cpu`` ($0.10/h, one core) and ``cpu-2`` ($0.20/h, two
cores, 1.8x faster); every problem has at least one GPU class and ``cpu``. Topologies are
chains or DAGs (a stage reads one or two earlier stages); rates 20-300 rps, gamma traces
with CV² 1 or 4; the SLO is 1.3-5x the pipeline's fastest pure service time plus up to
40 ms.

:func:`slower` gives any problem on a host slower (or faster) than the one profiled.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sloline.common.trace import gamma_arrivals
from sloline.lab.synthetic import best_latency_s
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import BatchLatency, PipelineProfile, StageProfile
from sloline.planner.topology import Topology

__all__ = ["PRICES", "cloud_problem", "slower"]

PRICES = {"gpu-fast": 3.06, "gpu-slow": 0.90, "cpu": 0.10, "cpu-2": 0.20}
_BATCHES = (1, 2, 4, 8, 16, 32)
_HOP_S = 0.0005


def _affine(hardware: str, fixed_s: float, per_item_s: float, cap: int) -> StageProfile:
    return StageProfile.from_latencies(
        hardware, {b: fixed_s + b * per_item_s for b in _BATCHES if b <= cap}
    )


def _stage(rng: np.random.Generator, hardware: list[str]) -> dict[str, StageProfile]:
    if rng.random() < 0.65:  # GPU-like: a fixed launch cost and a per-item cost
        fixed = float(rng.uniform(1.0, 12.0)) / 1e3
        per_item = float(rng.uniform(0.1, 2.0)) / 1e3
        slow = float(rng.uniform(2.0, 4.0))
        cpu_single = (fixed + per_item) * float(rng.uniform(8.0, 40.0))
        profiles = {
            "gpu-fast": _affine("gpu-fast", fixed, per_item, 32),
            "gpu-slow": _affine("gpu-slow", fixed * slow, per_item * slow, 32),
            "cpu": _affine("cpu", 0.0, cpu_single, 8),
            "cpu-2": _affine("cpu-2", 0.0, cpu_single / 1.8, 8),
        }
    else:  # CPU-like: the same time per item everywhere
        single = float(rng.uniform(0.5, 6.0)) / 1e3
        profiles = {
            "gpu-fast": _affine("gpu-fast", 0.0, single, 16),
            "gpu-slow": _affine("gpu-slow", 0.0, single, 16),
            "cpu": _affine("cpu", 0.0, single, 16),
            "cpu-2": _affine("cpu-2", 0.0, single / 1.8, 16),
        }
    return {hw: profiles[hw] for hw in hardware}


def _topology(rng: np.random.Generator, names: list[str]) -> Topology:
    deps: dict[str, list[str]] = {names[0]: []}
    chain = rng.random() < 0.5
    for m in range(1, len(names)):
        if chain or m == 1 or rng.random() < 0.5:
            deps[names[m]] = [names[m - 1]] if chain else [names[int(rng.integers(m))]]
        else:
            picks = rng.choice(m, size=2, replace=False)
            deps[names[m]] = [names[int(i)] for i in sorted(picks)]
    read = {d for ds in deps.values() for d in ds}
    deps[names[-1]] += [n for n in names[:-1] if n not in read and n not in deps[names[-1]]]
    return Topology.from_deps(deps, names[-1])


def cloud_problem(
    seed: int,
    *,
    n_stages: int | None = None,
    n_hardware: int | None = None,
    duration_s: float = 20.0,
    rate_rps: float | None = None,
    max_replicas: int = 32,
    trace_seed: int | None = None,
) -> PlanningProblem:
    """A reproducible problem: 2-4 stages and 2-4 hardware classes unless given.
    ``trace_seed`` (default ``seed``) draws the planning trace alone: other values give
    fresh traces of the same arrival process for the same pipeline."""
    rng = np.random.default_rng([seed, 24])
    n = int(n_stages if n_stages is not None else rng.integers(2, 5))
    k = int(n_hardware if n_hardware is not None else rng.integers(2, 5))
    gpus = ["gpu-fast", "gpu-slow"]
    if k == 2:
        hardware = [gpus[int(rng.integers(2))], "cpu"]
    elif k == 3:
        hardware = (
            [*gpus, "cpu"] if rng.random() < 0.7 else [gpus[int(rng.integers(2))], "cpu", "cpu-2"]
        )
    else:
        hardware = [*gpus, "cpu", "cpu-2"]
    names = [f"s{m}" for m in range(n)]
    topology = _topology(rng, names)
    profiles = {name: _stage(rng, hardware) for name in names}
    profile = PipelineProfile(profiles, {}, hop_s=_HOP_S)
    floor = best_latency_s(topology, profiles, _HOP_S)
    rate = float(rate_rps if rate_rps is not None else rng.uniform(20.0, 300.0))
    cv2 = float(rng.choice([1.0, 4.0]))
    return PlanningProblem(
        topology=topology,
        profile=profile,
        hardware_costs={hw: PRICES[hw] for hw in hardware},
        slo_s=floor * float(rng.uniform(1.3, 5.0)) + float(rng.uniform(0.0, 0.04)),
        arrivals_s=gamma_arrivals(
            rate, duration_s, cv2=cv2, seed=seed if trace_seed is None else trace_seed
        ),
        max_replicas=max_replicas,
        name=f"cloud-{seed}",
    )


def slower(problem: PlanningProblem, factor: float) -> PlanningProblem:
    """``problem`` on a host ``factor`` times slower (faster below 1): every model time of
    every stage on every class x ``factor`` (idle penalties, hops and the router as
    profiled)."""
    if factor == 1.0:
        return problem
    stages = {
        name: {
            hw: dataclasses.replace(
                stage,
                points=tuple(
                    BatchLatency(
                        p.batch_size,
                        p.p50_s * factor,
                        p.p99_s * factor,
                        p.mean_s * factor,
                        tuple(v * factor for v in p.samples_s),
                    )
                    for p in stage.points
                ),
            )
            for hw, stage in per_hw.items()
        }
        for name, per_hw in problem.profile.stages.items()
    }
    return dataclasses.replace(problem, profile=dataclasses.replace(problem.profile, stages=stages))
