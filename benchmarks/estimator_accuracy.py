"""Estimator vs reality: the planner's estimated P99 against the served pipeline.

For each example (``digits-cascade``, ``image-ensemble``, and the control ``sleepy``, whose
slow stage sleeps instead of computing) the pipeline is profiled once (cached) and planned
for its spec's workload; that plan is the fixed configuration. The
pipeline is then served embedded — the real router, front doors and one worker process
per replica, as `sloline run` starts them, tuner off — and for three arrival rates x
CV² in {1, 4}:

1. an open-loop trace ``gamma_arrivals(rate, duration, cv2=cv2, seed=seed)`` is made;
2. the estimator runs on exactly that trace with the same configuration and the profile's
   visit matrix (query i follows sample i mod n), service modes ``p50`` and ``samples``;
3. a load generator in its own process (own interpreter and event loop; tritonclient gRPC
   aio over loopback) sends request i at its timestamp with sample i mod n — the samples
   the profile was traced with, so the cascade's branch is taken at the profiled rate —
   and times each answer from the request's *scheduled* send time.

The estimate is made three ways: from the profile with service ``p50`` and ``samples`` (what
``sloline plan`` uses), and ``calibrated``: the same profile corrected by one 20 s run at
the planned load on a trace of its own before the cells (each stage's in-situ model time
against its profile, the hops and the request path under load; see ``calibrate``). The
load generator's CPU per request is measured before each cell at the cell's rate on a
trace of its own, without the CPU of its pacing.

A cell is run again (``--attempts``) when other processes used the cores during it, or
when the hypervisor stole the guest's CPU in some second (a host stall). With
``--repeats N`` every cell is measured N times on the same trace: the run with the median
measured P99 stands for the cell, and the table of repeats shows every run's P99, error
and attainment, i.e. how far the same trace moves from run to run on this machine.

Requests carry ``timeout_ms=30000``: the estimator does not simulate the router's deadline
drop (2 x SLO), so the measured tail must not be cut by it.

Besides the headline numbers it measures what the estimator leaves out: an idle probe
(sequential requests: client vs router latency, a bare gRPC round trip, each stage's
in-situ service and the router's per-hop time in situ), and per cell the client-router
gap, how late the client sent, each stage's in-situ service time against its profile,
its wall time against its CPU time (waiting for a core), and the CPU used by the router,
the client, the workers and everything else on the machine.

    python benchmarks/estimator_accuracy.py [--quick] [--duration-s S] [--examples NAME ...]
                                            [--cache-dir DIR] [--reprofile]
                                            [--attempts N] [--repeats N]
                                            [--quiet-timeout-s S]
                                            [--budget-s S]
    python benchmarks/estimator_accuracy.py --client-diagnostic RESULTS.json
    python benchmarks/estimator_accuracy.py --re-estimate RESULTS.json
    python benchmarks/estimator_accuracy.py --hop-diagnostic RESULTS.json
    python benchmarks/estimator_accuracy.py --calibration-parts RESULTS.json

Prints markdown tables and writes benchmarks/results/estimator_accuracy.json (``--quick``:
one 8 s cell per example, to estimator_accuracy.quick.raw.json, which git ignores).
Results and analysis: docs/planner.md, "Estimator vs reality".
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import gc
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import psutil  # type: ignore[import-untyped]
import uvloop

from sloline.serving import process
from sloline.serving.process import ChildProcess

# The router's process as `sloline run` sets it up: gRPC's I/O manager (read when grpc is
# first imported, below) and glibc's malloc thresholds; uvloop and gc.freeze() follow.
process.use_grpc_iomgr()

from sloline.backends.local import WORKER_NICE  # noqa: E402
from sloline.common.tensors import Arrays  # noqa: E402
from sloline.common.trace import gamma_arrivals  # noqa: E402
from sloline.embedded import EmbeddedPipeline, EmbeddedSettings, StageDeployment  # noqa: E402
from sloline.measure.calibrate import DRAIN_S, run_client  # noqa: E402
from sloline.measure.calibrate import replay as replay_arrivals  # noqa: E402
from sloline.measure.profiler import (  # noqa: E402
    ProfilerSettings,
    load_samples,
)
from sloline.measure.session import PlanningSession, plan_pipeline, planning_trace  # noqa: E402
from sloline.planner.calibration import Calibration, hops, idle_groups  # noqa: E402
from sloline.planner.config import StageConfig  # noqa: E402
from sloline.planner.estimator import (  # noqa: E402
    Estimate,
    Workload,
    estimate,
    no_queue_latencies,
)
from sloline.planner.problem import PlanningProblem  # noqa: E402
from sloline.planner.profile import (  # noqa: E402
    PipelineProfile,
    StageProfile,
)
from sloline.planner.sim.draws import ServiceMode  # noqa: E402
from sloline.planner.topology import Topology  # noqa: E402
from sloline.serving.memory import tune_malloc  # noqa: E402
from sloline.serving.server import ServerSettings  # noqa: E402
from sloline.spec import DEFAULT_CATALOG, LoadedPipeline, load_pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
T = TypeVar("T")

# Arrival rates as multiples of the spec's planning rate (the plan is made for 1.0).
# image-ensemble: the `large` CNN is the bottleneck (14-17 ms per item profiled on one
# thread, depending on the machine's load), so 10 / 15 / 20 rps load its one replica to
# ~20-40 % by the profile; served beside the other members it runs 1.3-1.6x slower than
# profiled, so higher rates overload it (docs/planner.md, "Estimator vs reality").
# digits-cascade: every model costs well under 1 ms and no stage is ever busy (estimated
# utilisation < 25 %); the router (~2 ms of CPU per request) and the client (~1 ms) load
# the machine.
# sleepy (tests/support/pipelines/sleepy) is a control: its slow stage sleeps 20 ms per item
# and uses no CPU, so its service time is what the profile says whatever else runs; the
# rates load its replicas to ~30 / 60 / 90 % (batching gains nothing there).
RATE_FACTORS = {
    "digits-cascade": (0.5, 1.0, 2.0),
    "image-ensemble": (0.5, 0.75, 1.0),
    "sleepy": (0.5, 1.0, 1.5),
}
PIPELINES = {
    "digits-cascade": ROOT / "examples" / "digits-cascade" / "pipeline.yaml",
    "image-ensemble": ROOT / "examples" / "image-ensemble" / "pipeline.yaml",
    "sleepy": ROOT / "tests" / "support" / "pipelines" / "sleepy" / "pipeline.yaml",
}
CV2S = (1.0, 4.0)
SERVICE_MODES: tuple[ServiceMode, ...] = ("p50", "samples")
TIMEOUT_MS = 30_000  # no deadline drops (the estimator does not simulate them)
CALIBRATION_S = 20.0  # per example, at the planned load: what the profile misses in situ
CALIBRATED = "calibrated"  # the estimate with the calibrated profile (service "p50")
CALIBRATED_SAMPLES = "calibrated_samples"  # the same profile, service "samples"
CLIENT_PROBE_S = 4.0  # before each cell: the load generator's CPU per request at its load
CLIENT_SEEDS = 999  # + a cell's seed: the seed of its client probe's trace, one no cell uses
TARGET_ERROR = 0.15
# Other tenants of the shared machine: a cell waits for them to go quiet (at most
# QUIET_TIMEOUT_S, then it runs anyway) and is repeated (at most MAX_ATTEMPTS times in
# all) when they ran during it all the same; --quiet-timeout-s and --attempts bound both.
QUIET_CORES = 0.15
QUIET_SPAN_S = 3.0
QUIET_TIMEOUT_S = 900.0
DISTURBED_1S_CORES = 0.5
STOLEN_1S_CORES = 0.05  # 50 ms of the guest's CPU time stolen by the host in one second
MAX_ATTEMPTS = 4
EXAMPLE_SETUP_S = 180.0  # --budget-s: profiling, serving, warm-up and idle probe, nominal
CELL_OVERHEAD_S = 30.0  # --budget-s: client probe, estimates, drain and analysis, nominal


# --------------------------------------------------------------------------- load generator
def _loadgen_process(
    conn: Connection, url: str, model: str, payloads: list[Arrays], datatypes: dict[str, str]
) -> None:
    """Body of the load-generator process: answers commands from the pipe until None.

    It runs in its own session, as each worker does (the local backend starts them with
    ``start_new_session``): with the kernel's autogroup scheduling a session is one
    scheduling group, and the client should compete for the cores like another tenant,
    not inside the router's share."""
    os.setsid()
    run_client(_loadgen_main(conn, url, model, payloads, datatypes))


async def _loadgen_main(
    conn: Connection, url: str, model: str, payloads: list[Arrays], datatypes: dict[str, str]
) -> None:
    import tritonclient.grpc.aio as grpcaio
    from tritonclient.utils import InferenceServerException

    loop = asyncio.get_running_loop()
    async with grpcaio.InferenceServerClient(url) as client:
        inputs = []
        for payload in payloads:
            tensors = []
            for name, value in payload.items():
                tensor = grpcaio.InferInput(name, list(value.shape), datatypes[name])
                tensor.set_data_from_numpy(value)
                tensors.append(tensor)
            inputs.append(tensors)
        params = {"timeout_ms": TIMEOUT_MS}

        async def infer(i: int) -> None:
            await client.infer(
                model,
                inputs[i % len(inputs)],
                parameters=params,
                client_timeout=TIMEOUT_MS / 1000 + 5,
            )

        while (command := await loop.run_in_executor(None, conn.recv)) is not None:
            kind, arg = command
            if kind == "probe":
                conn.send(await _probe(client.is_server_live, infer, int(arg)))
            elif kind == "replay":
                conn.send(await replay_arrivals(infer, np.asarray(arg), InferenceServerException))
            elif kind == "pace":  # the same pacing, nothing sent: what pacing alone costs
                conn.send(
                    await replay_arrivals(_no_request, np.asarray(arg), InferenceServerException)
                )


async def _no_request(_: int) -> None:
    """What ``pace`` sends instead of request i: nothing."""


async def _probe(
    live: Callable[[], Awaitable[Any]], infer: Callable[[int], Awaitable[None]], count: int
) -> dict[str, list[float]]:
    """Sequential requests on the idle pipeline: a bare gRPC round trip (ServerLive) and an
    inference, each timed at the client."""
    lives, infers = [], []
    for i in range(count):
        start = time.perf_counter()
        await live()
        lives.append(time.perf_counter() - start)
        start = time.perf_counter()
        await infer(i)
        infers.append(time.perf_counter() - start)
    return {"live_s": lives, "infer_s": infers}


def load_generator(
    url: str, model: str, payloads: list[Arrays], datatypes: dict[str, str]
) -> ChildProcess:
    """The load-generator process: answers ("replay" | "pace", arrivals) and ("probe", n)."""
    return ChildProcess("load generator", _loadgen_process, url, model, payloads, datatypes)


# --------------------------------------------------------------------------- served pipeline
class Served:
    """An EmbeddedPipeline on its own event loop in a background thread (as the tests do);
    the main thread only waits on the load generator meanwhile."""

    def __init__(
        self,
        loaded: LoadedPipeline,
        configs: dict[str, StageDeployment],
        *,
        worker_nice: int = WORKER_NICE,
    ) -> None:
        settings = EmbeddedSettings(
            server=ServerSettings(http_port=0, grpc_port=0), tuner=False, worker_nice=worker_nice
        )
        self.loop = uvloop.new_event_loop()  # as `sloline run` (serving.process.run)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pipeline = EmbeddedPipeline(loaded, settings, configs=configs)

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 180.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def __enter__(self) -> Served:
        async def start() -> None:
            await self.pipeline.__aenter__()
            await self.pipeline.wait_ready(180.0)

        try:
            self.call(start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self.pipeline.shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def router_window(self, t0: float) -> dict[str, Any]:
        """The router's request latencies, and per stage, batch by batch, its sizes, the
        workers' service and CPU times and the round trips, since ``t0`` (read on the
        router's loop)."""

        async def read() -> dict[str, Any]:
            stats = self.pipeline.router.stats
            return {
                "latency_s": stats.latency.since(t0).copy(),
                "batch": {s: r.since(t0).copy() for s, r in stats.stage_batch.items()},
                "service_s": {s: r.since(t0).copy() for s, r in stats.stage_service.items()},
                "cpu_s": {s: r.since(t0).copy() for s, r in stats.stage_cpu.items()},
                "idle_s": {s: r.since(t0).copy() for s, r in stats.stage_idle.items()},
                "roundtrip_s": {s: r.since(t0).copy() for s, r in stats.stage_roundtrip.items()},
            }

        return self.call(read())

    def processes(self, loadgen_pid: int) -> dict[str, psutil.Process]:
        backend = self.pipeline.backend
        assert backend is not None
        procs = {"router": psutil.Process(), "client": psutil.Process(loadgen_pid)}
        for stage in self.pipeline.configs:
            for k, pid in enumerate(backend.pids(stage)):
                procs[f"{stage}#{k}"] = psutil.Process(pid)
        return procs


class GcPauses:
    """Garbage-collector pauses of this process — the router's, since it serves here."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int, float]] = []  # (end, generation, seconds)
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            end = time.perf_counter()
            self.events.append((end, info["generation"], end - self._start))

    def summary(self, since: float) -> dict[str, float]:
        full = [d for t, g, d in self.events if t >= since and g == 2]
        young = [d for t, g, d in self.events if t >= since and g < 2]
        return {
            "full": len(full),
            "full_max_ms": max(full, default=0.0) * 1e3,
            "full_total_ms": sum(full) * 1e3,
            "young": len(young),
            "young_total_ms": sum(young) * 1e3,
        }


GC_PAUSES = GcPauses()


def _cpu_s(procs: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for name, proc in procs.items():
        try:
            times = proc.cpu_times()
            out[name] = times.user + times.system
        except psutil.Error:
            out[name] = math.nan
    return out


class CpuSampler:
    """Once a second, the cores busy machine-wide, the cores this pipeline and its client
    use, and the cores the hypervisor stole, to line latency spikes up with other people's
    jobs and with host stalls."""

    def __init__(self, procs: dict[str, psutil.Process]) -> None:
        self.procs = procs
        # (monotonic, all busy cores, ours, busy cores at normal priority, stolen cores)
        self.samples: list[tuple[float, float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ncpu = os.cpu_count() or 1
        before, ours0, t0 = psutil.cpu_times(), sum(_cpu_s(self.procs).values()), time.monotonic()
        while not self._stop.wait(1.0):
            after, ours1, t1 = (
                psutil.cpu_times(),
                sum(_cpu_s(self.procs).values()),
                time.monotonic(),
            )
            self.samples.append(
                (
                    t1,
                    _machine_busy(before, after) * ncpu,
                    (ours1 - ours0) / (t1 - t0),
                    _machine_busy(before, after, niced=False) * ncpu,
                    float(after.steal - before.steal) / (t1 - t0),
                )
            )
            before, ours0, t0 = after, ours1, t1

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def per_second(
    scheduled: np.ndarray, latency: np.ndarray, slo_s: float, cpu: CpuSampler, start_mono: float
) -> dict[str, list[float]]:
    """Per second of the trace (from the client's start): requests, SLO misses, P99 and
    max latency (ms), the cores other processes used in the same second (all of them,
    and those at normal priority; stolen time counts as used by others) and the cores
    stolen by the hypervisor."""
    second = np.floor(scheduled - start_mono).astype(int)
    out: dict[str, list[float]] = {
        "n": [],
        "misses": [],
        "p99_ms": [],
        "max_ms": [],
        "others_cores": [],
        "others_normal_cores": [],
        "steal_cores": [],
    }
    samples = np.array(cpu.samples) if cpu.samples else np.empty((0, 5))
    for k in range(int(second.max()) + 1 if scheduled.size else 0):
        lat = latency[second == k]
        lat = np.where(np.isfinite(lat), lat, math.inf)
        out["n"].append(int(lat.size))
        out["misses"].append(int(np.count_nonzero(lat > slo_s)))
        out["p99_ms"].append(round(percentile(lat, 99.0) * 1e3, 2) if lat.size else math.nan)
        out["max_ms"].append(round(float(lat.max()) * 1e3, 2) if lat.size else math.nan)
        # The sample whose 1 s interval ends closest after this second's end.
        t_end = start_mono + k + 1.0
        later = samples[samples[:, 0] >= t_end] if samples.size else samples
        later = later if later.size else samples[-1:]
        out["others_cores"].append(
            round(float(later[0, 1] - later[0, 2]), 2) if later.size else math.nan
        )
        out["others_normal_cores"].append(
            round(float(later[0, 3] - later[0, 2]), 2) if later.size else math.nan
        )
        out["steal_cores"].append(round(float(later[0, 4]), 3) if later.size else math.nan)
    return out


def _machine_busy(before: Any, after: Any, *, niced: bool = True) -> float:
    """Fraction of all CPU time that was busy between two cpu_times(); ``niced=False``
    leaves out the user time of niced processes (nice > 0), as idle."""
    fields = ("user", "nice", "system", "irq", "softirq", "steal")
    busy = sum(
        float(getattr(after, f) - getattr(before, f)) for f in fields if niced or f != "nice"
    )
    total = sum(float(getattr(after, f) - getattr(before, f)) for f in (*fields, "idle", "iowait"))
    return busy / max(1e-9, total)


def _ours_s(procs: dict[str, psutil.Process]) -> float:
    return sum(v for v in _cpu_s(procs).values() if math.isfinite(v))


def others_cores_now(procs: dict[str, psutil.Process], span_s: float, *, niced: bool) -> float:
    """Cores used by processes other than this pipeline and its client over ``span_s``
    (niced ones only with ``niced``)."""
    machine0, ours0, t0 = psutil.cpu_times(), _ours_s(procs), time.monotonic()
    time.sleep(span_s)
    machine1, ours1, t1 = psutil.cpu_times(), _ours_s(procs), time.monotonic()
    ncpu = os.cpu_count() or 1
    busy = _machine_busy(machine0, machine1, niced=niced)
    return busy * ncpu - (ours1 - ours0) / (t1 - t0)


def wait_quiet(procs: dict[str, psutil.Process], timeout_s: float, *, niced: bool) -> float:
    """Wait until other processes use at most QUIET_CORES for QUIET_SPAN_S (or the timeout);
    returns the seconds waited. Other tenants' jobs on the 2 shared cores are not part of
    the system under test, so a cell should not start in the middle of one. Niced jobs
    (nice > 0, e.g. test suites under ``nice -n 19``) count too: they get little CPU time
    beside the pipeline's processes, but a core busy with one still doubled digits-
    cascade's measured P99 (docs/planner.md, "Estimator vs reality"); ``niced`` False
    (``--ignore-niced``) leaves them out."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if others_cores_now(procs, QUIET_SPAN_S, niced=niced) <= QUIET_CORES:
            break
    return time.monotonic() - start


def others_key(niced: bool) -> str:
    """The cell's field of other processes' cores, niced ones included or not."""
    return "others_cores" if niced else "others_normal_cores"


def worst_second(cell: dict[str, Any], key: str) -> float:
    """The largest per-second value of ``key`` in the cell (0 without any)."""
    return max((c for c in cell["per_second"].get(key, ()) if math.isfinite(c)), default=0.0)


def disturbed(cell: dict[str, Any], *, niced: bool) -> bool:
    """Other tenants used the cores during the cell (niced ones counted with ``niced``):
    on average more than QUIET_CORES, or more than DISTURBED_1S_CORES in some second; or
    the hypervisor stole more than STOLEN_1S_CORES of the guest's cores in some second (a
    host stall: every process of the pipeline stops at once, which no estimate of this
    machine's serving models)."""
    key = others_key(niced)
    return bool(
        cell[key] > QUIET_CORES
        or worst_second(cell, key) > DISTURBED_1S_CORES
        or worst_second(cell, "steal_cores") > STOLEN_1S_CORES
    )


# --------------------------------------------------------------------------- estimation
def percentile(values: np.ndarray, q: float) -> float:
    """Inverted-CDF percentile, the estimator's definition (`Estimate.percentile_s`)."""
    if values.size == 0:
        return math.nan
    return float(np.percentile(values, q, method="inverted_cdf"))


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    loaded: LoadedPipeline
    session: PlanningSession
    config: tuple[StageConfig, ...]  # topology order
    payloads: list[Arrays]

    @property
    def slo_s(self) -> float:
        return self.session.plan.slo_s

    @property
    def stages(self) -> tuple[str, ...]:
        return self.topology.stages

    @property
    def served_configs(self) -> dict[str, StageDeployment]:
        """The plan's configuration as the embedded pipeline takes it."""
        return {
            name: StageDeployment(c.hardware, c.max_batch, c.replicas)
            for name, c in zip(self.stages, self.config, strict=True)
        }

    @property
    def topology(self) -> Topology:
        return self.session.problem.topology


def estimate_cell(
    topology: Topology,
    config: Sequence[StageConfig],
    profiles: dict[str, tuple[ServiceMode, PipelineProfile]],
    arrivals_s: np.ndarray,
    client_cpu_s: float,
    slo_s: float,
    duration_s: float,
) -> tuple[dict[str, dict[str, float]], dict[str, Estimate]]:
    """The estimator on ``arrivals_s`` once per entry of ``profiles`` (key -> service
    mode, profile; visits from the profile's visit matrix; the load generator as a
    co-located client using ``client_cpu_s`` per request): per key its summary and its
    run. ``time_ms`` is the wall time including building the workload."""
    summaries, results = {}, {}
    for key, (mode, profile) in profiles.items():
        start = time.perf_counter()
        workload = Workload.build(topology, profile, arrivals_s, client_cpu_s=client_cpu_s)
        result = estimate(topology, profile, config, workload, service=mode, seed=0)
        elapsed_s = time.perf_counter() - start
        results[key] = result
        summaries[key] = {
            "p50_ms": result.percentile_s(50.0) * 1e3,
            "p99_ms": result.percentile_s(99.0) * 1e3,
            "attainment": result.attainment(slo_s),
            "router_cores": result.router_busy_s / (duration_s or 1.0),
            "router_cpu_cores": result.router_cpu_s / (duration_s or 1.0),
            "time_ms": elapsed_s * 1e3,
        }
    return summaries, results


def estimate_profiles(
    profile: PipelineProfile, calibrated: PipelineProfile
) -> dict[str, tuple[ServiceMode, PipelineProfile]]:
    """The benchmark's four estimates: the profile, then the calibrated profile, each with
    service ``p50`` (the planner's) and ``samples`` (each batch draws from the profiled
    spread, shifted by the calibration's extra)."""
    runs: dict[str, tuple[ServiceMode, PipelineProfile]] = {m: (m, profile) for m in SERVICE_MODES}
    runs[CALIBRATED] = ("p50", calibrated)
    runs[CALIBRATED_SAMPLES] = ("samples", calibrated)
    return runs


def prepare(name: str, settings: ProfilerSettings) -> Example:
    path = PIPELINES[name]
    if (path.parent / "build.py").exists():  # the examples' models are built, not committed
        build = [sys.executable, str(path.parent / "build.py")]
        subprocess.run(build, check=True, capture_output=True)
    loaded = load_pipeline(path)
    session = plan_pipeline(
        loaded,
        DEFAULT_CATALOG,
        settings,
        progress=lambda m: print(f"  {name}: {m}", file=sys.stderr),
    )
    config = session.plan.config  # in topology order, as the problem's stages
    # The samples the profile traced, in the same order: query i sends sample i mod n, as
    # Workload.build gives query i row i mod n of the visit matrix.
    payloads = load_samples(loaded, settings.samples)
    return Example(name, loaded, session, config, payloads)


# --------------------------------------------------------------------------- measurement
def profiled_service_s(stage: StageProfile, cfg: StageConfig, batches: np.ndarray) -> np.ndarray:
    """The profile's P50 model time of each dispatched batch (sizes ``batches``)."""
    table = stage.latency_table_s(cfg.max_batch)
    return np.asarray(table[np.minimum(batches.astype(int), cfg.max_batch)])


def stage_breakdown(
    example: Example, window: dict[str, Any], result: Estimate, cpu_s: dict[str, float]
) -> dict[str, Any]:
    """Per stage: estimated vs measured mean batch; the workers' service time per batch
    against the profile's p50 at the dispatched batch sizes (``slowdown``); and that wall
    time against the stage's worker CPU time (``wall_over_cpu`` > 1: the worker was
    runnable but waited for a core — its CPU time also covers gRPC, so a lower bound)."""
    profile = example.session.profile
    out = {}
    for m, name in enumerate(example.stages):
        cfg = example.config[m]
        batches, service = window["batch"][name], window["service_s"][name]
        expected = profiled_service_s(profile.stage(name, cfg.hardware), cfg, batches)
        cpu = sum(v for k, v in cpu_s.items() if k.partition("#")[0] == name)
        nonempty = bool(service.size and expected.size)
        gaps, extra, counts = (
            idle_groups(window["idle_s"][name], service - expected) if nonempty else ((), (), ())
        )
        out[name] = {
            "items": int(batches.sum()),
            "est_items": result.stages[m].visits,
            "batches": int(batches.size),
            "mean_batch": float(batches.mean()) if batches.size else math.nan,
            "est_mean_batch": result.stages[m].mean_batch,
            "est_utilisation": result.stages[m].utilisation,
            "service_mean_ms": float(service.mean()) * 1e3 if service.size else math.nan,
            "service_cpu_mean_ms": float(window["cpu_s"][name].mean()) * 1e3
            if service.size
            else math.nan,
            "profile_mean_ms": float(expected.mean()) * 1e3 if expected.size else math.nan,
            "slowdown": float(service.mean() / expected.mean()) if nonempty else math.nan,
            # The wall time beyond the profile by how long the worker sat idle before.
            "idle_groups": {
                "idle_ms": [g * 1e3 for g in gaps],
                "extra_ms": [e * 1e3 for e in extra],
                "batches": list(counts),
            },
            "worker_cpu_s": cpu,
            "wall_over_cpu": float(service.sum()) / cpu if cpu > 0 else math.nan,
        }
    return out


def idle_probe(
    example: Example, probe: dict[str, list[float]], window: dict[str, Any]
) -> dict[str, Any]:
    """What sequential requests on the idle pipeline show: client and router latency, a
    bare gRPC round trip, each stage's in-situ batch-1 service against its profile, and
    the per-hop time in situ: (mean router latency - in-situ mean service along each
    query's critical path, averaged) / mean stages on it, paths from the visit matrix."""
    profile, topology = example.session.profile, example.session.problem.topology
    router = window["latency_s"]
    service = {}
    for m, name in enumerate(example.stages):
        values = window["service_s"][name]
        p50 = profile.stage(name, example.config[m].hardware).latency_s(1, "p50")
        service[name] = {
            "insitu_p50_ms": percentile(values, 50.0) * 1e3,
            "insitu_mean_ms": float(values.mean()) * 1e3,
            "profile_p50_ms": p50 * 1e3,
        }
    n = len(probe["infer_s"])
    workload = Workload.build(topology, profile, np.arange(n, dtype=np.float64))
    insitu_s = [service[s]["insitu_mean_ms"] / 1e3 for s in example.stages]
    profiled_s = [service[s]["profile_p50_ms"] / 1e3 + profile.hop_s for s in example.stages]
    path_service = no_queue_latencies(topology, workload, insitu_s)
    path_hops = no_queue_latencies(topology, workload, [1.0] * len(topology))
    hop_s = (float(router.mean()) - float(path_service.mean())) / float(path_hops.mean())
    client = np.asarray(probe["infer_s"])
    return {
        "requests": n,
        "grpc_live_p50_ms": float(np.median(probe["live_s"])) * 1e3,
        "client_p50_ms": percentile(client, 50.0) * 1e3,
        "client_p99_ms": percentile(client, 99.0) * 1e3,
        "router_p50_ms": percentile(router, 50.0) * 1e3,
        "router_p99_ms": percentile(router, 99.0) * 1e3,
        "outside_router_p50_ms": (percentile(client, 50.0) - percentile(router, 50.0)) * 1e3,
        "est_no_queue_p50_ms": percentile(no_queue_latencies(topology, workload, profiled_s), 50.0)
        * 1e3,
        "hop_profiled_ms": profile.hop_s * 1e3,
        "hop_insitu_ms": hop_s * 1e3,
        "mean_stages_on_path": float(path_hops.mean()),
        "stages": service,
    }


def run_cell(
    example: Example,
    served: Served,
    gen: ChildProcess,
    rate_rps: float,
    cv2: float,
    duration_s: float,
    seed: int,
    client_cpu_s: float,
    calibrated: PipelineProfile,
) -> dict[str, Any]:
    arrivals = gamma_arrivals(rate_rps, duration_s, cv2=cv2, seed=seed)
    estimates, results = estimate_cell(
        example.topology,
        example.config,
        estimate_profiles(example.session.profile, calibrated),
        arrivals,
        client_cpu_s,
        example.slo_s,
        duration_s,
    )

    procs = served.processes(gen.pid)
    cpu0, machine0, load0 = _cpu_s(procs), psutil.cpu_times(), os.getloadavg()
    t0, wall0 = time.monotonic(), time.perf_counter()
    with CpuSampler(procs) as sampler:
        replay = gen.call(("replay", arrivals), duration_s + DRAIN_S + 60.0)
    wall_s = time.perf_counter() - wall0
    cpu1, machine1, load1 = _cpu_s(procs), psutil.cpu_times(), os.getloadavg()
    window = served.router_window(t0)
    cpu_s = {k: cpu1[k] - cpu0[k] for k in procs}
    machine_busy = _machine_busy(machine0, machine1)
    normal_busy = _machine_busy(machine0, machine1, niced=False)
    ncpu = os.cpu_count() or 1

    scheduled = replay["start"] + arrivals
    latency = replay["done"] - scheduled
    full = np.where(np.isfinite(latency), latency, math.inf)  # a failed request is a miss
    lag = (replay["sent"] - scheduled)[np.isfinite(replay["sent"])]
    from_send = (replay["done"] - replay["sent"])[np.isfinite(latency)]
    router = window["latency_s"]
    measured_p99_ms = percentile(full, 99.0) * 1e3

    stages = stage_breakdown(example, window, results["p50"], cpu_s)
    return {
        "rate_rps": rate_rps,
        "cv2": cv2,
        "seed": seed,
        "duration_s": duration_s,
        "queries": int(arrivals.size),
        "answered": int(np.isfinite(latency).sum()),
        "errors": replay["errors"],
        "measured": {
            "p50_ms": percentile(full, 50.0) * 1e3,
            "p99_ms": measured_p99_ms,
            "attainment": float(np.count_nonzero(full <= example.slo_s)) / full.size,
            "p99_from_send_ms": percentile(from_send, 99.0) * 1e3,
            "router_p50_ms": percentile(router, 50.0) * 1e3,
            "router_p99_ms": percentile(router, 99.0) * 1e3,
            "router_count": int(router.size),
            "send_lag_p50_ms": percentile(lag, 50.0) * 1e3,
            "send_lag_p99_ms": percentile(lag, 99.0) * 1e3,
            # The hops at this cell's load, as the calibration measures them at its own.
            "hop_quantiles_ms": hop_quantiles_ms(window),
        },
        "estimated": estimates,
        "error": {
            m: (e["p99_ms"] - measured_p99_ms) / measured_p99_ms for m, e in estimates.items()
        },
        "stages": stages,
        # replay["start"] is the client's perf_counter, the same clock as time.monotonic.
        "per_second": per_second(scheduled, latency, example.slo_s, sampler, replay["start"]),
        "router_gc": GC_PAUSES.summary(wall0),
        "cpu_util": {k: v / wall_s for k, v in cpu_s.items()},
        "machine_busy": machine_busy,
        # Cores busy with anything but this pipeline and its client (other people's jobs).
        "others_cores": machine_busy * ncpu - sum(cpu_s.values()) / wall_s,
        "others_normal_cores": normal_busy * ncpu - sum(cpu_s.values()) / wall_s,
        "loadavg_before": load0,
        "loadavg_after": load1,
    }


def hop_quantiles_ms(window: dict[str, Any]) -> list[float]:
    """Every batch's hop in a router window (its round trip less the worker's wall time,
    :func:`~sloline.planner.calibration.hops`), as the 1st to 99th percentile and the
    maximum: how the in-situ hop moves with load and burstiness, which one calibration
    at the planned load cannot show (docs/planner.md, "Estimator vs reality")."""
    every = np.concatenate(
        [np.empty(0)]
        + [hops(window["service_s"].get(s, ()), rt) for s, rt in window["roundtrip_s"].items()]
    )
    if not every.size:
        return []
    return [percentile(every, q) * 1e3 for q in [*range(1, 100), 100]]


def client_cpu_per_request(
    gen: ChildProcess, rate_rps: float, cv2: float, seed: int
) -> dict[str, float]:
    """The load generator's CPU per request at a cell's rate and CV², on a trace of its own
    (not the cell's): CLIENT_PROBE_S of requests, less the same pacing with nothing sent.
    The estimator puts that difference in front of each send and after each answer; the
    pacing itself (sleeping, then polling the loop until the send time) delays no request,
    so it stays out, reported as ``pacing_cores``."""
    arrivals = gamma_arrivals(rate_rps, CLIENT_PROBE_S, cv2=cv2, seed=seed)
    client = psutil.Process(gen.pid)
    used = {}
    for kind in ("pace", "replay"):
        cpu0 = sum(client.cpu_times()[:2])
        gen.call((kind, arrivals), CLIENT_PROBE_S + DRAIN_S + 60.0)
        used[kind] = sum(client.cpu_times()[:2]) - cpu0
    return {
        "cpu_s": max(0.0, used["replay"] - used["pace"]) / arrivals.size,
        "with_pacing_cpu_s": used["replay"] / arrivals.size,
        "pacing_cores": used["pace"] / CLIENT_PROBE_S,
    }


def calibrate(
    example: Example, served: Served, gen: ChildProcess, rate_rps: float
) -> tuple[PipelineProfile, dict[str, Any]]:
    """What the profile misses in situ, measured once at the planned load on a trace of
    its own (CV² 1, a seed no cell uses): the product's calibration
    (:class:`sloline.planner.calibration.Calibration`, what ``sloline calibrate`` writes:
    per stage the extra model time per batch, the in-situ hops and the request path
    outside the router), measured with this benchmark's client.

    Returns the profile with the calibration applied, and what was measured."""
    arrivals = calibration_arrivals(rate_rps)
    procs = served.processes(gen.pid)
    cpu0 = _cpu_s(procs)
    t0 = time.monotonic()
    replay = gen.call(("replay", arrivals), CALIBRATION_S + DRAIN_S + 60.0)
    t1 = time.monotonic()
    cpu1 = _cpu_s(procs)
    client = (replay["done"] - replay["sent"])[np.isfinite(replay["done"])]
    profile = example.session.profile

    async def measure() -> Calibration:  # on the router's loop, as it records
        return served.pipeline.calibration(profile, t0, t1, client_latency_s=client)

    calibration = served.call(measure()).with_router_cpu_on(
        cpu1["router"] - cpu0["router"], example.topology, profile, example.config, arrivals
    )
    window = served.router_window(t0)
    calibrated = calibration.apply(profile)
    assert profile.overhead is not None
    request_s = np.asarray(calibration.request_s)
    info = {
        "rate_rps": rate_rps,
        "duration_s": CALIBRATION_S,
        "stages": {
            n: {
                "batches": s.batches,
                "extra_ms": s.extra_s * 1e3,
                "wall_extra_ms": (s.wall_mean_s - s.profile_mean_s) * 1e3,
                "ratio": s.service_mean_s / s.profile_mean_s if s.batches else math.nan,
            }
            for n, s in calibration.stages.items()
        },
        "hop_p50_ms": percentile(np.asarray(calibration.hop_s), 50.0) * 1e3,
        "hop_p99_ms": percentile(np.asarray(calibration.hop_s), 99.0) * 1e3,
        "probe_hop_p50_ms": profile.overhead.hop_median_s * 1e3,
        "probe_hop_p99_ms": percentile(profile.overhead.hop_table_s(), 99.0) * 1e3,
        "request_p50_ms": percentile(request_s, 50.0) * 1e3,
        "request_p99_ms": percentile(request_s, 99.0) * 1e3,
        "probe_request_p50_ms": profile.overhead.request_median_s * 1e3,
        "probe_request_p99_ms": percentile(profile.overhead.request_table_s(), 99.0) * 1e3,
        "cpu_util": {k: (cpu1[k] - cpu0[k]) / (t1 - t0) for k in procs},
        # What it was computed from, so that other calibrations can be tried on this run.
        "calibration": calibration.to_dict(),
        "batches": {
            key: {n: np.round(a, 7).tolist() for n, a in window[key].items()}
            for key in ("batch", "service_s", "cpu_s", "idle_s", "roundtrip_s")
        },
    }
    return calibrated, info


def calibration_arrivals(rate_rps: float) -> np.ndarray:
    """The calibration's trace: CV² 1 at the planned rate, a seed no cell uses."""
    return gamma_arrivals(rate_rps, CALIBRATION_S, cv2=1.0, seed=0)


class Budget:
    """An optional bound on the whole run's wall time (``--budget-s``): waiting for quiet
    and repeating disturbed cells only spend the slack, i.e. what is left before the
    deadline after the cells and examples still to come at their nominal cost."""

    def __init__(self, budget_s: float | None, cell_s: float, cells: int, examples: int) -> None:
        self.deadline = time.monotonic() + budget_s if budget_s is not None else math.inf
        self.cell_s = cell_s  # one run of a cell: trace, drain, estimates
        self.cells_left = cells  # including the one running
        self.examples_left = examples  # not yet profiled, started and probed

    def slack_s(self) -> float:
        ahead = self.cells_left * self.cell_s + self.examples_left * EXAMPLE_SETUP_S
        return self.deadline - time.monotonic() - ahead


def measure_cell(
    example: Example,
    served: Served,
    gen: ChildProcess,
    cell_key: tuple[float, float, int],
    duration_s: float,
    calibrated: PipelineProfile,
    *,
    label: str,
    attempts: int,
    quiet: Callable[[], float],
    budget: Budget,
    count_niced: bool,
) -> dict[str, Any]:
    """One run of a cell (rate, CV², seed): again while other processes or the host
    disturb it, up to ``attempts`` times and while the budget has slack. The least
    disturbed attempt stands; every attempt is summarised in its ``attempts``."""
    rate, cv2, seed = cell_key
    runs = []
    for attempt in range(attempts):
        quiet_s = quiet()
        client_cpu = client_cpu_per_request(gen, rate, cv2, seed=CLIENT_SEEDS + seed)
        print(
            f"  {example.name}: {rate:g} rps, CV² {cv2:g}, {duration_s:g} s "
            f"({label}attempt {attempt + 1}, waited {quiet_s:.0f} s for quiet) ...",
            file=sys.stderr,
        )
        cell = run_cell(
            example, served, gen, rate, cv2, duration_s, seed, client_cpu["cpu_s"], calibrated
        )
        cell["client_probe"] = client_cpu
        cell["waited_for_quiet_s"] = quiet_s
        runs.append(cell)
        print("    " + row(example.name, cell), file=sys.stderr)
        # Again only if there is time for it and every cell still to come.
        if not disturbed(cell, niced=count_niced) or budget.slack_s() < 0.0:
            break
    key = others_key(count_niced)
    kept = min(runs, key=lambda c: (disturbed(c, niced=count_niced), c[key]))
    kept["disturbed"] = disturbed(kept, niced=count_niced)
    kept["attempts"] = [
        {
            "others_cores": c["others_cores"],
            "others_normal_cores": c["others_normal_cores"],
            "others_normal_max_1s": worst_second(c, "others_normal_cores"),
            "others_max_1s": worst_second(c, "others_cores"),
            "steal_max_1s": worst_second(c, "steal_cores"),
            "measured_p99_ms": c["measured"]["p99_ms"],
        }
        for c in runs
    ]
    return kept


def median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run of a cell that stands for it: with ``--repeats N``, the run whose measured
    P99 is the median (N odd) or the upper of the two middle ones (N even), so its every
    field comes from one real run; the others are summarised in its ``repeats``."""
    ordered = sorted(runs, key=lambda c: c["measured"]["p99_ms"])
    kept = ordered[len(ordered) // 2]
    kept["repeats"] = [
        {
            "measured_p99_ms": c["measured"]["p99_ms"],
            "attainment": c["measured"]["attainment"],
            "disturbed": c["disturbed"],
            "error": c["error"],
            "attempts": c["attempts"],
        }
        for c in runs
    ]
    return kept


def run_example(
    example: Example,
    cells: Sequence[tuple[float, float]],
    duration_s: float,
    probe_count: int,
    planned_rps: float,
    *,
    attempts: int = MAX_ATTEMPTS,
    repeats: int = 1,
    quiet_timeout_s: float = QUIET_TIMEOUT_S,
    count_niced: bool = True,
    budget: Budget | None = None,
    first_seed: int = 1,
) -> dict[str, Any]:
    datatypes = {t.name: str(t.datatype) for t in example.loaded.pipeline.spec.inputs}
    out: dict[str, Any] = {"cells": []}
    with Served(example.loaded, example.served_configs) as served:
        gen = load_generator(
            served.pipeline.grpc_url, example.loaded.name, example.payloads, datatypes
        )
        try:
            # Warm-up, not measured: connections, code paths, larger batches (bursty).
            top = max(rate for rate, _ in cells)
            gen.call(("replay", gamma_arrivals(top, 5.0, cv2=4.0, seed=999)), 120.0)
            budget = budget or Budget(None, 0.0, 0, 0)

            def quiet() -> float:
                timeout_s = min(quiet_timeout_s, max(0.0, budget.slack_s()))
                return wait_quiet(served.processes(gen.pid), timeout_s, niced=count_niced)

            quiet()
            t0 = time.monotonic()
            probe = gen.call(("probe", probe_count), 300.0)
            out["idle_probe"] = idle_probe(example, probe, served.router_window(t0))
            quiet()
            calibrated, out["calibration"] = calibrate(example, served, gen, planned_rps)
            budget.examples_left = max(0, budget.examples_left - 1)
            for k, (rate, cv2) in enumerate(cells):
                runs = []
                for repeat in range(repeats):
                    runs.append(
                        measure_cell(
                            example,
                            served,
                            gen,
                            (rate, cv2, first_seed + k),
                            duration_s,
                            calibrated,
                            label=f"run {repeat + 1} of {repeats}, " if repeats > 1 else "",
                            attempts=attempts,
                            quiet=quiet,
                            budget=budget,
                            count_niced=count_niced,
                        )
                    )
                    budget.cells_left = max(0, budget.cells_left - 1)
                out["cells"].append(median_run(runs))
        finally:
            gen.close()
    return out


# --------------------------------------------------------------------------- report
def _err(error: float) -> str:
    return f"{error * 100:+.0f}%" + ("" if abs(error) <= TARGET_ERROR else " ✗")


HEADER = (
    "| example | rate rps | CV² | queries | measured P99 ms | est. P99 ms (p50) | error | "
    "est. P99 ms (samples) | error | est. P99 ms (calibrated) | error | "
    "est. P99 ms (calibrated, samples) | error | "
    "router-side P99 ms | measured attainment | "
    "est. attainment (p50 / calibrated / calibrated, samples) | "
    "est. time ms (p50 / samples) | load avg |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def row(name: str, cell: dict[str, Any]) -> str:
    m, e = cell["measured"], cell["estimated"]
    load = (cell["loadavg_before"][0] + cell["loadavg_after"][0]) / 2
    return (
        f"| {name} | {cell['rate_rps']:g} | {cell['cv2']:g} | {cell['queries']} | "
        f"{m['p99_ms']:.1f} | {e['p50']['p99_ms']:.1f} | {_err(cell['error']['p50'])} | "
        f"{e['samples']['p99_ms']:.1f} | {_err(cell['error']['samples'])} | "
        f"{e[CALIBRATED]['p99_ms']:.1f} | {_err(cell['error'][CALIBRATED])} | "
        f"{e[CALIBRATED_SAMPLES]['p99_ms']:.1f} | {_err(cell['error'][CALIBRATED_SAMPLES])} | "
        f"{m['router_p99_ms']:.1f} | {m['attainment'] * 100:.2f}% | "
        f"{e['p50']['attainment'] * 100:.2f}% / {e[CALIBRATED]['attainment'] * 100:.2f}% / "
        f"{e[CALIBRATED_SAMPLES]['attainment'] * 100:.2f}% | "
        f"{e['p50']['time_ms']:.1f} / {e['samples']['time_ms']:.1f} | {load:.1f} |"
    )


REPEATS_HEADER = (
    "| example | rate rps | CV² | measured P99 ms, run by run | spread (max / min - 1) | "
    "est. P99 ms (calibrated) | error, run by run | measured attainment, lowest run |\n"
    "|---|---:|---:|---|---:|---:|---|---:|"
)


def repeats_row(name: str, cell: dict[str, Any]) -> str:
    runs = cell["repeats"]
    p99 = [r["measured_p99_ms"] for r in runs]
    return (
        f"| {name} | {cell['rate_rps']:g} | {cell['cv2']:g} | "
        f"{' / '.join(f'{v:.1f}' for v in p99)} | {(max(p99) / min(p99) - 1) * 100:.0f}% | "
        f"{cell['estimated'][CALIBRATED]['p99_ms']:.1f} | "
        f"{' / '.join(_err(r['error'][CALIBRATED]) for r in runs)} | "
        f"{min(r['attainment'] for r in runs) * 100:.2f}% |"
    )


BREAKDOWN_HEADER = (
    "| example | rate rps | CV² | client - router P50 ms | send lag P99 ms | "
    "bottleneck: est. util, mean batch est/meas, service / profile, wall / CPU | "
    "CPU cores: router / client / workers / others (niced too), stolen in the worst second | "
    "router CPU cores est.: profile / calibrated | "
    "client CPU ms per request simulated (with pacing), pacing cores | "
    "router full GCs (max ms) |\n|---|---:|---:|---:|---:|---|---|---:|---|---:|"
)


def _router_cpu(cell: dict[str, Any], mode: str) -> str:
    """The estimated router CPU in cores (files from before it was recorded: its busy time)."""
    estimated = cell["estimated"][mode]
    return f"{estimated.get('router_cpu_cores', estimated['router_cores']):.2f}"


def breakdown_row(name: str, cell: dict[str, Any]) -> str:
    bottleneck = max(cell["stages"], key=lambda n: cell["stages"][n]["est_utilisation"])
    m, s, cpu = cell["measured"], cell["stages"][bottleneck], cell["cpu_util"]
    workers = sum(v for k, v in cpu.items() if k not in ("router", "client"))
    gc_, client = cell["router_gc"], cell["client_probe"]
    return (
        f"| {name} | {cell['rate_rps']:g} | {cell['cv2']:g} | "
        f"{m['p50_ms'] - m['router_p50_ms']:.2f} | {m['send_lag_p99_ms']:.2f} | "
        f"{bottleneck}: {s['est_utilisation']:.2f}, {s['est_mean_batch']:.2f}/"
        f"{s['mean_batch']:.2f}, x{s['slowdown']:.2f}, x{s['wall_over_cpu']:.2f} | "
        f"{cpu['router']:.2f} / {cpu['client']:.2f} / {workers:.2f} / "
        f"{cell['others_normal_cores']:.2f} ({cell['others_cores']:.2f}), "
        f"{worst_second(cell, 'steal_cores'):.2f} | "
        f"{_router_cpu(cell, 'p50')} / {_router_cpu(cell, 'calibrated')} | "
        f"{client['cpu_s'] * 1e3:.2f} ({client['with_pacing_cpu_s'] * 1e3:.2f}), "
        f"{client['pacing_cores']:.2f} | "
        f"{gc_['full']} ({gc_['full_max_ms']:.0f}) |"
    )


PROBE_HEADER = (
    "| example | client P50 / P99 ms | router P50 / P99 ms | est. no-queue P50 ms | "
    "gRPC ServerLive P50 ms | client - router P50 ms | hop profiled / in situ ms | "
    "service in situ / profiled, batch 1, P50 ms |\n|---|---|---|---:|---:|---:|---|---|"
)


def probe_row(name: str, probe: dict[str, Any]) -> str:
    stages = ", ".join(
        f"{n} {v['insitu_p50_ms']:.2f}/{v['profile_p50_ms']:.2f}"
        for n, v in probe["stages"].items()
    )
    return (
        f"| {name} | {probe['client_p50_ms']:.2f} / {probe['client_p99_ms']:.2f} | "
        f"{probe['router_p50_ms']:.2f} / {probe['router_p99_ms']:.2f} | "
        f"{probe['est_no_queue_p50_ms']:.2f} | {probe['grpc_live_p50_ms']:.2f} | "
        f"{probe['outside_router_p50_ms']:.2f} | {probe['hop_profiled_ms']:.2f} / "
        f"{probe['hop_insitu_ms']:.2f} | {stages} |"
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def client_diagnostic(path: Path) -> None:
    """Re-estimate every cell of a results file with the client CPU per request that the
    cell itself used (less the pacing its client probe measured), instead of the probe's
    (a diagnostic: it uses the cell's own measurement). Prints a table; writes nothing."""
    report = json.loads(path.read_text())
    print(
        "| example | rate rps | CV² | measured P99 ms | client CPU ms: probe / cell | "
        "est. P99 ms (p50): probe's client | error | cell's client | error |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for name, result in report["examples"].items():
        topology, config, profile = _stored(name, result)
        for cell in result["cells"]:
            arrivals = _cell_arrivals(cell)
            measured_ms = cell["measured"]["p99_ms"]
            probe = cell["client_probe"]
            used = cell["cpu_util"]["client"] - probe["pacing_cores"]
            cell_cpu_s = max(0.0, used * cell["duration_s"] / cell["queries"])
            p99_ms = []
            for cpu_s in (probe["cpu_s"], cell_cpu_s):
                workload = Workload.build(topology, profile, arrivals, client_cpu_s=cpu_s)
                run = estimate(topology, profile, config, workload, service="p50", seed=0)
                p99_ms.append(run.percentile_s(99.0) * 1e3)
            warm, own = ((v - measured_ms) / measured_ms for v in p99_ms)
            print(
                f"| {name} | {cell['rate_rps']:g} | {cell['cv2']:g} | {measured_ms:.1f} | "
                f"{probe['cpu_s'] * 1e3:.2f} / {cell_cpu_s * 1e3:.2f} | {p99_ms[0]:.1f} | "
                f"{_err(warm)} | {p99_ms[1]:.1f} | {_err(own)} |"
            )


def _stored(
    name: str, result: dict[str, Any]
) -> tuple[Topology, list[StageConfig], PipelineProfile]:
    """An example's topology, configuration and profile as a results file stores them."""
    loaded = load_pipeline(PIPELINES[name])
    profile = PipelineProfile.from_dict(result["profile"])
    trace = planning_trace(loaded)
    topology = PlanningProblem.from_graph(loaded.graph, profile, DEFAULT_CATALOG, trace).topology
    return topology, [StageConfig(*result["config"][stage]) for stage in topology.stages], profile


def _cell_arrivals(cell: dict[str, Any]) -> np.ndarray:
    return gamma_arrivals(cell["rate_rps"], cell["duration_s"], cv2=cell["cv2"], seed=cell["seed"])


def _estimate_stored(
    topology: Topology,
    config: Sequence[StageConfig],
    profiles: dict[str, tuple[ServiceMode, PipelineProfile]],
    cell: dict[str, Any],
    slo_s: float,
) -> dict[str, dict[str, float]]:
    """`estimate_cell` on a stored cell's trace, with the client CPU its probe measured."""
    arrivals, client_cpu_s = _cell_arrivals(cell), cell["client_probe"]["cpu_s"]
    return estimate_cell(
        topology, config, profiles, arrivals, client_cpu_s, slo_s, cell["duration_s"]
    )[0]


def hop_diagnostic(path: Path) -> None:
    """Per cell: the calibrated estimate again with the hops that cell measured in place
    of the calibration's (measured at the planned load only), then also with the mean
    in-situ service time per batch that cell measured for every stage. If the first
    closes the gap to the measured P99, a hop model that follows load is what the
    estimator lacks; if only the second does, an in-situ service time that follows load;
    if neither, the error is elsewhere (e.g. the spread of the service time, which the
    ``p50`` mode does not simulate). Needs a results file with ``hop_quantiles_ms`` per
    cell."""
    report = json.loads(path.read_text())
    print(
        "| example | rate rps | CV² | measured P99 ms | hop P50 / P99 ms (cell; calibration) "
        "| est. P99 ms (calibrated) | error | est. P99 ms (cell's own hops) | error "
        "| est. P99 ms (cell's own hops and service) | error |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for name, result in report["examples"].items():
        topology, config, profile = _stored(name, result)
        stored = result["calibration"]["calibration"]
        calibration = Calibration.from_dict(stored)
        calibrated = calibration.apply(profile)
        slo_s = result["slo_ms"] / 1e3
        for cell in result["cells"]:
            hops_ms = cell["measured"].get("hop_quantiles_ms")
            if not hops_ms:
                continue
            own = dataclasses.replace(calibration, hop_s=tuple(h / 1e3 for h in hops_ms))
            profiles: dict[str, tuple[ServiceMode, PipelineProfile]] = {
                "calibrated": ("p50", calibrated),
                "own": ("p50", own.apply(profile)),
                "own_service": ("p50", _with_cell_service(own, stored, cell).apply(profile)),
            }
            estimated = _estimate_stored(topology, config, profiles, cell, slo_s)
            measured = cell["measured"]["p99_ms"]
            cal = calibration.hop_s
            print(
                f"| {name} | {cell['rate_rps']:g} | {cell['cv2']:g} | {measured:.1f} "
                f"| {hops_ms[49]:.2f} / {hops_ms[98]:.2f}; "
                f"{np.percentile(cal, 50) * 1e3:.2f} / {np.percentile(cal, 99) * 1e3:.2f} "
                + "".join(
                    f"| {estimated[k]['p99_ms']:.1f} "
                    f"| {(estimated[k]['p99_ms'] - measured) / measured:+.0%} "
                    for k in profiles
                )
                + "|"
            )


def _with_cell_service(
    calibration: Calibration, stored: dict[str, Any], cell: dict[str, Any]
) -> Calibration:
    """``calibration`` with each stage's in-situ service (CPU and wall per batch, mean
    batch) as ``cell`` measured it instead of at the planned load."""
    doc = copy.deepcopy(stored)
    for stage, seen in cell["stages"].items():
        if stage in doc["stages"] and seen.get("batches"):
            doc["stages"][stage].update(
                serviceMeanSeconds=seen["service_cpu_mean_ms"] / 1e3,
                wallMeanSeconds=seen["service_mean_ms"] / 1e3,
                profileMeanSeconds=seen["profile_mean_ms"] / 1e3,
                meanBatch=seen["mean_batch"],
                batches=seen["batches"],
            )
    return dataclasses.replace(without_idle(Calibration.from_dict(doc)), hop_s=calibration.hop_s)


def without_idle(calibration: Calibration) -> Calibration:
    """``calibration`` with each stage's mean extra time and no in-situ idle penalty."""
    return dataclasses.replace(
        calibration,
        stages={
            n: dataclasses.replace(s, idle_gaps_s=(), idle_extra_s=(), idle_batches=())
            for n, s in calibration.stages.items()
        },
    )


def calibration_parts(path: Path) -> None:
    """Per cell: the estimate (``p50``) from the profile, calibrated, calibrated with each
    stage's mean extra time instead of its in-situ idle penalty, and with one part of the
    calibration at a time (extra model time with its idle penalty, in-situ hop, request
    path, router CPU), so that an error can be traced to the part that moves it."""
    report = json.loads(path.read_text())
    parts = ("extra", "hop", "request", "router")
    columns = ("profile", "calibrated", "mean extra", *(f"{part} only" for part in parts))
    print("| example | rate rps | CV² | measured P99 ms | " + " | ".join(columns) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(columns))
    for name, result in report["examples"].items():
        topology, config, profile = _stored(name, result)
        full = Calibration.from_dict(result["calibration"]["calibration"])
        mean = without_idle(full)
        bare = dataclasses.replace(
            mean,
            stages={
                n: dataclasses.replace(s, service_mean_s=s.profile_mean_s)
                for n, s in mean.stages.items()
            },
            hop_s=(),
            request_s=(),
            router_scale=1.0,
        )
        alone = {
            "extra": dataclasses.replace(bare, stages=full.stages),
            "hop": dataclasses.replace(bare, hop_s=full.hop_s),
            "request": dataclasses.replace(bare, request_s=full.request_s),
            "router": dataclasses.replace(bare, router_scale=full.router_scale),
        }
        profiles: dict[str, tuple[ServiceMode, PipelineProfile]] = {
            "profile": ("p50", profile),
            "calibrated": ("p50", full.apply(profile)),
            "mean extra": ("p50", mean.apply(profile)),
            **{part: ("p50", alone[part].apply(profile)) for part in parts},
        }
        slo_s = result["slo_ms"] / 1e3
        for cell in result["cells"]:
            estimated = _estimate_stored(topology, config, profiles, cell, slo_s)
            measured_ms = cell["measured"]["p99_ms"]
            print(f"| {name} | {cell['rate_rps']:g} | {cell['cv2']:g} | {measured_ms:.1f} | "
                  + " | ".join(f"{estimated[k]['p99_ms']:.1f} "
                               f"({_err((estimated[k]['p99_ms'] - measured_ms) / measured_ms)})"
                               for k in profiles) + " |")  # fmt: skip


def re_estimate(path: Path) -> None:
    """Estimate every cell of a results file again with this estimator, from what the
    file stores (profile, configuration, calibration, trace, the client's CPU per
    request), leaving every measurement as it is; rewrite the file and print the tables.
    A cell's repeats are compared with the estimate of the run that stands for it (each
    run's own client probe is not stored); the per-stage breakdown keeps the estimates it
    was written with."""
    report = json.loads(path.read_text())
    rows, repeats, breakdown = [], [], []
    for name, result in report["examples"].items():
        topology, config, profile = _stored(name, result)
        info = result["calibration"]
        calibration = Calibration.from_dict(info["calibration"])
        if calibration.router_cpu_s is None and "cpu_util" in info:
            # A run from before the calibration scaled the router: scale it as it would have.
            used_s = info["cpu_util"]["router"] * calibration.duration_s
            arrivals = calibration_arrivals(info["rate_rps"])
            calibration = calibration.with_router_cpu_on(
                used_s, topology, profile, config, arrivals
            )
            info["calibration"] = calibration.to_dict()
        profiles = estimate_profiles(profile, calibration.apply(profile))
        slo_s = result["slo_ms"] / 1e3
        for cell in result["cells"]:
            cell["estimated"] = _estimate_stored(topology, config, profiles, cell, slo_s)
            for run in [cell, *cell.get("repeats", ())]:
                measured_ms = run["measured"]["p99_ms"] if run is cell else run["measured_p99_ms"]
                run["error"] = {
                    m: (e["p99_ms"] - measured_ms) / measured_ms
                    for m, e in cell["estimated"].items()
                }
            rows.append(row(name, cell))
            breakdown.append(breakdown_row(name, cell))
            if "repeats" in cell:
                repeats.append(repeats_row(name, cell))
    report["re_estimated"] = time.strftime("%Y-%m-%d %H:%M:%S")
    path.write_text(json.dumps(report, indent=1, default=_json_default) + "\n")
    print(HEADER + "\n" + "\n".join(rows))
    if repeats:
        print("\n" + REPEATS_HEADER + "\n" + "\n".join(repeats))
    print("\n" + BREAKDOWN_HEADER + "\n" + "\n".join(breakdown))


def _autogroup() -> str:
    """``kernel.sched_autogroup_enabled`` (with autogroups, nice only ranks a session's own
    processes, so niced jobs of other sessions compete as equals)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return "unknown"


def main() -> None:
    tune_malloc()  # as `sloline run` does
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one 8 s cell per example")
    parser.add_argument("--duration-s", type=float, default=None, help="trace length per cell")
    parser.add_argument(
        "--examples",
        nargs="+",
        default=None,
        choices=list(RATE_FACTORS),
        help="default: all; --quick: the two examples (the sleepy control is full-run only)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=ROOT / ".sloline-cache" / "profiles",
        help="profile cache (git-ignored; profiled once, then reused)",
    )
    parser.add_argument(
        "--reprofile",
        action="store_true",
        help="measure the profiles again (e.g. the machine's load changed)",
    )
    parser.add_argument(
        "--ignore-niced",
        action="store_true",
        help="niced processes (nice > 0) neither delay a cell nor make it disturbed",
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=MAX_ATTEMPTS,
        help="runs of a cell at most, while other processes disturb it",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure every cell this many times on the same trace; the run with the "
        "median P99 stands for the cell, all are reported (run-to-run spread)",
    )
    parser.add_argument(
        "--quiet-timeout-s",
        type=float,
        default=QUIET_TIMEOUT_S,
        help="before a cell, wait at most this long for other processes to go quiet",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="bound the run's wall time: waits and repeats only use the slack left "
        "after the remaining cells at their nominal cost",
    )
    parser.add_argument(
        "--client-diagnostic",
        type=Path,
        metavar="RESULTS",
        default=None,
        help="only re-estimate the cells of a results file with the client CPU each "
        "cell measured (no serving)",
    )
    parser.add_argument(
        "--re-estimate",
        type=Path,
        metavar="RESULTS",
        default=None,
        help="only estimate the cells of a results file again with this estimator and "
        "rewrite it (no serving; the measurements stay)",
    )
    parser.add_argument(
        "--hop-diagnostic",
        type=Path,
        metavar="RESULTS",
        default=None,
        help="only estimate each cell of a results file again with the hops, then also "
        "the service times, that cell measured (no serving)",
    )
    parser.add_argument(
        "--calibration-parts",
        type=Path,
        metavar="RESULTS",
        default=None,
        help="only estimate each cell of a results file again with one part of the "
        "calibration at a time (no serving)",
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=1,
        help="the cells' traces use seeds from this one up (default 1; another value "
        "gives a fresh run on traces the estimator was not checked on)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the results here (default: benchmarks/results/estimator_accuracy.json, "
        "or estimator_accuracy.quick.raw.json with --quick)",
    )
    args = parser.parse_args()
    if args.client_diagnostic is not None:
        client_diagnostic(args.client_diagnostic)
        return
    if args.re_estimate is not None:
        re_estimate(args.re_estimate)
        return
    if args.hop_diagnostic is not None:
        hop_diagnostic(args.hop_diagnostic)
        return
    if args.calibration_parts is not None:
        calibration_parts(args.calibration_parts)
        return
    if args.attempts < 1:
        parser.error("--attempts must be at least 1")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    duration_s = args.duration_s or (8.0 if args.quick else 60.0)
    # The serving overhead depends on the machine's state more than the stage profiles
    # do: measured again on every run, whatever the profile cache holds.
    settings = ProfilerSettings(cache_dir=args.cache_dir, force=args.reprofile, force_overhead=True)
    began = time.perf_counter()
    report: dict[str, Any] = {
        "settings": {
            "duration_s": duration_s,
            "quick": args.quick,
            "cv2s": CV2S,
            "rate_factors": RATE_FACTORS,
            "timeout_ms": TIMEOUT_MS,
            "service_modes": SERVICE_MODES,
            "reprofile": args.reprofile,
            "attempts": args.attempts,
            "repeats": args.repeats,
            "ignore_niced": args.ignore_niced,
            "quiet_timeout_s": args.quiet_timeout_s,
            "budget_s": args.budget_s,
            "first_seed": args.first_seed,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "platform": platform.platform(),
            "loadavg_start": os.getloadavg(),
            "sched_autogroup": _autogroup(),
        },
        "examples": {},
    }
    rows, breakdown, probes, plans, repeats = [], [], [], [], []
    examples = args.examples or [n for n in RATE_FACTORS if not (args.quick and n == "sleepy")]
    n_cells = sum(1 if args.quick else len(RATE_FACTORS[n]) * len(CV2S) for n in examples)
    cell_s = duration_s + CELL_OVERHEAD_S
    budget = Budget(args.budget_s, cell_s, n_cells * args.repeats, len(examples))
    for name in examples:
        print(f"{name}: profiling (cached) and planning ...", file=sys.stderr)
        example = prepare(name, settings)
        arrivals = gamma_arrivals(10.0, 10.0)
        profile = example.session.profile
        estimate_cell(  # load the compiled kernels
            example.topology, example.config, {"": ("p50", profile)}, arrivals, 0.0, 1.0, 10.0
        )
        process.freeze_startup_heap()  # as `sloline run` does after planning
        rate = float(
            example.loaded.pipeline.spec.workload.rate_rps or example.session.plan.rate_rps
        )
        factors = (1.0,) if args.quick else RATE_FACTORS[name]
        cv2s = CV2S[:1] if args.quick else CV2S
        cells = [(round(rate * f), cv2) for f in factors for cv2 in cv2s]
        result = run_example(
            example,
            cells,
            duration_s,
            probe_count=50 if args.quick else 200,
            planned_rps=rate,
            attempts=args.attempts,
            repeats=args.repeats,
            quiet_timeout_s=args.quiet_timeout_s,
            count_niced=not args.ignore_niced,
            budget=budget,
            first_seed=args.first_seed,
        )
        plan = example.session.plan
        result.update(
            {
                "slo_ms": plan.slo_s * 1e3,
                "plan": plan.to_table(),
                "config": {
                    n: [c.hardware, c.max_batch, c.replicas]
                    for n, c in zip(example.stages, example.config, strict=True)
                },
                "hop_ms": example.session.profile.hop_s * 1e3,
                "profile": example.session.profile.to_dict(),
            }
        )
        report["examples"][name] = result
        rows += [row(name, c) for c in result["cells"]]
        breakdown += [breakdown_row(name, c) for c in result["cells"]]
        repeats += [repeats_row(name, c) for c in result["cells"]]
        probes.append(probe_row(name, result["idle_probe"]))
        plans.append(plan.to_table())
    report["runtime_s"] = time.perf_counter() - began
    report["machine"]["loadavg_end"] = os.getloadavg()
    tables = [(HEADER, rows), (BREAKDOWN_HEADER, breakdown), (PROBE_HEADER, probes)]
    if args.repeats > 1:
        tables.insert(1, (REPEATS_HEADER, repeats))
    for header, lines in tables:
        print("\n" + header + "\n" + "\n".join(lines))
    print("\n" + "\n\n".join(plans))
    loads = [report["machine"][k] for k in ("loadavg_start", "loadavg_end")]
    print(f"\nruntime {report['runtime_s']:.0f} s; load average {loads[0]} -> {loads[1]}")
    RESULTS.mkdir(exist_ok=True)
    quick = "estimator_accuracy.quick.raw.json"
    out = args.out or RESULTS / (quick if args.quick else "estimator_accuracy.json")
    out.write_text(json.dumps(report, indent=1, default=_json_default) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
