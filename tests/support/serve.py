"""Serve a pipeline in the test process: the embedded stack (router, front doors, worker
processes) runs on its own event loop in a background thread, so tests can use the real
blocking tritonclient clients against it."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from sloline.embedded import EmbeddedPipeline, EmbeddedSettings
from sloline.planner.plan import Plan
from sloline.planner.problem import PlanningProblem
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.spec import load_pipeline
from sloline.tuner.replan import ReplanSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NOOP = ROOT / "tests" / "support" / "pipelines" / "noop" / "pipeline.yaml"
RECIPROCAL = ROOT / "tests" / "support" / "pipelines" / "noop" / "reciprocal.yaml"
SLEEPY = ROOT / "tests" / "support" / "pipelines" / "sleepy" / "pipeline.yaml"
BATCHY = ROOT / "tests" / "support" / "pipelines" / "batchy" / "pipeline.yaml"
BURNY = ROOT / "tests" / "support" / "pipelines" / "burny" / "pipeline.yaml"
T = TypeVar("T")


def build_example(name: str) -> Path:
    """Build an example's models if missing (as `make run` does) and return its pipeline."""
    folder = EXAMPLES / name
    subprocess.run([sys.executable, str(folder / "build.py")], check=True, capture_output=True)
    return folder / "pipeline.yaml"


class BackgroundPipeline:
    def __init__(
        self,
        path: Path,
        *,
        replicas: dict[str, int] | None = None,
        max_batch: dict[str, int] | None = None,
        router: RouterSettings | None = None,
        max_body_bytes: int = 64 * 1024 * 1024,
        ready_timeout_s: float = 60.0,
        plan: Plan | None = None,
        tuner: Mapping[str, float] | None = None,
        run_tuner: bool = True,
        problem: PlanningProblem | None = None,
        replan: ReplanSettings | None = None,
        server: Mapping[str, Any] | None = None,
        routers: int = 1,
        log_dir: Path | None = None,
    ) -> None:
        self.settings = EmbeddedSettings(
            server=ServerSettings(
                **{"http_port": 0, "grpc_port": 0, "max_body_bytes": max_body_bytes}
                | dict(server or {})
            ),
            # Tests check function, not the SLO: a loaded CI machine must not turn slow
            # answers into 504s (nor admission into 503s) unless a test asks for tight
            # deadlines.
            router=router or RouterSettings(deadline_factor=50.0, admission_factor=50.0),
            replicas=replicas or {},
            max_batch=max_batch or {},
            tuner_overrides=tuner or {},
            tuner=run_tuner,
            replan=replan,
            routers=routers,
            log_dir=log_dir,
        )
        self.plan = plan
        self.problem = problem
        self.loaded = load_pipeline(path)
        self.ready_timeout_s = ready_timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.pipeline: EmbeddedPipeline | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 120.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def __enter__(self) -> BackgroundPipeline:
        self.thread.start()

        async def start() -> EmbeddedPipeline:
            pipeline = EmbeddedPipeline(
                self.loaded, self.settings, plan=self.plan, problem=self.problem
            )
            await pipeline.__aenter__()
            await pipeline.wait_ready(self.ready_timeout_s)
            return pipeline

        try:
            self.pipeline = self.call(start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pipeline is not None:
            self.call(self.pipeline.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def p(self) -> EmbeddedPipeline:
        assert self.pipeline is not None
        return self.pipeline

    @property
    def http_url(self) -> str:
        return self.p.http_url

    @property
    def grpc_url(self) -> str:
        return self.p.grpc_url

    @property
    def name(self) -> str:
        return self.loaded.name


def run_routers(*flags: str) -> tuple[subprocess.Popen[str], list[str]]:
    """`sloline run NOOP` with `flags` (ports, `--routers N`, ...), read up to its banner's
    metrics line: the process (stdout still piped) and every router's metrics URL, router
    0's first."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sloline", "run", str(NOOP), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert process.stdout is not None
    while not any(line.strip().startswith("metrics ") for line in lines):
        line = process.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
    banner = next(line for line in lines if line.strip().startswith("metrics "))
    return process, re.findall(r"http://[\d.:]+/metrics", banner)
