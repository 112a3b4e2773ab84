"""Estimator speed: one hour of a 3-stage pipeline at 100 rps (target: at most 1 s).

Stage by stage (a profile with InferLine's per-hop constant), and as one simulation of the
whole pipeline with a measured serving overhead (the router as one server, hop and
request-path distributions, two shared cores), the way profiled pipelines are estimated.

Also times ``sloline simulate``'s closed-loop engine holding the same configuration with
a tick every second (the same simulation run in 3,600 segments, the policy called between
them), against the estimator's single run of it.

Also times one stage's queue loop compiled (numba, what the estimator runs) against the
same loop in the fastest pure Python we found (bisect and heapq over Python floats), after
checking that both give identical completion times — the measurement behind the choice of
numba in docs/planner.md.

    python benchmarks/estimator_speed.py [--quick]

Prints a markdown table and writes benchmarks/results/estimator_speed.json (``--quick``: a
60 s trace, written to estimator_speed.quick.raw.json, which git ignores).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import functools
import heapq
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np

from sloline.common.trace import gamma_arrivals
from sloline.lab.engine import EngineSettings, run_closed_loop
from sloline.lab.loop import Policy
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload, estimate
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import BatchLatency, PipelineProfile, StageProfile
from sloline.planner.sim.draws import ServiceMode, service_draws
from sloline.planner.sim.stage import serve
from sloline.planner.topology import Topology

RESULTS = Path(__file__).parent / "results"
RATE_RPS = 100.0


def pure_python_stage(
    ready: list[float], max_batch: int, replicas: int, occupancy: list[float]
) -> list[float]:
    """The compiled loop of sloline.planner.sim.stage in plain Python, deterministic service
    (``occupancy[k]``: service + hop of a batch of k) — its fastest pure-Python form."""
    n = len(ready)
    free = [float("-inf")] * replicas
    done = [0.0] * n
    i = 0
    while i < n:
        first_free = free[0]
        if first_free < ready[i]:
            start, k = ready[i], 1
        else:
            start = first_free
            k = bisect.bisect_right(ready, start, i, min(i + max_batch, n)) - i
        end = start + occupancy[k]
        done[i : i + k] = [end] * k
        heapq.heapreplace(free, end)
        i += k
    return done


def pipeline() -> tuple[Topology, PipelineProfile, list[StageConfig]]:
    """preprocess (CPU) -> resnet50 (GPU, Clockwork latencies) -> postprocess (CPU)."""
    cpu = StageProfile.from_latencies("cpu", {1: 0.002, 2: 0.004, 4: 0.008, 8: 0.016})
    gpu = StageProfile.from_latencies(
        "gpu", {1: 0.00261, 2: 0.00378, 4: 0.00561, 8: 0.00913, 16: 0.01567}
    )
    profile = PipelineProfile(
        {"pre": {"cpu": cpu}, "resnet": {"gpu": gpu}, "post": {"cpu": cpu}}, hop_s=0.0005
    )
    config = [StageConfig("cpu", 4, 1), StageConfig("gpu", 8, 1), StageConfig("cpu", 4, 1)]
    return Topology.chain(["pre", "resnet", "post"]), profile, config


def served_profile(profile: PipelineProfile) -> PipelineProfile:
    """The same pipeline with a serving overhead like the one measured on this machine
    (docs/planner.md): router CPU ~1 ms per request and ~0.5 ms per batch, hop and
    request-path samples, the workers' own CPU, two shared cores; each batch size gets 32
    service samples around its latency, so every service mode applies."""
    rng = np.random.default_rng(7)
    stages = {}
    for name, per_hw in profile.stages.items():
        stages[name] = {
            hw: StageProfile(
                hw,
                tuple(
                    BatchLatency.from_samples(
                        p.batch_size, (p.p50_s * rng.gamma(20.0, 0.05, 32)).tolist()
                    )
                    for p in stage.points
                ),
            )
            for hw, stage in per_hw.items()
        }
    overhead = ServingOverhead(
        router_request_cpu_s=0.001,
        router_batch_cpu_s=0.0005,
        router_item_cpu_s=0.00005,
        worker_batch_cpu_s=0.0005,
        hop_s=tuple(rng.gamma(2.0, 0.00015, 500)),
        request_s=tuple(rng.gamma(3.0, 0.0002, 500)),
        cores=2,
    )
    return dataclasses.replace(profile, stages=stages, overhead=overhead)


def median_time_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(cv2: float, duration_s: float, repeats: int) -> list[dict[str, Any]]:
    topology, profile, config = pipeline()
    arrivals = gamma_arrivals(RATE_RPS, duration_s, cv2=cv2, seed=1)
    workload = Workload.build(topology, profile, arrivals)
    rows = []
    cases: tuple[tuple[PipelineProfile, tuple[ServiceMode, ...], str], ...] = (
        (profile, ("p50", "exponential"), "3 stages"),
        (served_profile(profile), ("p50", "samples"), "3 stages + router, hops, 2 shared cores"),
    )
    for simulated, modes, what in cases:
        for mode in modes:
            run = functools.partial(estimate, topology, simulated, config, workload, service=mode)
            result = run()
            rows.append(
                {
                    "what": f"estimate(), {what}, CV²={cv2:g}, service={mode}",
                    "queries": int(arrivals.size),
                    "stage_visits": sum(s.visits for s in result.stages),
                    "median_s": median_time_s(run, repeats),
                    "p99_latency_ms": result.percentile_s(99.0) * 1e3,
                }
            )
            loop = functools.partial(
                run_closed_loop,
                topology,
                simulated,
                workload,
                Policy("plan", tuple(config), step=lambda _, state: (tuple(config), state)),
                duration_s,
                EngineSettings(service=mode),
            )
            rows.append(
                {
                    "what": f"closed-loop engine, 1 s ticks, {what}, CV²={cv2:g}, service={mode}",
                    "queries": int(arrivals.size),
                    "stage_visits": sum(s.visits for s in result.stages),
                    "median_s": median_time_s(loop, repeats),
                    "p99_latency_ms": float(np.percentile(loop().latencies_s, 99.0)) * 1e3,
                }
            )
    # One stage's loop, compiled vs pure Python, on the same ready times.
    ready = np.ascontiguousarray(arrivals)
    draws = service_draws(profile.stage("resnet", "gpu"), 8, "p50", profile.hop_s, ready.size)
    as_list = ready.tolist()
    occupancy = [draws.time_s(0, k) for k in range(9)]
    compiled = serve(ready, 8, 1, draws).done_s
    if not np.array_equal(compiled, pure_python_stage(as_list, 8, 1, occupancy)):
        raise AssertionError("the pure-Python loop disagrees with the compiled one")
    loops: list[tuple[str, Callable[[], object]]] = [
        ("numba", lambda: serve(ready, 8, 1, draws)),
        ("pure Python", lambda: pure_python_stage(as_list, 8, 1, occupancy)),
    ]
    for name, fn in loops:
        rows.append(
            {
                "what": f"one stage's queue loop, {name}, CV²={cv2:g}",
                "queries": int(arrivals.size),
                "stage_visits": int(arrivals.size),
                "median_s": median_time_s(fn, repeats),
                "p99_latency_ms": None,
            }
        )
    return rows


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 60 s trace, few repeats")
    args = parser.parse_args()
    duration_s = 60.0 if args.quick else 3600.0
    repeats = 3 if args.quick else 7
    estimate(*pipeline(), Workload.build(*pipeline()[:2], [0.0, 1.0]))  # load compiled code
    rows = [row for cv2 in (1.0, 4.0) for row in measure(cv2, duration_s, repeats)]
    machine = f"{cpu_model()}, {os.cpu_count()} cores"
    print(f"Estimator speed: {duration_s:g} s of trace at {RATE_RPS:g} rps on {machine}\n")
    print("| what | queries | stage visits | median time |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['what']} | {row['queries']:,} | {row['stage_visits']:,} "
            f"| {row['median_s'] * 1e3:.1f} ms |"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("estimator_speed.quick.raw.json" if args.quick else "estimator_speed.json")
    meta = {
        "machine": machine,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "duration_s": duration_s,
        "rate_rps": RATE_RPS,
        "repeats": repeats,
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
