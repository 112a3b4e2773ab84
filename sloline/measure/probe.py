"""Measuring what serving adds around the models (:class:`ServingOverhead`), on a real
router with real worker processes and a real gRPC client through the front door.

Tiny pipelines are served embedded, one after the other: one identity stage, two identity
stages in a chain, and one stage that holds each batch for a while without using CPU (so
that bursts of requests queue and form batches), with batches of up to K and of one. A
client in its own process sends the pipeline's first sample request, one at a time with an
idle gap between requests as at low load, or in bursts. From the router process's CPU
time, the worker's CPU time, the client's latencies and the router's own latencies:

- router CPU per request with one stage R1 and with two R2: per stage visit R2 - R1, per
  request the rest; the same bursts of K requests into the holding stage served as K
  batches of one or as two batches differ by K - 2 batches' CPU and K - 2 wake-ups of
  an idle router (less the idle penalty below), which splits a visit's CPU into a
  per-batch and a per-item part;
- the same requests sent in process (``Router.infer``, no front door) give the router's
  CPU without the front door R1_in and its latency; per request, that latency minus the
  model time and R1_in is one hop sample (wire, wake-ups, the worker's decode/encode);
- per request, the client's latency minus the router's latency minus the front door's CPU
  (R1 - R1_in) is one sample of the request path outside the router;
- the worker's CPU per batch minus its model time is its own per-batch cost;
- the router's idle penalty: one identity stage, batches of one, requests sent one at a
  time after each of several gaps, and in bursts of K (where they find the router busy).
  Per request, the spaced runs' router CPU less the bursts' is the extra CPU of waking an
  idle router, by how long it was idle (the gap plus the request's time outside the
  router). The router's CPU per request is then that of a busy router: a request's CPU in
  the bursts less a stage visit's.

Everything else is measured at idle (requests spaced by ``gap_s``). Under load the hops and the
request path are longer, not shorter: at the examples' planned loads a hop took several
times as long as here, so estimates from these samples are optimistic (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sloline.backends.local import WORKER_NICE
from sloline.common.tensors import Arrays
from sloline.planner.overhead import IdlePenalty, ServingOverhead

__all__ = ["hold", "identity", "measure_overhead"]

Sent = tuple[list[float], float]  # a run's latencies and the client's CPU
T = TypeVar("T")

HOLD_S = 0.01  # the holding stage's time per batch (a sleep: no CPU)
BURST = 8  # requests per burst: the first is served alone, the other 7 as one batch
BLOCKS = 5  # each measurement in this many blocks (CPU: median over blocks)
IDLE_GAPS_S = (0.001, 0.002, 0.005, 0.02)  # the router's idle penalty: requests this far apart
STAGES_MODULE = "sloline_probe_stages"  # the probe pipelines' stage module (see _serve)
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def identity(inputs: Arrays) -> Arrays:
    """The stage of the probe pipelines: its outputs are its inputs."""
    return dict(inputs)


def hold(inputs: Arrays) -> Arrays:
    """Identity that holds each batch for HOLD_S without using CPU."""
    time.sleep(HOLD_S)
    return dict(inputs)


def _pipeline_doc(payload: Arrays, stages: list[str], max_batch: int) -> str:
    """A pipeline of ``stages`` (``identity`` or ``hold``) in a chain, their entrypoints in
    the module ``_serve`` writes beside it."""
    from sloline.common.tensors import datatype_of

    tensors: list[dict[str, Any]] = [
        {"name": k, "datatype": datatype_of(v), "shape": list(v.shape)} for k, v in payload.items()
    ]
    specs = []
    for k, entry in enumerate(stages):
        source = "" if k == 0 else f"s{k - 1}."
        specs.append(
            {
                "name": f"s{k}",
                "maxBatch": max_batch,
                "model": {"runtime": "python", "entrypoint": f"{STAGES_MODULE}:{entry}"},
                "inputs": [{"name": t["name"], "from": f"{source}{t['name']}"} for t in tensors],
                "outputs": tensors,
            }
        )
    doc = {
        "apiVersion": "sloline.dev/v1alpha1",
        "kind": "PredictionPipeline",
        "metadata": {"name": "probe"},
        "spec": {
            "slo": {"latencyMs": 1000},
            "workload": {"rateRps": 1},
            "inputs": tensors,
            "stages": specs,
            "output": f"s{len(stages) - 1}",
        },
    }
    return json.dumps(doc)


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


# --------------------------------------------------------------------------- the client
def _client_process(conn: Connection, url: str, payload: Arrays) -> None:
    """A plain gRPC client (the Open Inference Protocol stubs) answering commands."""
    import grpc

    from sloline.common.tensors import datatype_of
    from sloline.serving.proto import grpc_service_pb2 as pb
    from sloline.serving.proto import grpc_service_pb2_grpc as pb_grpc

    request = pb.ModelInferRequest(model_name="probe")
    for name, value in payload.items():
        request.inputs.add(name=name, datatype=datatype_of(value), shape=list(value.shape))
        request.raw_input_contents.append(np.ascontiguousarray(value).tobytes())
    with grpc.insecure_channel(url) as channel:
        infer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        while (command := conn.recv()) is not None:
            kind, count, gap_s = command
            cpu0 = time.process_time()
            latencies = []
            for _ in range(count):
                time.sleep(gap_s)
                if kind == "burst":
                    futures = [infer.future(request) for _ in range(BURST)]
                    for future in futures:
                        future.result()
                else:
                    start = time.perf_counter()
                    infer(request)
                    latencies.append(time.perf_counter() - start)
            conn.send((latencies, time.process_time() - cpu0))


# --------------------------------------------------------------------------- measurement
@dataclass(frozen=True, slots=True)
class _Run:
    router_cpu_s: float  # per request (or per burst)
    worker_cpu_s: float  # per request (or per burst)
    client_cpu_s: float  # per request
    client_s: np.ndarray  # per request, at the client
    router_s: np.ndarray  # per request, Router.infer
    service_s: np.ndarray  # per batch, the model's time


Served = Any  # sloline.embedded.EmbeddedPipeline (imported lazily: it pulls in serving)


async def _serve(
    payload: Arrays,
    stages: list[str],
    body: Callable[[Served], Awaitable[T]],
    max_batch: int = BURST,
) -> T:
    from sloline.embedded import EmbeddedPipeline, EmbeddedSettings
    from sloline.serving.server import ServerSettings
    from sloline.spec import load_pipeline

    with tempfile.TemporaryDirectory(prefix="sloline-probe-") as tmp:
        spec_file = Path(tmp) / "pipeline.yaml"
        # Entrypoints load only files in the model directory (sloline.spec.paths), never
        # sloline's own modules: the stages are re-exported from a file written there.
        (Path(tmp) / f"{STAGES_MODULE}.py").write_text(
            "from sloline.measure.probe import hold, identity  # noqa: F401\n"
        )
        spec_file.write_text(_pipeline_doc(payload, stages, max_batch))
        settings = EmbeddedSettings(server=ServerSettings(http_port=0, grpc_port=0), tuner=False)
        # Its own directory, whatever SLOLINE_MODEL_DIR says (a profiling Job sets it).
        probe = load_pipeline(spec_file, model_dir=tmp)
        async with EmbeddedPipeline(probe, settings) as served:
            await served.wait_ready()
            return await body(served)


def _worker_pids(served: Served) -> list[int]:
    backend = served.backend
    return [pid for stage in served.configs for pid in backend.pids(stage)]


async def _blocks(
    served: Served,
    count: int,
    send: Callable[[int], Awaitable[tuple[list[float], float]]],
) -> _Run:
    """Run ``send(block)`` (requests or bursts, returning latencies and client CPU) over
    ``count`` in BLOCKS blocks; CPU per request is the median over blocks, so that a
    neighbour's burst of activity during one block does not skew it."""
    pids = _worker_pids(served)
    block = max(1, count // BLOCKS)
    t0 = time.monotonic()
    router, worker, client, latencies = [], [], [], []
    for _ in range(BLOCKS):
        worker0, cpu0 = sum(_process_cpu_s(p) for p in pids), time.process_time()
        times, client_cpu = await send(block)
        router.append((time.process_time() - cpu0) / block)
        worker.append((sum(_process_cpu_s(p) for p in pids) - worker0) / block)
        client.append(client_cpu / block)
        latencies.extend(times)
    stats = served.router.stats
    return _Run(
        router_cpu_s=float(np.median(router)),
        worker_cpu_s=float(np.median(worker)),
        client_cpu_s=float(np.median(client)),
        client_s=np.asarray(latencies),
        router_s=stats.latency.since(t0).copy(),
        service_s=np.concatenate([r.since(t0) for r in stats.stage_service.values()]),
    )


async def _through_front_door(
    served: Served, payload: Arrays, runs: list[tuple[str, int, float]]
) -> list[_Run]:
    """Each of ``runs`` (kind, count, gap) from one client process, in turn."""
    from sloline.serving.process import ChildProcess

    client = ChildProcess("probe client", _client_process, served.grpc_url, payload)

    async def call(kind: str, n: int, gap_s: float) -> tuple[list[float], float]:
        latencies, cpu_s = await client.call_async((kind, n, gap_s))
        return list(latencies), float(cpu_s)

    try:
        await call("seq", 30, runs[0][2])  # warm-up: connection, code paths
        out = []
        for kind, count, gap_s in runs:

            def send(n: int, kind: str = kind, gap_s: float = gap_s) -> Awaitable[Sent]:
                return call(kind, n, gap_s)

            out.append(await _blocks(served, count, send))
        return out
    finally:
        client.close()


async def _in_process(served: Served, payload: Arrays, count: int, gap_s: float) -> _Run:
    from sloline.common.tensors import InferRequest, Tensor

    request = InferRequest("probe", {k: Tensor.from_array(v) for k, v in payload.items()})
    for _ in range(30):
        await served.router.infer(request)

    async def send(n: int) -> tuple[list[float], float]:
        latencies = []
        for _ in range(n):
            await asyncio.sleep(gap_s)
            start = time.perf_counter()
            await served.router.infer(request)
            latencies.append(time.perf_counter() - start)
        return latencies, 0.0

    return await _blocks(served, count, send)


def measure_overhead(
    payload: Arrays,
    *,
    requests: int = 300,
    bursts: int = 30,
    gap_s: float = 0.005,
    cores: int | None = None,
    batching: bool = True,
) -> ServingOverhead:
    """Measure the serving overhead with ``payload`` as every request's inputs (see the
    module doc). ``cores``: what the router and the workers will share (embedded: this
    machine's usable cores); None when they will not share cores. ``batching=False`` skips
    the two burst runs (half the probe's time): a visit's router CPU is then all per item,
    which leaves :meth:`ServingOverhead.visit_s` (a profiling Job's per-hop constant) as
    it is."""
    from sloline.serving import process

    async def front(served: Served) -> _Run:
        return (await _through_front_door(served, payload, [("seq", requests, gap_s)]))[0]

    async def inner(served: Served) -> _Run:
        return await _in_process(served, payload, requests, gap_s)

    async def burst(served: Served) -> _Run:
        return (await _through_front_door(served, payload, [("burst", bursts, 4 * HOLD_S)]))[0]

    async def idle(served: Served) -> tuple[_Run, list[_Run]]:
        runs = [("burst", bursts, 4 * HOLD_S)] + [("seq", requests // 2, g) for g in IDLE_GAPS_S]
        busy, *spaced = await _through_front_door(served, payload, runs)
        return busy, spaced

    async def both(served: Served) -> tuple[_Run, _Run]:
        return await front(served), await inner(served)

    async def run() -> tuple[_Run, _Run, _Run, float, tuple[_Run, list[_Run]] | None]:
        one, one_in = await _serve(payload, ["identity"], both)
        two = await _serve(payload, ["identity", "identity"], front)
        if not batching:
            return one, one_in, two, 0.0, None
        batched = await _serve(payload, ["hold"], burst)
        single = await _serve(payload, ["hold"], burst, max_batch=1)
        more = (single.router_cpu_s - batched.router_cpu_s) / (BURST - 2)
        return one, one_in, two, more, await _serve(payload, ["identity"], idle, max_batch=1)

    one, one_in, two, more, idle_runs = process.run(run())
    visit = max(0.0, two.router_cpu_s - one.router_cpu_s)
    if idle_runs is None:  # a router woken by every request: the spaced requests' CPU
        router_idle, per_request, wake = None, max(0.0, one.router_cpu_s - visit), 0.0
    else:  # a busy router's: a request's CPU in the bursts less a visit's
        busy, spaced = idle_runs
        router_idle = _router_idle(busy, spaced)
        per_request = max(0.0, busy.router_cpu_s / BURST - visit)
        wake = router_idle.extra_at(HOLD_S)
    per_batch = batch_cpu_s(more, wake, visit)
    front_door = max(0.0, one.router_cpu_s - one_in.router_cpu_s)
    n = min(one_in.client_s.size, one_in.service_s.size)
    hop = one_in.client_s[:n] - one_in.service_s[:n] - one_in.router_cpu_s
    m = min(one.client_s.size, one.router_s.size)
    request = one.client_s[:m] - one.router_s[:m] - front_door
    service = float(np.concatenate([one.service_s, one_in.service_s]).mean())
    worker = (one.worker_cpu_s + one_in.worker_cpu_s) / 2.0
    return ServingOverhead(
        router_request_cpu_s=per_request,
        router_batch_cpu_s=per_batch,
        router_item_cpu_s=visit - per_batch,
        worker_batch_cpu_s=max(0.0, worker - service),
        hop_s=tuple(np.maximum(hop, 0.0).tolist()),
        request_s=tuple(np.maximum(request, 0.0).tolist()),
        client_cpu_s=one.client_cpu_s,
        cores=cores,
        worker_nice=WORKER_NICE,  # the local backend's, which served the probe pipelines
        router_idle=router_idle,
    )


def _outside(run: _Run) -> float:
    """The median time of a request outside the router: with requests one at a time, how
    long the router sits idle between one answer and the next request besides the gap."""
    return float(np.median(run.client_s) - np.median(run.router_s))


def batch_cpu_s(more_s: float, wake_s: float, visit_s: float) -> float:
    """The router's CPU per batch, of a stage visit's ``visit_s``.

    The same bursts of K requests into the holding stage, served as K batches of one
    rather than as a batch of 1 and one of K - 1, cost the router ``more_s`` more per each
    of the K - 2 extra batches. Each extra batch's result also comes back to a router
    that sat idle for the hold (HOLD_S), whose wake-up the estimator charges apart, as
    the router's idle penalty (``wake_s`` at that gap; 0 where it is not measured): that
    is not per-batch CPU. Without it, the per-batch cost took the whole visit and the
    per-item none, and batching seemed to make the router's work vanish at high load."""
    return min(max(more_s - wake_s, 0.0), visit_s)


def _router_idle(busy: _Run, spaced: list[_Run]) -> IdlePenalty:
    """The router's idle penalty: per request, its CPU with requests one at a time after
    each of IDLE_GAPS_S less its CPU in bursts, where requests find it busy (the burst's
    first request and the last results still wake it: a small part of a burst's CPU)."""
    base = busy.router_cpu_s / BURST
    return IdlePenalty.from_medians(
        [gap + _outside(run) for gap, run in zip(IDLE_GAPS_S, spaced, strict=True)],
        [run.router_cpu_s - base for run in spaced],
    )
