"""Seeded random planning problems, for the planner's tests and benchmarks.

A problem is a small DAG of stages of two kinds: *DNN* stages, fast and batch-friendly on a
GPU-like class (a Clockwork profile) and 4-25x slower without batching gains on CPU classes,
and *light* stages (pre/post-processing) that run equally on every class (§2.1, Fig. 3).
Hardware classes are priced like the paper's cloud (§6): ``cpu-1`` $0.05/h, ``cpu-2``
(two threads, 1.8x faster) $0.10/h, ``gpu`` $0.90/h — the GPU is expensive but fast. The
planning trace has gamma inter-arrivals; the SLO is a random multiple of the pipeline's
fastest pure service time, so some problems are tight and some loose.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from sloline.common.trace import gamma_arrivals
from sloline.lab.clockwork import load_clockwork_profiles
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import PipelineProfile, StageProfile
from sloline.planner.topology import Topology

__all__ = ["HARDWARE_COSTS", "random_problem"]

HARDWARE_COSTS = {"cpu-1": 0.05, "cpu-2": 0.10, "gpu": 0.90}
_CPU2_SPEEDUP = 1.8
HOP_S = 0.0005


@cache
def _gpu_models() -> tuple[StageProfile, ...]:
    return tuple(load_clockwork_profiles(hardware="gpu").values())


def _scaled(profile: StageProfile, hardware: str, factor: float) -> StageProfile:
    return StageProfile.from_latencies(
        hardware, {p.batch_size: p.p50_s * factor for p in profile.points}
    )


def _linear(hardware: str, single_s: float, cap: int) -> StageProfile:
    """No batching gain: a batch of b takes b times as long (a CPU running one thread)."""
    sizes = [1 << k for k in range(cap.bit_length()) if 1 << k <= cap]
    return StageProfile.from_latencies(hardware, {b: b * single_s for b in sizes})


def _stage_profiles(rng: np.random.Generator, hardware: list[str]) -> dict[str, StageProfile]:
    if rng.random() < 0.7:  # a DNN
        gpu = _gpu_models()[int(rng.integers(len(_gpu_models())))]
        gpu = _scaled(gpu, "gpu", float(rng.uniform(0.8, 2.0)))
        cpu_single = gpu.latency_s(1) * float(rng.uniform(4.0, 25.0))
    else:  # light pre/post-processing: no faster on a GPU
        cpu_single = float(rng.uniform(0.5, 4.0)) / 1000.0
        gpu = _linear("gpu", cpu_single, 16)
    out = {"gpu": gpu, "cpu-1": _linear("cpu-1", cpu_single, 16)}
    out["cpu-2"] = _linear("cpu-2", cpu_single / _CPU2_SPEEDUP, 16)
    return {hw: out[hw] for hw in hardware}


def _random_dag(rng: np.random.Generator, names: list[str]) -> dict[str, list[str]]:
    """Each stage reads one or two earlier stages; stages nobody reads feed the output."""
    deps: dict[str, list[str]] = {names[0]: []}
    for m in range(1, len(names)):
        k = 1 if m == 1 or rng.random() < 0.6 else 2
        picks = rng.choice(m, size=k, replace=False)
        deps[names[m]] = [names[int(i)] for i in sorted(picks)]
    read = {d for ds in deps.values() for d in ds}
    deps[names[-1]] += [n for n in names[:-1] if n not in read and n not in deps[names[-1]]]
    return deps


def best_latency_s(
    topology: Topology, profiles: dict[str, dict[str, StageProfile]], hop_s: float
) -> float:
    """The pipeline's best no-queue latency: each stage at batch 1 on its fastest class plus
    a hop, along the longest path (what a random problem's SLO is set against)."""
    fastest = [
        min(p.latency_s(1) for p in profiles[name].values()) + hop_s for name in topology.stages
    ]
    floor, _ = topology.longest_path(fastest)
    return float(floor)


def random_problem(
    seed: int,
    *,
    n_stages: int | None = None,
    n_hardware: int | None = None,
    duration_s: float = 20.0,
    rate_rps: float | None = None,
    max_replicas: int = 32,
) -> PlanningProblem:
    """A reproducible random problem: 2-4 stages and 2-3 hardware classes unless given."""
    rng = np.random.default_rng(seed)
    n = int(n_stages if n_stages is not None else rng.integers(2, 5))
    k = int(n_hardware if n_hardware is not None else rng.integers(2, 4))
    hardware = ["cpu-1", "gpu"] if k == 2 else ["cpu-1", "cpu-2", "gpu"]
    names = [f"s{m}" for m in range(n)]
    deps = _random_dag(rng, names)
    scale: dict[str, float] = {}
    optional: dict[str, list[str]] = {}
    if n >= 3 and rng.random() < 0.5:  # a conditional stage, read optionally downstream
        cond = names[int(rng.integers(1, n - 1))]
        scale[cond] = float(rng.uniform(0.2, 0.7))
        optional = {n_: [cond] for n_, ds in deps.items() if cond in ds}
    topology = Topology.from_deps(deps, names[-1], optional)
    profiles = {name: _stage_profiles(rng, hardware) for name in names}
    profile = PipelineProfile(profiles, scale, hop_s=HOP_S)
    floor = best_latency_s(topology, profiles, HOP_S)
    rate = float(rate_rps if rate_rps is not None else rng.uniform(20.0, 150.0))
    cv2 = float(rng.choice([1.0, 4.0]))
    return PlanningProblem(
        topology=topology,
        profile=profile,
        hardware_costs={hw: HARDWARE_COSTS[hw] for hw in hardware},
        slo_s=floor * float(rng.uniform(1.5, 4.0)) + float(rng.uniform(0.0, 0.05)),
        arrivals_s=gamma_arrivals(rate, duration_s, cv2=cv2, seed=seed),
        max_replicas=max_replicas,
        name=f"random-{seed}",
    )
