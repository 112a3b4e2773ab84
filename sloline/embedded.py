"""The embedded (default) deployment: routers, front doors and worker processes on one
machine. This is the composition root `sloline run` and the integration tests use:
it decides each stage's hardware class, max batch and replicas (flags and spec overrides
first), starts the router's servers, then the workers, and shuts down in the order that
loses nothing: stop admitting, let in-flight requests finish, stop workers, close ports.

Many routers (`EmbeddedSettings.routers`): router 0 runs in this process (with the tuner,
the re-planner and the status); the others are processes of their own
(`sloline embedded-router`, supervised and restarted by the local backend). All share the
client HTTP and gRPC ports (SO_REUSEPORT: the kernel spreads connections over them);
each has a worker port and a metrics port of its own, and every worker dials them all.
Each router knows the others' metrics ports, where it fetches their Triton statistics to
answer for the whole pipeline (`sloline.serving.triton_stats`).
The other routers send their arrival times to router 0 over a pipe, so its envelope (the
tuner's, the re-planner's and its `/metrics`) counts the pipeline's whole demand.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from sloline.backends.base import ReplicaStatus
from sloline.backends.local import WORKER_NICE, LocalBackend, RouterLaunch, StageLaunch
from sloline.common.envelope import Envelope, StreamingEnvelope
from sloline.model_server.worker import die_with_parent
from sloline.planner.calibration import Calibration, request_path
from sloline.planner.config import StageConfig
from sloline.planner.plan import Plan
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import PipelineProfile
from sloline.serving import process
from sloline.serving.app import RouterApp, envelope_windows_s
from sloline.serving.auth import WORKER_TOKEN_ENV, generate_token
from sloline.serving.metrics import TunerMetrics
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.serving.stats import Ring
from sloline.spec import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    LoadedPipeline,
    PipelineError,
    load_pipeline,
)
from sloline.spec.storage import StorageError, fetch
from sloline.spec.validate import Issue
from sloline.tuner.policy import TunerSettings
from sloline.tuner.replan import Replanner, ReplanSettings
from sloline.tuner.sources import StageTuning, StreamingSource, Tuner, stage_tunings


@dataclass(frozen=True, slots=True)
class StageDeployment:
    """How one stage is served: hardware class, max batch, replicas. Unlike a planned
    :class:`~sloline.planner.config.StageConfig`, replicas may be 0
    (``--replicas STAGE=0`` starts the stage with no workers)."""

    hardware: str
    max_batch: int
    replicas: int


ARRIVALS_KEPT = 1 << 17  # arrival times the re-planner can see: a minute up to ~2000 rps
ARRIVAL_FLUSH_S = 0.05  # how often an extra router sends its arrival times to router 0
ARRIVAL_HOLD_S = 4 * ARRIVAL_FLUSH_S  # how long router 0 holds a time to merge them in order
ARRIVAL_DELAY_S = ARRIVAL_HOLD_S + ARRIVAL_FLUSH_S  # how far behind its envelope counts
_PIPE_WRITE = 4096 // 8  # arrival times per pipe write (PIPE_BUF: atomic among writers)

log = logging.getLogger(__name__)
WARMUP_BATCHES = 20  # serving measured from its start: each stage's first batches warm up


def default_routers() -> int:
    """Router processes of `sloline run` when `--routers` is not given: one per 4 cores
    this process may use, at least 1 (so 1 on a 2-core machine). A router is one event
    loop, busy on a core under load; the workers need the other cores."""
    return max(1, len(os.sched_getaffinity(0)) // 4)


def default_max_replicas() -> int:
    """The tuner's per-stage ceiling when the spec sets no `maxReplicas`: twice the cores
    this process may use (at least 2). More one-thread workers than that only queue for
    the same cores; a stage that waits rather than computes sets `maxReplicas` itself."""
    return max(2, 2 * len(os.sched_getaffinity(0)))


@dataclass(frozen=True, slots=True)
class EmbeddedSettings:
    server: ServerSettings = field(default_factory=ServerSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    catalog: HardwareCatalog = DEFAULT_CATALOG
    replicas: Mapping[str, int] = field(default_factory=dict)  # flag overrides
    max_batch: Mapping[str, int] = field(default_factory=dict)
    hardware: Mapping[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    worker_grace_s: float = 10.0
    worker_nice: int = WORKER_NICE  # workers' CPU priority below the router's
    tuner: bool = True  # run the InferLine tuner when a plan is given
    tuner_interval_s: float = 1.0
    tuner_overrides: Mapping[str, float] = field(default_factory=dict)  # TunerSettings fields
    max_replicas: int = field(default_factory=default_max_replicas)
    # Re-plan hardware and batch sizes on recent traffic (None: off); needs the tuner, a
    # plan and its planning problem, and no flag overrides.
    replan: ReplanSettings | None = None
    routers: int = 1  # router processes sharing the client ports (module docstring)
    # The other routers' logging and tracing flags (`sloline embedded-router`), as the
    # command line gave them to `sloline run`.
    router_flags: tuple[str, ...] = ()


def check_models(loaded: LoadedPipeline) -> None:
    """Fetch the models that come from storage (once: they stay in the model cache);
    fail early, with the fix, when a stage's model file is missing, cannot be fetched or
    fails its checksum, or a path or entrypoint of the spec leads outside the model
    directory."""
    issues = loaded.check_files()
    escaping = {issue.path for issue in issues}
    for i, stage in enumerate(loaded.pipeline.spec.stages):
        if f"spec.stages[{i}].model.uri" in escaping:
            continue
        if stage.model.storage_uri is not None:
            try:
                fetch(stage.model.storage_uri, stage.model.sha256)
            except StorageError as exc:
                issues.append(Issue(f"spec.stages[{i}].model.storageUri", str(exc)))
            continue
        if stage.model.uri and not loaded.resolve(stage.model.uri).exists():
            hint = ""
            if (loaded.base_dir / "build.py").exists():
                hint = f"; build it with: python {loaded.base_dir / 'build.py'}"
            issues.append(
                Issue(
                    f"spec.stages[{i}].model.uri",
                    f"file {loaded.resolve(stage.model.uri)} does not exist{hint}",
                )
            )
    if issues:
        raise PipelineError(issues, f"pipeline {loaded.name!r}")


def stage_configs(
    loaded: LoadedPipeline, settings: EmbeddedSettings, plan: Plan | None = None
) -> dict[str, StageDeployment]:
    """Flags override the spec, which overrides the plan; without any of them: one
    replica, batch 1, the first allowed hardware class."""
    spec = loaded.pipeline.spec
    allowed = spec.hardware or settings.catalog.names()
    issues = [
        Issue("spec.hardware", f"class {name!r} is not in the catalog ({settings.catalog.names()})")
        for name in allowed
        if name not in settings.catalog.names()
    ]
    for flag, values in (
        ("--replicas", settings.replicas),
        ("--max-batch", settings.max_batch),
        ("--hardware", settings.hardware),
    ):
        issues += [
            Issue(flag, f"no stage named {name!r}")
            for name in values
            if name not in loaded.graph.stages
        ]
    configs = {}
    planned = {s.name: s for s in plan.stages} if plan else {}
    for i, stage in enumerate(spec.stages):
        base = planned.get(stage.name)
        hw = (
            settings.hardware.get(stage.name)
            or stage.hardware
            or (base.hardware if base else allowed[0])
        )
        if hw not in settings.catalog.names():
            issues.append(Issue(f"spec.stages[{i}].hardware", f"unknown hardware class {hw!r}"))
        configs[stage.name] = StageDeployment(
            hardware=hw,
            max_batch=settings.max_batch.get(stage.name)
            or stage.max_batch
            or (base.max_batch if base else 1),
            replicas=settings.replicas.get(
                stage.name, stage.replicas or (base.replicas if base else 1)
            ),
        )
    if issues:
        raise PipelineError(issues, f"pipeline {loaded.name!r}")
    return configs


class EmbeddedPipeline:
    """`async with EmbeddedPipeline(loaded, settings) as p:` serves until the block ends."""

    def __init__(
        self,
        loaded: LoadedPipeline,
        settings: EmbeddedSettings | None = None,
        *,
        configs: Mapping[str, StageDeployment] | None = None,
        plan: Plan | None = None,
        problem: PlanningProblem | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.loaded = loaded
        settings = settings or EmbeddedSettings()
        if settings.server.worker_token is None and not settings.server.insecure_workers:
            # Only the workers this process starts may dial in: a fresh token per run,
            # handed to them in their environment.
            server = replace(settings.server, worker_token=generate_token())
            settings = replace(settings, server=server)
        if settings.routers < 1:
            raise ValueError(f"routers must be at least 1, got {settings.routers}")
        if settings.routers > 1:
            # The client ports are shared; /metrics gets a port of its own per router, so a
            # scrape reaches the router it means (router 0: the one printed at start-up).
            metrics_port = 0 if settings.server.metrics_port is None else None
            server = replace(settings.server, reuse_port=True)
            if metrics_port is not None:
                server = replace(server, metrics_port=metrics_port)
            settings = replace(settings, server=server)
        self.settings = settings
        self.plan = plan
        self.problem = problem  # the plan's, for re-planning
        self.extra_routers: list[ExtraRouter] = []  # routers 1..N-1
        # Router 0 merges every router's arrivals into its envelope (one router: its own).
        self._arrivals = (
            ArrivalMerger(lambda: self.router.stats.arrivals) if settings.routers > 1 else None
        )
        self.replanner: Replanner | None = None
        self._serving_since = 0.0  # the router's clock when the workers were started
        check_models(loaded)
        self.configs = dict(configs or stage_configs(loaded, self.settings, plan))
        self.tuner: Tuner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        catalog = self.settings.catalog
        self.backend: LocalBackend | None = None
        # The router's envelope windows, and the λ windows of Algorithm 4, which the router
        # counts for the tuner.
        slo_s = loaded.pipeline.spec.slo.latency_ms / 1e3
        windows_s = envelope_windows_s(plan.envelope if plan else None, slo_s)
        self.tuner_settings = TunerSettings(
            window_base_s=windows_s[0],
            window_max_s=windows_s[-1],
            interval_s=self.settings.tuner_interval_s,
            **self.settings.tuner_overrides,  # type: ignore[arg-type]
        )
        self.app = RouterApp(
            loaded,
            max_batch={n: c.max_batch for n, c in self.configs.items()},
            server=self.settings.server,
            router=self.settings.router,
            plan_envelope=plan.envelope if plan else None,
            lambda_windows_s=(
                self.tuner_settings.lambda_window_s,
                self.tuner_settings.lambda_lookback_s,
            ),
            registry=registry,
            on_arrival=None if self._arrivals is None else self._arrivals.add,
            observe_arrivals=self._arrivals is None,
            desired_replicas=lambda: self.backend.desired() if self.backend else {},
            cost_per_hour=lambda: {
                n: catalog.get(c.hardware).cost_per_hour * d
                for n, c in self.configs.items()
                for d in [self.backend.desired()[n] if self.backend else c.replicas]
            },
        )
        self.registry = self.app.registry
        self.envelope = self.app.envelope
        self.router = self.app.router
        self.server = self.app.server

    async def __aenter__(self) -> EmbeddedPipeline:
        await self.app.start()
        log_dir = self.settings.log_dir or Path(tempfile.mkdtemp(prefix="sloline-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        server = self.settings.server
        launches = self._extra_routers(log_dir) if self.settings.routers > 1 else []
        self.backend = LocalBackend(
            self.loaded.file,
            ",".join(
                [f"{server.worker_host}:{self.server.worker_port}"]
                + [r.worker_url for r in self.extra_routers]
            ),
            [
                StageLaunch(n, self.settings.catalog.get(c.hardware), c.replicas)
                for n, c in self.configs.items()
            ],
            log_dir=log_dir,
            grace_s=self.settings.worker_grace_s,
            worker_nice=self.settings.worker_nice,
            worker_token=server.worker_token,
            model_dir=self.loaded.base_dir,
            routers=launches,
        )
        self.router.on_attach = self.backend.worker_connected
        await self.backend.start()
        self._serving_since = self.router.clock()
        if self.plan is not None and self.settings.tuner:
            self.tuner = self._make_tuner(self.plan, self.backend)
            self._tasks.append(asyncio.create_task(self.tuner.run(self._stop)))
            replan = self.settings.replan
            if replan is not None and self.problem is not None:
                self.router.stats.arrivals = Ring(ARRIVALS_KEPT)
                self.replanner = Replanner(
                    problem=self.problem,
                    plan=self.plan,
                    serving=self,
                    settings=replan,
                    windows_s=self.plan.envelope.windows_s,
                )
                self._tasks.append(asyncio.create_task(self.replanner.run(self._stop)))
        return self

    def _extra_routers(self, log_dir: Path) -> list[RouterLaunch]:
        """Routers 1..N-1: their settings (router 0's, on its client ports, with worker and
        metrics ports of their own) and how the local backend starts them."""
        assert self._arrivals is not None
        self._arrivals.start(self.envelope)
        self._tasks.append(asyncio.create_task(self._arrivals.run(self._stop)))
        server = self.settings.server
        base = replace(
            server,
            http_port=self.server.http_port,
            grpc_port=self.server.grpc_port,
            reuse_port=True,
        )
        # Every router's metrics port, where the others fetch its Triton statistics.
        metrics_ports = [free_port(server.host) for _ in range(1, self.settings.routers)]
        every = [self.app.metrics_url] + [f"{server.host}:{port}" for port in metrics_ports]
        self.server.triton.peers.entries = tuple(every[1:])
        launches = []
        for i in range(1, self.settings.routers):
            settings = replace(
                base,
                worker_port=free_port(server.worker_host),
                metrics_port=metrics_ports[i - 1],
                stats_peers=tuple(every[:i] + every[i + 1 :]),
            )
            config = log_dir / f"router-{i}.json"
            write_router_config(
                config,
                RouterConfig(
                    pipeline=self.loaded.file,
                    server=settings,
                    router=self.settings.router,
                    max_batch={n: c.max_batch for n, c in self.configs.items()},
                    plan_envelope=self.plan.envelope if self.plan else None,
                    lambda_windows_s=(
                        self.tuner_settings.lambda_window_s,
                        self.tuner_settings.lambda_lookback_s,
                    ),
                ),
            )
            self.extra_routers.append(
                ExtraRouter(
                    f"router-{i}",
                    f"{server.worker_host}:{settings.worker_port}",
                    f"{server.host}:{settings.metrics_port}",
                )
            )
            launches.append(
                RouterLaunch(
                    f"router-{i}",
                    [
                        "embedded-router",
                        "--config",
                        str(config),
                        "--arrivals-fd",
                        str(self._arrivals.write_fd),
                        "--parent-pid",
                        str(os.getpid()),
                        *self.settings.router_flags,
                    ],
                    pass_fds=(self._arrivals.write_fd,),
                )
            )
        return launches

    # -- what the re-planner drives (sloline.tuner.replan.Serving) ----------------------

    def recent_arrivals(self, since_s: float) -> np.ndarray:
        arrivals = self.router.stats.arrivals
        assert arrivals is not None  # recorded while the re-planner runs
        return np.sort(arrivals.since(since_s))

    def calibration(
        self,
        profile: PipelineProfile,
        since: float,
        until: float | None = None,
        *,
        warmup_batches: int = 0,
        client_latency_s: np.ndarray | None = None,
    ) -> Calibration:
        """The calibration of what the router recorded from ``since`` (its clock) to
        ``until`` (default: now), against ``profile``; with the request path when a
        client's latencies of the same requests are given (``sloline calibrate``; ``sloline
        run --calibration-out`` and the re-planner have none)."""
        router = self.router
        stats = router.stats
        router_latency = stats.latency.since(since)
        catalog = self.settings.catalog
        on_cpu = {
            n for n, c in self.configs.items() if catalog.get(c.hardware).accelerator == "cpu"
        }
        return Calibration.measure(
            profile,
            {n: (c.hardware, c.max_batch) for n, c in self.configs.items()},
            {n: r.since(since) for n, r in stats.stage_batch.items()},
            {n: r.since(since) for n, r in stats.stage_service.items()},
            {n: r.since(since) for n, r in stats.stage_roundtrip.items()},
            pipeline=self.loaded.name,
            duration_s=max(0.0, (router.clock() if until is None else until) - since),
            requests=int(router_latency.size),
            warmup_batches=warmup_batches,
            cpu_s={n: r.since(since) for n, r in stats.stage_cpu.items() if n in on_cpu},
            idle_s={n: r.since(since) for n, r in stats.stage_idle.items()},
            request_s=(
                request_path(client_latency_s, router_latency)
                if client_latency_s is not None
                else ()
            ),
        )

    def measured(self, since_s: float) -> Calibration | None:
        """A calibration of the batches served since ``since_s`` against the plan's profile
        (each stage's first batches after start-up left out); None where a stage's class
        has no profile."""
        assert self.problem is not None  # the re-planner runs with a planning problem
        warmup = WARMUP_BATCHES if since_s <= self._serving_since else 0
        try:
            return self.calibration(self.problem.profile, max(since_s, 0.0), warmup_batches=warmup)
        except (KeyError, ValueError) as exc:  # a class served that was not profiled
            log.warning("re-plan: serving not measured, planning on the profile: %s", exc)
            return None

    def desired(self) -> dict[str, int]:
        assert self.backend is not None
        return self.backend.desired()

    def scale(self, stage: str, replicas: int) -> None:
        assert self.backend is not None
        self.backend.scale(stage, replicas)

    def reconfigure(self, stage: str, config: StageConfig) -> None:
        """Serve ``stage`` with another hardware class or max batch: the router gives
        workers that join from now on batches of ``config.max_batch`` (the running ones
        keep theirs) and the backend starts ``config.replicas`` of them; the running
        workers serve until :meth:`handed_over`."""
        assert self.backend is not None
        self.router.queues[stage].max_batch = config.max_batch
        self.backend.reconfigure(stage, self.settings.catalog.get(config.hardware), config.replicas)
        self.configs[stage] = StageDeployment(config.hardware, config.max_batch, config.replicas)

    def handed_over(self, stage: str) -> bool:
        """Once the stage's new workers are all connected, stop the old ones."""
        assert self.backend is not None
        outgoing = self.backend.outgoing(stage)
        if outgoing and self.router.replicas()[stage][1] < outgoing + self.backend.desired()[stage]:
            return False
        self.backend.hand_over(stage)
        return True

    def adopt(self, plan: Plan) -> None:
        self.plan = plan
        if self.tuner is not None:
            self.tuner.adopt(self._tunings(plan), plan.envelope, plan.rate_rps)

    def _tunings(self, plan: Plan) -> list[StageTuning]:
        return stage_tunings(
            plan,
            self.loaded.pipeline.spec.stages,
            max_replicas=self.settings.max_replicas,
            pinned=set(self.settings.replicas),
        )

    def _make_tuner(self, plan: Plan, backend: LocalBackend) -> Tuner:
        stages = self._tunings(plan)
        router = self.router

        class Actuator:
            async def scale(self, stage: str, replicas: int) -> None:
                backend.scale(stage, replicas)

            async def replicas(self, stage: str) -> tuple[int, int]:
                return backend.desired()[stage], router.replicas()[stage][1]

        settings = self.tuner_settings
        return Tuner(
            stages=stages,
            planning_envelope=plan.envelope,
            planning_rate_rps=plan.rate_rps,
            source=StreamingSource(
                self.envelope,
                lookback_s=settings.envelope_lookback_s,
                delay_s=0.0 if self._arrivals is None else ARRIVAL_DELAY_S,
            ),
            actuator=Actuator(),
            settings=settings,
            on_decision=TunerMetrics(self.registry).recorder(
                self.loaded.name, [s.name for s in stages]
            ),
        )

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until every stage has its desired number of connected workers."""
        deadline = time.monotonic() + timeout_s
        while True:
            replicas = self.router.replicas()
            if all(ready >= desired for desired, ready in replicas.values()):
                desired = {n: d for n, (d, _) in replicas.items()}
                others = await asyncio.gather(
                    *(asyncio.to_thread(r.ready_replicas) for r in self.extra_routers)
                )
                if all(ready.get(n, 0) >= d for ready in others for n, d in desired.items()):
                    return
            if time.monotonic() > deadline:
                errors = {n: s.last_error for n, s in self.backend_status().items() if s.last_error}
                raise TimeoutError(
                    f"workers not ready after {timeout_s:.0f}s: {replicas}; "
                    f"errors: {errors or 'none'}"
                )
            await asyncio.sleep(0.05)

    def backend_status(self) -> dict[str, ReplicaStatus]:
        return self.backend.status() if self.backend else {}

    async def shutdown(self, drain_s: float = 5.0) -> None:
        self._stop.set()
        for task in self._tasks:
            await task
        await self.app.drain(drain_s)
        if self.backend is not None:
            await self.backend.stop()  # the other routers drain first, then the workers go
        await self.app.stop()
        if self._arrivals is not None:
            self._arrivals.close()

    @property
    def http_url(self) -> str:
        return self.app.http_url

    @property
    def metrics_url(self) -> str:
        """Router 0's `/metrics` (a port of its own when there are several routers)."""
        return self.app.metrics_url

    @property
    def grpc_url(self) -> str:
        return self.app.grpc_url


@dataclass(frozen=True, slots=True)
class ExtraRouter:
    """One of routers 1..N-1 as the embedded mode addresses it."""

    name: str
    worker_url: str  # its worker port, which every worker dials
    metrics_url: str  # its `/metrics`

    def ready_replicas(self) -> dict[str, int]:
        """Connected workers per stage, from its `/metrics` ({} while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://{self.metrics_url}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return {}
        return {m["stage"]: int(float(m["value"])) for m in _READY_REPLICAS.finditer(text)}


_READY_REPLICAS = re.compile(
    r'^sloline_stage_replicas\{pipeline="[^"]*",stage="(?P<stage>[^"]*)",state="ready"\} '
    r"(?P<value>\S+)$",
    re.M,
)


def free_port(host: str) -> int:
    """A port free on `host` now (a router binds it right after)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """What an extra router process is started with (as a JSON file: `sloline
    embedded-router --config`); the worker token travels in its environment."""

    pipeline: Path
    server: ServerSettings
    router: RouterSettings
    max_batch: Mapping[str, int]
    plan_envelope: Envelope | None
    lambda_windows_s: tuple[float, float]


_PATH_FIELDS = ("tls_cert", "tls_key", "tls_client_ca")


def write_router_config(path: Path, config: RouterConfig) -> None:
    """Write `config` readable only by this user (it may hold client bearer tokens)."""
    server = {
        f.name: getattr(config.server, f.name)
        for f in fields(config.server)
        if f.name != "worker_token"
    }
    for name in _PATH_FIELDS:
        if server[name] is not None:
            server[name] = str(server[name])
    envelope = config.plan_envelope
    doc = {
        "pipeline": str(config.pipeline),
        "server": server,
        "router": asdict(config.router),
        "max_batch": dict(config.max_batch),
        "plan_envelope": (
            None if envelope is None else [list(envelope.windows_s), list(envelope.rates_rps)]
        ),
        "lambda_windows_s": list(config.lambda_windows_s),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out)


def read_router_config(path: Path) -> RouterConfig:
    doc = json.loads(path.read_text())
    server = doc["server"]
    for name in _PATH_FIELDS:
        if server[name] is not None:
            server[name] = Path(server[name])
    server["auth_tokens"] = tuple(server["auth_tokens"])
    server["stats_peers"] = tuple(server["stats_peers"])
    server["worker_token"] = os.environ.get(WORKER_TOKEN_ENV) or None
    envelope = doc["plan_envelope"]
    width_s, lookback_s = doc["lambda_windows_s"]
    return RouterConfig(
        pipeline=Path(doc["pipeline"]),
        server=ServerSettings(**server),
        router=RouterSettings(**doc["router"]),
        max_batch=doc["max_batch"],
        plan_envelope=None
        if envelope is None
        else Envelope(tuple(envelope[0]), tuple(envelope[1])),
        lambda_windows_s=(width_s, lookback_s),
    )


class ArrivalMerger:
    """Router 0's merge of every router's arrival times into its envelope, in time order.

    Its own arrivals come through `add`, the other routers' over a pipe (float64 monotonic
    seconds, the clock every process on the machine shares; each router sends them every
    `ARRIVAL_FLUSH_S`). A time is held until it is `ARRIVAL_HOLD_S` old, then counted, so
    the envelope counts the arrivals at their own times, as one process seeing them all
    would (counted as they came, a late batch would land in one instant, a burst that
    never was). A time that comes later still counts at the latest time counted. The
    tuner reads the envelope `ARRIVAL_DELAY_S` in the past. While the re-planner records
    arrivals, the other routers' times also go into its ring (router 0 adds its own)."""

    def __init__(
        self, ring: Callable[[], Ring | None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ring = ring
        self._clock = clock
        self._held = array.array("d")
        self._rest = b""
        self._envelope: StreamingEnvelope | None = None
        self.read_fd = self.write_fd = -1

    def start(self, envelope: StreamingEnvelope) -> None:
        """Open the pipe and read it on the running event loop; count into `envelope`."""
        self._envelope = envelope
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)  # the routers get write_fd through pass_fds
        asyncio.get_running_loop().add_reader(self.read_fd, self._read)

    def add(self, t_s: float) -> None:
        """One of router 0's own arrivals."""
        self._held.append(t_s)

    def _read(self) -> None:
        try:
            data = self._rest + os.read(self.read_fd, 1 << 16)
        except BlockingIOError:
            return
        whole = len(data) - len(data) % 8
        self._rest = data[whole:]
        if not whole:
            return
        self._held.frombytes(data[:whole])
        ring = self._ring()
        if ring is not None:
            for t_s in np.frombuffer(data[:whole], dtype=np.float64).tolist():
                ring.add(t_s, t_s)

    def flush(self, now_s: float) -> None:
        """Count the held times that are at least `ARRIVAL_HOLD_S` old, in time order."""
        if not self._held or self._envelope is None:
            return
        times = np.sort(np.frombuffer(self._held, dtype=np.float64))
        due = int(np.searchsorted(times, now_s - ARRIVAL_HOLD_S, side="right"))
        if due:
            self._envelope.observe_many(times[:due])
            self._held = array.array("d", times[due:].tobytes())

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every `ARRIVAL_FLUSH_S` until `stop`."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ARRIVAL_FLUSH_S)
            self.flush(self._clock())

    def close(self) -> None:
        if self.read_fd >= 0:
            asyncio.get_running_loop().remove_reader(self.read_fd)
            os.close(self.read_fd)
            os.close(self.write_fd)


class ArrivalWriter:
    """An extra router's end of the arrivals pipe: collects arrival times, sends them
    every `ARRIVAL_FLUSH_S` (dropped, with a warning, if router 0 does not keep up)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._times = array.array("d")

    def add(self, t_s: float) -> None:
        self._times.append(t_s)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(ARRIVAL_FLUSH_S)
            times, self._times = self._times, array.array("d")
            for start in range(0, len(times), _PIPE_WRITE):
                try:
                    os.write(self.fd, times[start : start + _PIPE_WRITE].tobytes())
                except BlockingIOError:
                    log.warning("router 0 is not reading arrival times; %d dropped", len(times))
                    break


def serve_extra_router(config_path: Path, arrivals_fd: int | None, parent_pid: int | None) -> int:
    """`sloline embedded-router`: one of routers 1..N-1 of `sloline run`, until SIGTERM
    (drain, close) or its parent's death."""
    die_with_parent(parent_pid)
    config = read_router_config(config_path)
    loaded = load_pipeline(config.pipeline)
    writer = ArrivalWriter(arrivals_fd) if arrivals_fd is not None else None

    async def serve() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        app = RouterApp(
            loaded,
            max_batch=config.max_batch,
            server=config.server,
            router=config.router,
            plan_envelope=config.plan_envelope,
            lambda_windows_s=config.lambda_windows_s,
            on_arrival=writer.add if writer is not None else None,
        )
        async with app:
            process.freeze_startup_heap()
            flush = asyncio.create_task(writer.run()) if writer is not None else None
            log.info(
                "router serving %s; workers %s, metrics %s",
                app.http_url,
                app.worker_url,
                app.metrics_url,
            )
            await stop.wait()
            if flush is not None:
                flush.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flush
        return 0

    return process.run(serve())
