"""Where a request's time goes, and what the workers' lower priority and the client's
pacing change.

The example pipeline is served embedded with its plan (as ``estimator_accuracy.py``
serves it), once with the workers at nice 0 (the router's priority) and once at the
local backend's default (``WORKER_NICE``), alternately, ``--reps`` times each, each time
on a fresh pipeline. ``sloline calibrate``'s client, in its own process and session
(gRPC aio, one prebuilt request per query carrying the query's number as its id),
replays the same open-loop
gamma trace; the router records when the front door's ``ModelInfer`` handler starts and
ends for each id. Per query, on one clock (CLOCK_MONOTONIC in both processes):

- ``send lag``: from the scheduled send time to the client's send;
- ``to handler``: from the client's send to the handler's start — the client's gRPC
  stack, loopback, and the wait for the router's event loop (the router waits for a
  core here when the workers keep both busy);
- ``handler``: the handler itself — decoding, the pipeline (``Router.infer``), encoding;
- ``to client``: from the handler's end to the answer at the client.

Each row gives the P50 and P99 of each part and of the whole (from the scheduled send),
and the share of queries within the SLO.

``--clients`` picks how the client paces its sends, each run in turn: ``precise`` (the
client as ``sloline calibrate`` runs it: a ``select(2)`` loop, polling the last 0.3 ms
before a send) and ``polled`` (the client before it: asyncio's epoll loop, whose timers
round up to whole milliseconds, polling the last 1.5 ms). The client's CPU over the run
is reported beside.

    python benchmarks/request_split.py [--example digits-cascade] [--rate 200] [--cv2 4]
                                       [--duration-s 60] [--reps 2] [--nices 0 10]
                                       [--clients precise polled]

Prints a markdown table and writes
benchmarks/results/request_split-EXAMPLE-RATErps-cv2-CV2[-clients].json (or ``--out``).
Results and analysis: docs/planner.md, "Worker priority" and "The client's polling".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import estimator_accuracy as ea  # first: sets up gRPC as the serving process does
import numpy as np
import psutil  # type: ignore[import-untyped]

from sloline.backends.local import WORKER_NICE
from sloline.common.trace import gamma_arrivals
from sloline.measure import calibrate
from sloline.measure.calibrate import client_process
from sloline.measure.profiler import ProfilerSettings
from sloline.serving import grpc_frontdoor, process

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = ("send lag", "to handler", "handler", "to client")


HANDLER: dict[str, tuple[float, float]] = {}  # request id -> handler start, end


def _record_handler_times() -> None:
    """Wrap the front door's ModelInfer to record when it starts and ends per request id."""
    infer = grpc_frontdoor.InferenceServicer.ModelInfer

    async def timed(self: Any, request: Any, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return await infer(self, request, context)
        finally:
            HANDLER[request.id] = (start, time.perf_counter())

    grpc_frontdoor.InferenceServicer.ModelInfer = timed  # type: ignore[method-assign]


def polled_client_process(conn: Any, url: str, model: str, payloads: Any, ids: int) -> None:
    """`client_process` as it was: on asyncio's default (epoll) loop, polling the last
    1.5 ms before each send."""
    os.setsid()
    calibrate.SPIN_S = 0.0015
    asyncio.run(calibrate._client_main(conn, url, model, payloads, ids))


CLIENTS = {"precise": client_process, "polled": polled_client_process}


def _ms(values: np.ndarray, q: float) -> float:
    return ea.percentile(values[np.isfinite(values)], q) * 1e3


def measure(
    example: ea.Example, worker_nice: int, client_kind: str, arrivals: np.ndarray, rate: float
) -> dict[str, Any]:
    with ea.Served(example.loaded, example.served_configs, worker_nice=worker_nice) as served:
        client = process.ChildProcess(
            "client",
            CLIENTS[client_kind],
            served.pipeline.grpc_url,
            example.loaded.name,
            example.payloads,
            arrivals.size,
        )
        try:
            client.call(gamma_arrivals(rate, 5.0, cv2=4.0, seed=999), 120.0)  # warm-up
            HANDLER.clear()
            cpu0 = sum(psutil.Process(client.pid).cpu_times()[:2])
            result = client.call(arrivals, float(arrivals[-1]) + 120.0)
            client_cores = (sum(psutil.Process(client.pid).cpu_times()[:2]) - cpu0) / float(
                arrivals[-1]
            )
        finally:
            client.close()
    scheduled = result["start"] + arrivals
    handler = np.array([HANDLER.get(str(i), (math.nan, math.nan)) for i in range(arrivals.size)])
    total = result["done"] - scheduled
    parts = {
        "send lag": result["sent"] - scheduled,
        "to handler": handler[:, 0] - result["sent"],
        "handler": handler[:, 1] - handler[:, 0],
        "to client": result["done"] - handler[:, 1],
    }
    missed = ~np.isfinite(total) | (total > example.slo_s)
    return {
        "worker_nice": worker_nice,
        "client": client_kind,
        "client_cores": client_cores,
        "queries": int(arrivals.size),
        "errors": result["errors"],
        "p50_ms": _ms(total, 50.0),
        "p99_ms": _ms(np.where(np.isfinite(total), total, math.inf), 99.0),
        "attainment": 1.0 - float(missed.mean()),
        "parts": {k: {"p50_ms": _ms(v, 50.0), "p99_ms": _ms(v, 99.0)} for k, v in parts.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", default="digits-cascade", choices=sorted(ea.PIPELINES))
    parser.add_argument("--rate", type=float, default=200.0, help="arrival rate, rps")
    parser.add_argument("--cv2", type=float, default=4.0, help="CV² of the inter-arrivals")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--reps", type=int, default=2, help="runs per nice value")
    parser.add_argument("--nices", type=int, nargs="+", default=[0, WORKER_NICE])
    parser.add_argument("--clients", nargs="+", default=["precise"], choices=sorted(CLIENTS))
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None, help="results file")
    args = parser.parse_args()
    _record_handler_times()
    example = ea.prepare(args.example, ProfilerSettings())
    process.freeze_startup_heap()
    arrivals = gamma_arrivals(args.rate, args.duration_s, cv2=args.cv2, seed=args.seed)
    runs = []
    print(
        "| workers' nice | client | client cores | run | P50 ms | P99 ms | within SLO | "
        + " | ".join(f"{p}: P50 / P99 ms" for p in PARTS)
        + "\n|---:|---|---:|---:|---:|---:|---:|"
        + "---:|" * len(PARTS)
    )
    for rep in range(args.reps):
        for nice, kind in itertools.product(args.nices, args.clients):
            print(
                f"{args.example}: workers at nice {nice}, {kind} client, run {rep + 1} ...",
                file=sys.stderr,
            )
            run = measure(example, nice, kind, arrivals, args.rate)
            runs.append(run)
            parts = run["parts"]
            cells = [f"{parts[p]['p50_ms']:.2f} / {parts[p]['p99_ms']:.1f}" for p in PARTS]
            print(
                f"| {nice} | {kind} | {run['client_cores']:.3f} | {rep + 1} "
                f"| {run['p50_ms']:.1f} | {run['p99_ms']:.1f} | "
                f"{run['attainment']:.2%} | " + " | ".join(cells) + " |",
                flush=True,
            )
    RESULTS.mkdir(exist_ok=True)
    name = f"request_split-{args.example}-{args.rate:g}rps-cv2-{args.cv2:g}"
    out = args.out or RESULTS / f"{name}{'-clients' if args.clients != ['precise'] else ''}.json"
    report = {"settings": vars(args), "slo_ms": example.slo_s * 1e3, "runs": runs}
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
