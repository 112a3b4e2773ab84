"""The embedded (default) deployment: router, front doors and worker processes on one
machine. This is the composition root `sloline run` and the integration tests use:
it decides each stage's hardware class, max batch and replicas (flags and spec overrides
first), starts the router's servers, then the workers, and shuts down in the order that
loses nothing: stop admitting, let in-flight requests finish, stop workers, close ports.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from sloline.backends.base import ReplicaStatus
from sloline.backends.local import WORKER_NICE, LocalBackend, StageLaunch
from sloline.planner.config import StageConfig
from sloline.planner.plan import Plan
from sloline.planner.problem import PlanningProblem
from sloline.serving.app import RouterApp, envelope_windows_s
from sloline.serving.auth import generate_token
from sloline.serving.metrics import TunerMetrics
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.serving.stats import Ring
from sloline.spec import DEFAULT_CATALOG, HardwareCatalog, LoadedPipeline, PipelineError
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
        self.settings = settings
        self.plan = plan
        self.problem = problem  # the plan's, for re-planning
        self.replanner: Replanner | None = None
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
        server = self.settings.server
        self.backend = LocalBackend(
            self.loaded.file,
            f"{server.worker_host}:{self.server.worker_port}",
            [
                StageLaunch(n, self.settings.catalog.get(c.hardware), c.replicas)
                for n, c in self.configs.items()
            ],
            log_dir=log_dir,
            grace_s=self.settings.worker_grace_s,
            worker_nice=self.settings.worker_nice,
            worker_token=server.worker_token,
            model_dir=self.loaded.base_dir,
        )
        self.router.on_attach = self.backend.worker_connected
        await self.backend.start()
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

    # -- what the re-planner drives (sloline.tuner.replan.Serving) ----------------------

    def recent_arrivals(self, since_s: float) -> np.ndarray:
        arrivals = self.router.stats.arrivals
        assert arrivals is not None  # recorded while the re-planner runs
        return np.sort(arrivals.since(since_s))

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
            source=StreamingSource(self.envelope, lookback_s=settings.envelope_lookback_s),
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
            await self.backend.stop()
        await self.app.stop()

    @property
    def http_url(self) -> str:
        return self.app.http_url

    @property
    def grpc_url(self) -> str:
        return self.app.grpc_url
