"""How long a real sloline worker takes to start serving: the replica activation delay
that the closed-loop tuner simulation assumes (InferLine §5 uses 5 s).

Serves ``examples/digits-cascade`` embedded (router plus local worker processes, tuner
off), then for every stage repeatedly asks the local backend for one more replica and
times the interval from the request to the moment the router counts the new worker as
connected: the worker process has started, imported its runtime, loaded its model and
opened its stream, so it takes the next batch from its stage queue. The extra replica
is then removed again. A ``--load`` rate keeps requests flowing meanwhile, so the
worker starts on a machine that is serving, as it would when the tuner scales up.

Run ``python benchmarks/worker_startup.py`` (about a minute); results in
``benchmarks/results/worker_startup.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from sloline.embedded import EmbeddedPipeline, EmbeddedSettings, StageDeployment
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.spec import load_pipeline

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "digits-cascade"
RESULTS = ROOT / "benchmarks" / "results" / "worker_startup.json"


async def _load(url: str, rate_rps: float, stop: asyncio.Event) -> tuple[int, int]:
    """Poisson requests at ``rate_rps`` until ``stop``; returns (answered, failed)."""
    rng = np.random.default_rng(0)
    pixels = np.zeros(64, np.float32)
    done = failed = 0
    async with grpcaio.InferenceServerClient(url) as client:

        async def one() -> None:
            nonlocal done, failed
            x = grpcaio.InferInput("pixels", [64], "FP32")
            x.set_data_from_numpy(pixels)
            try:
                await client.infer("digits-cascade", [x])
                done += 1
            except InferenceServerException:
                failed += 1

        tasks = []
        while not stop.is_set():
            await asyncio.sleep(rng.exponential(1.0 / rate_rps))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return done, failed


async def _until(predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("worker did not connect in time")
        await asyncio.sleep(0.002)


async def measure(repeat: int, rate_rps: float) -> dict[str, list[float]]:
    loaded = load_pipeline(EXAMPLE / "pipeline.yaml")
    configs = {s.name: StageDeployment("cpu-1", 8, 1) for s in loaded.pipeline.spec.stages}
    # The measurement is about start-up, not the example's 50 ms SLO: a generous deadline
    # keeps a shared, busy machine from turning slow answers into rejections.
    settings = EmbeddedSettings(
        server=ServerSettings(http_port=0, grpc_port=0),
        router=RouterSettings(deadline_factor=50.0),
        tuner=False,
    )
    async with EmbeddedPipeline(loaded, settings, configs=configs) as pipeline:
        await pipeline.wait_ready(120.0)
        assert pipeline.backend is not None
        backend, router = pipeline.backend, pipeline.router
        stop = asyncio.Event()
        load = asyncio.create_task(_load(pipeline.grpc_url, rate_rps, stop))
        times: dict[str, list[float]] = {}
        for stage in configs:
            times[stage] = []
            for _ in range(repeat):
                started = time.monotonic()
                backend.scale(stage, 2)
                await _until(lambda s=stage: router.replicas()[s][1] >= 2)
                times[stage].append(time.monotonic() - started)
                backend.scale(stage, 1)
                await _until(lambda s=stage: router.replicas()[s][1] <= 1)
                await asyncio.sleep(0.5)
        stop.set()
        answered, failed = await load
    print(f"{answered} requests answered, {failed} failed during the measurement")
    return times


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_s": round(statistics.median(ordered), 3),
        "p90_s": round(float(np.percentile(ordered, 90)), 3),
        "min_s": round(ordered[0], 3),
        "max_s": round(ordered[-1], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="start-ups per stage")
    parser.add_argument("--load", type=float, default=50.0, help="request rate meanwhile")
    args = parser.parse_args(argv)
    subprocess.run([sys.executable, str(EXAMPLE / "build.py")], check=True, capture_output=True)
    times = asyncio.run(measure(args.repeat, args.load))
    every = [t for values in times.values() for t in values]
    rows = {stage: summary(values) for stage, values in times.items()}
    rows["all"] = summary(every)
    for stage, row in rows.items():
        print(f"{stage:12s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": {
            "command": "python benchmarks/worker_startup.py",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0],
            "repeat": args.repeat,
            "load_rps": args.load,
        },
        "summary": rows,
        "samples_s": {stage: [round(t, 4) for t in values] for stage, values in times.items()},
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
