"""Local backend: stage replicas as worker processes on this machine (the embedded mode).

Each replica is `python -m sloline worker ...` in its own process group, so a Ctrl-C in
the terminal reaches only the parent, which then drains and stops the workers in order.
Workers run at a lower CPU priority than the router (``nice`` +WORKER_NICE, in the
router's session, so that the kernel's per-session autogroups do not undo it): every
request crosses the router's single event loop several times, a batch only one worker,
so when the cores are short the router should not wait behind a worker (measured in
docs/planner.md, "Worker priority"). A
worker whose parent dies gets SIGTERM from the kernel (the worker sets Linux
`PR_SET_PDEATHSIG` itself, so no fork-time hook is needed), so no orphans survive a crash
of `sloline run`. Crashed workers are restarted at once, with a short backoff per stage
if they keep crashing (`RestartPolicy`); scale-down sends SIGTERM, and the worker finishes
its batch first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sloline.backends.base import ReplicaStatus
from sloline.serving.auth import WORKER_TOKEN_ENV
from sloline.spec import HardwareClass
from sloline.spec.loader import MODEL_DIR_ENV

log = logging.getLogger(__name__)

WORKER_NICE = 10  # workers' nice value above the router's


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When a stage whose worker crashed may start workers again.

    A worker that had connected to the router (it loaded, warmed up and served) is
    restarted at once: it died of something it was given - a request that kills its
    worker, which the router isolates and fails (serving/queue.py) - or of something
    passing (OOM, kill -9), and every restart lets the router go on isolating. A worker
    that dies before it connects is in a start-up crash loop: the first such crash after
    a quiet spell restarts at once, and each further one less than `reset_after_s` after
    the one before doubles the wait, from `first_delay_s` up to `max_delay_s`. So a
    stage is never left without workers for longer than `max_delay_s` (plus a worker's
    start-up) while starting one is possible.

    Kubernetes backs off from 10 s doubling to 5 minutes (CrashLoopBackOff), and resets
    after 10 minutes of running: it guards a shared cluster from pods that flap, and a
    Deployment's other pods serve meanwhile. Here the workers are one pipeline's on one
    machine, and a stage has nowhere else to run: a long wait is an outage of the whole
    pipeline. A cap of a few seconds still keeps a worker that cannot start from spending
    the cores on start-ups (about one per `max_delay_s` per replica, niced below the
    router).
    """

    first_delay_s: float = 0.1
    max_delay_s: float = 2.0
    reset_after_s: float = 10.0

    def delay(self, streak: int) -> float:
        """The wait after the `streak`-th crash in a row (1 = the first)."""
        if streak <= 1:
            return 0.0
        return min(self.max_delay_s, self.first_delay_s * 2.0 ** (streak - 2))


@dataclass(frozen=True, slots=True)
class StageLaunch:
    """How to start one stage's workers."""

    stage: str
    hardware: HardwareClass
    replicas: int


@dataclass(frozen=True, slots=True)
class RouterLaunch:
    """How to start one of the embedded mode's extra routers: `python -m sloline` with
    `argv`, inheriting the file descriptors `pass_fds`."""

    name: str
    argv: list[str]
    pass_fds: tuple[int, ...] = ()


@dataclass(slots=True, eq=False)
class _RouterProcess:
    launch: RouterLaunch
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    streak: int = 0
    start_after: float = float("-inf")
    last_error: str = ""


@dataclass(slots=True, eq=False)
class _Replica:
    process: subprocess.Popen[bytes]
    started: float
    log_path: Path
    stopping: bool = False
    outgoing: bool = False  # of the stage's previous hardware: serves until handed over
    connected: bool = False  # it said Hello to the router (`LocalBackend.worker_connected`)


@dataclass(slots=True)
class _Stage:
    launch: StageLaunch
    desired: int
    replicas: list[_Replica] = field(default_factory=list)
    restarts: int = 0
    streak: int = 0  # crashes in a row, each less than reset_after_s after the one before
    last_crash: float = float("-inf")
    start_after: float = float("-inf")  # no new worker before this (restart backoff)
    last_error: str = ""


class LocalBackend:
    """Runs and supervises worker processes for every stage of one pipeline."""

    def __init__(
        self,
        pipeline_file: Path,
        router_address: str,
        stages: list[StageLaunch],
        *,
        log_dir: Path,
        grace_s: float = 10.0,
        poll_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        worker_nice: int = WORKER_NICE,
        restart: RestartPolicy | None = None,
        worker_token: str | None = None,
        model_dir: Path | None = None,
        routers: list[RouterLaunch] | None = None,
    ) -> None:
        if not 0 <= worker_nice <= 19:
            raise ValueError(f"worker_nice must be 0-19 (a lower priority), got {worker_nice}")
        self.pipeline_file = pipeline_file
        self.worker_nice = worker_nice
        # the routers' worker ports, comma-separated (the workers' --router)
        self.router_address = router_address
        self.worker_token = worker_token  # passed in the environment, never in argv
        # The model directory the router resolved the pipeline with: the workers load the
        # same files, whatever SLOLINE_MODEL_DIR this process inherited.
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.clock = clock
        self.restart = restart or RestartPolicy()
        self._stages = {s.stage: _Stage(s, s.replicas) for s in stages}
        # The embedded mode's routers 1..N-1: restarted like workers that had connected
        # (at once; a router that dies within `reset_after_s` of its start backs off).
        self._routers = [_RouterProcess(launch) for launch in routers or ()]
        self._monitor: asyncio.Task[None] | None = None
        self._counter = 0

    async def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._reconcile_routers()
        self._reconcile()
        self._monitor = asyncio.create_task(self._watch())

    def router_pids(self) -> dict[str, int]:
        """The running extra routers' pids, by name."""
        return {
            r.launch.name: r.process.pid
            for r in self._routers
            if r.process is not None and r.process.poll() is None
        }

    def router_status(self) -> dict[str, tuple[int, str]]:
        """(restarts, last exit) of each extra router, by name."""
        return {r.launch.name: (r.restarts, r.last_error) for r in self._routers}

    def scale(self, stage: str, replicas: int) -> None:
        if stage not in self._stages:
            raise KeyError(f"no stage {stage!r}")
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self._stages[stage].desired = replicas
        self._reconcile()

    def reconfigure(self, stage: str, hardware: HardwareClass, replicas: int) -> None:
        """Serve ``stage`` on ``hardware`` from now on: start ``replicas`` workers of it.
        The running workers keep serving, no longer counted, until :meth:`hand_over`."""
        if stage not in self._stages:
            raise KeyError(f"no stage {stage!r}")
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        s = self._stages[stage]
        for replica in s.replicas:
            replica.outgoing = True
        s.launch = StageLaunch(stage, hardware, replicas)
        s.desired = replicas
        self._reconcile()

    def outgoing(self, stage: str) -> int:
        """Workers of the stage's previous hardware still running."""
        return sum(r.outgoing and not r.stopping for r in self._stages[stage].replicas)

    def hand_over(self, stage: str) -> None:
        """Stop the previous hardware's workers (each finishes its batch first)."""
        for replica in self._stages[stage].replicas:
            if replica.outgoing:
                self._terminate(replica)

    def status(self) -> dict[str, ReplicaStatus]:
        return {
            name: ReplicaStatus(
                s.desired, sum(_counted(r) for r in s.replicas), s.restarts, s.last_error
            )
            for name, s in self._stages.items()
        }

    def desired(self) -> dict[str, int]:
        return {name: s.desired for name, s in self._stages.items()}

    def worker_connected(self, pid: int) -> None:
        """The router says the worker `pid` connected (loaded, warmed up, said Hello): if
        it dies from now on, it is restarted at once (`RestartPolicy`)."""
        for stage in self._stages.values():
            for replica in stage.replicas:
                if replica.process.pid == pid:
                    replica.connected = True
                    return

    def pids(self, stage: str) -> list[int]:
        return [r.process.pid for r in self._stages[stage].replicas if _counted(r)]

    async def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        await self._stop_routers()
        replicas = [r for s in self._stages.values() for r in s.replicas]
        for replica in replicas:
            self._terminate(replica)
        deadline = self.clock() + self.grace_s
        while any(r.process.poll() is None for r in replicas) and self.clock() < deadline:
            await asyncio.sleep(0.02)
        for replica in replicas:
            if replica.process.poll() is None:
                log.warning(
                    "worker pid %d ignored SIGTERM for %.0fs; killing",
                    replica.process.pid,
                    self.grace_s,
                )
                replica.process.kill()
                replica.process.wait()
        for stage in self._stages.values():
            stage.replicas.clear()

    async def _stop_routers(self) -> None:
        """SIGTERM the extra routers (they drain their requests while the workers still
        serve) and wait for them, killing those that outlast the grace period."""
        running = [r.process for r in self._routers if r.process is not None]
        for proc in running:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = self.clock() + self.grace_s
        while any(proc.poll() is None for proc in running) and self.clock() < deadline:
            await asyncio.sleep(0.02)
        for proc in running:
            if proc.poll() is None:
                log.warning(
                    "router pid %d ignored SIGTERM for %.0fs; killing", proc.pid, self.grace_s
                )
                proc.kill()
                proc.wait()
        self._routers.clear()

    # ------------------------------------------------------------------ internals
    def _spawn_router(self, router: _RouterProcess) -> None:
        """Start an extra router; it logs where this process does (a router's logs are
        the user's, unlike a worker's)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop(WORKER_TOKEN_ENV, None)
        if self.worker_token:
            env[WORKER_TOKEN_ENV] = self.worker_token
        if self.model_dir is not None:
            env[MODEL_DIR_ENV] = str(self.model_dir)
        router.process = subprocess.Popen(
            [sys.executable, "-m", "sloline", *router.launch.argv],
            env=env,
            process_group=0,
            pass_fds=router.launch.pass_fds,
        )
        router.started = self.clock()

    def _reconcile_routers(self) -> None:
        now = self.clock()
        for router in self._routers:
            proc = router.process
            if proc is not None and (code := proc.poll()) is not None:
                router.process = None
                router.restarts += 1
                if now - router.started >= self.restart.reset_after_s:
                    router.streak = 0
                router.streak += 1
                router.start_after = now + self.restart.delay(router.streak)
                router.last_error = f"router pid {proc.pid} exited with {code}"
                log.warning("%s: %s", router.launch.name, router.last_error)
            if router.process is None and now >= router.start_after:
                self._spawn_router(router)

    def _spawn(self, stage: _Stage) -> None:
        hw = stage.launch.hardware
        self._counter += 1
        log_path = self.log_dir / f"{stage.launch.stage}-{self._counter}.log"
        cmd = [
            sys.executable,
            "-m",
            "sloline",
            "worker",
            "--pipeline",
            str(self.pipeline_file),
            "--stage",
            stage.launch.stage,
            "--router",
            self.router_address,
            "--threads",
            str(hw.embedded.threads),
            "--hardware",
            hw.name,
            "--worker-id",
            f"{stage.launch.stage}-{self._counter}",
            "--parent-pid",
            str(os.getpid()),
        ]
        if hw.embedded.cuda_device is not None:
            cmd += ["--cuda-device", str(hw.embedded.cuda_device)]
        if self.worker_nice:
            cmd += ["--nice", str(self.worker_nice)]
        threads = str(hw.embedded.threads)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
        }
        env.pop(WORKER_TOKEN_ENV, None)
        if self.worker_token:
            env[WORKER_TOKEN_ENV] = self.worker_token
        if self.model_dir is not None:
            env[MODEL_DIR_ENV] = str(self.model_dir)
        if hw.embedded.cpus:
            cmd += ["--cpus", ",".join(map(str, hw.embedded.cpus))]
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, process_group=0
            )
        stage.replicas.append(_Replica(process, self.clock(), log_path))

    def _terminate(self, replica: _Replica) -> None:
        replica.stopping = True
        if replica.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                replica.process.send_signal(signal.SIGTERM)

    def _reconcile(self) -> None:
        now = self.clock()
        for stage in self._stages.values():
            live = [r for r in stage.replicas if _counted(r)]
            if len(live) > stage.desired:
                # Stop the youngest first: they are the likeliest to still be starting.
                for replica in sorted(live, key=lambda r: r.started)[stage.desired :]:
                    self._terminate(replica)
            elif len(live) < stage.desired and self._may_restart(stage, now):
                for _ in range(stage.desired - len(live)):
                    self._spawn(stage)

    def _may_restart(self, stage: _Stage, now: float) -> bool:
        """False while the stage waits out its restart backoff (`RestartPolicy`)."""
        return now >= stage.start_after

    def _reap(self) -> None:
        now = self.clock()
        for name, stage in self._stages.items():
            for replica in list(stage.replicas):
                code = replica.process.poll()
                if code is None:
                    continue
                stage.replicas.remove(replica)
                if replica.stopping or replica.outgoing:  # an outgoing one is not replaced
                    continue
                stage.restarts += 1
                if replica.connected or now - stage.last_crash >= self.restart.reset_after_s:
                    stage.streak = 0
                stage.streak += 1
                stage.last_crash = now
                delay = self.restart.delay(stage.streak)
                stage.start_after = max(stage.start_after, now + delay)
                backoff = (
                    f" (crash {stage.streak} in a row before it connected: restart in "
                    f"{delay:.1f} s)"
                ) * (delay > 0)
                stage.last_error = (
                    f"worker pid {replica.process.pid} exited with {code}{backoff}: "
                    + _tail(replica.log_path)
                )
                log.warning("stage %s: %s", name, stage.last_error)

    async def _watch(self) -> None:
        while True:
            self._reconcile_routers()
            self._reap()
            self._reconcile()
            await asyncio.sleep(self.poll_s)


def _counted(replica: _Replica) -> bool:
    return not (replica.stopping or replica.outgoing)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) if text else "(empty log)"
