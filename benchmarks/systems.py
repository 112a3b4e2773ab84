"""The systems the serving benchmark compares, each run as its own processes.

- `SlolineSystem`: `python -m sloline run` (router + one worker process per stage).
- `RaySystem`: `benchmarks/ray_app.py` in the default mode or the high-throughput mode
  (`RAY_SERVE_THROUGHPUT_OPTIMIZED=1`, `RAY_SERVE_ENABLE_HA_PROXY=1`).
- `FloorSystem`: `benchmarks/floor.py`, the pipeline in one process (it measures itself).

Also here: the JSON-lines child process helper the orchestrator talks through, and CPU
accounting of a process tree (every process a server started, read from /proc via
psutil before and after a phase), so "server CPU" includes routers, workers, proxies,
controllers, raylets and HAProxy alike.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
RAY_MODES = {
    "ray-default": {},
    "ray-ht": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"},
}
# Ray renices its worker processes (every actor: controller, proxy, replicas) by +15
# (`worker_niceness`, ray-project/ray#24928) so that its own daemons win the CPU; sloline
# runs its workers 10 steps below its router (`--worker-nice`). Beside a load generator at
# the caller's priority, Ray's processes at +15 lose most of the CPU to it (measured here:
# 14 rps instead of 174 at 64 B with 16 clients), and sloline's workers at +10 would too.
# Every process of both systems at the caller's priority (sloline: `--worker-nice 0`):
RAY_ENV = {"RAY_worker_niceness": "0"}


class ChildProcess:
    """A child speaking JSON lines on stdin/stdout, with deadlines on every answer."""

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None,
                 stderr_path: Path | None = None) -> None:  # fmt: skip
        self._stderr = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=env, cwd=HERE.parent)  # fmt: skip
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"pid {self.pid}: no answer within {timeout_s:.0f} s")
                if sel.select(left):
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        raise RuntimeError(f"pid {self.pid} exited (code {self.proc.wait()})")
                    self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return dict(json.loads(line))

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.send(message)
        return self.read(timeout_s)

    def close(self, grace_s: float = 30.0) -> None:
        """Close stdin (the polite stop), then SIGTERM, then SIGKILL the whole tree."""
        stop_tree(self.proc, grace_s, polite=lambda: self.proc.stdin and self.proc.stdin.close())
        if self._stderr is not subprocess.DEVNULL:
            self._stderr.close()


def stop_tree(proc: subprocess.Popen[bytes], grace_s: float, polite: Any = None) -> None:
    """Stop `proc` and every process it started (only those), politely first."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if polite is not None:
        polite()
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    _, alive = psutil.wait_procs(tree, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def tree_cpu(root_pid: int) -> dict[int, tuple[float, str]]:
    """CPU seconds (user + system) and a role label of `root_pid` and all its
    descendants, by pid."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = (t.user + t.system, role(p.cmdline()))
        except psutil.NoSuchProcess:
            pass
    return out


def role(cmdline: list[str]) -> str:
    """A short name for a server process: sloline router/worker, Ray actor or daemon."""
    if "--worker-id" in cmdline:
        return "worker " + cmdline[cmdline.index("--worker-id") + 1].rsplit("-", 1)[0]
    if "run" in cmdline and "sloline" in cmdline:
        return "router"
    if "embedded-router" in cmdline:  # `run --routers N`: routers 1..N-1
        return "other routers"
    if cmdline and cmdline[0].startswith("ray::"):
        return cmdline[0].replace("ServeReplica:pipeline:", "")
    for arg in cmdline:
        name = Path(arg).name
        if name in ("gcs_server", "raylet", "haproxy") or name.endswith(".py"):
            return name
    return Path(cmdline[0]).name if cmdline else "?"


@dataclass
class CpuMeter:
    """Server CPU over a phase, plus what the whole machine did meanwhile."""

    root_pid: int
    _before: dict[int, tuple[float, str]] = field(default_factory=dict)
    _machine: Any = None
    _t0: float = 0.0

    def start(self) -> None:
        self._before = tree_cpu(self.root_pid)
        self._machine = psutil.cpu_times()
        self._t0 = time.perf_counter()

    def stop(self) -> dict[str, float]:
        after = tree_cpu(self.root_pid)
        machine = psutil.cpu_times()
        wall = time.perf_counter() - self._t0
        by_role: dict[str, float] = {}
        for pid, (cpu, name) in after.items():
            before = self._before.get(pid, (0.0, name))[0]
            by_role[name] = by_role.get(name, 0.0) + cpu - before
        server = sum(by_role.values())
        busy = sum(getattr(machine, f) - getattr(self._machine, f)
                   for f in ("user", "system", "nice", "irq", "softirq", "steal"))  # fmt: skip
        return {
            "server_cpu_s": server,
            "server_cpu_s_by_process": by_role,
            "machine_busy_cores": busy / wall,
            "phase_wall_s": wall,
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, body: bytes | None, deadline_s: float, what: str,
              headers: dict[str, str] | None = None) -> None:  # fmt: skip
    """Poll `url` (GET, or POST `body`) until it answers 200, or raise after the deadline."""
    deadline = time.monotonic() + deadline_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(url, data=body, headers=headers or {})
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not answer 200 at {url} within {deadline_s:.0f} s: {last}")


PERF_ANALYZER = HERE.parent / ".tools" / "bin" / "perf_analyzer"


def have_perf_analyzer() -> bool:
    """Whether Triton's perf_analyzer is installed; says how to get it if not."""
    if os.access(PERF_ANALYZER, os.X_OK):
        return True
    print("error: no perf_analyzer: run scripts/fetch_perf_analyzer.sh", file=sys.stderr)
    return False


def run_perf_analyzer(flags: list[str], window_ms: int, out: Path) -> dict[str, Any]:
    """One perf_analyzer measurement over `window_ms` windows (`flags`: the model, URL,
    and its concurrency or request-rate flags): throughput and latency percentiles, or
    the error it stopped at."""
    argv = [str(PERF_ANALYZER), *flags, "--measurement-interval", str(window_ms),
            "--stability-percentage", "999", "--max-trials", "3", "-f", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or not out.exists():
        return {"error": (done.stdout + done.stderr)[-1500:]}
    (row,) = list(csv.DictReader(out.open()))
    out.unlink()
    return {"rps": float(row["Inferences/Second"]), "p50_ms": int(row["p50 latency"]) / 1e3,
            "p99_ms": int(row["p99 latency"]) / 1e3}  # fmt: skip


def has_routers_flag(source: Path | None) -> bool:
    """Whether the sloline package at `source` (None: this checkout) has `sloline run
    --routers` (a build from before it serves one router and refuses the flag)."""
    if source is None:
        return True
    return any('"--routers"' in f.read_text() for f in (source / "sloline").rglob("*.py"))


class SlolineSystem:
    def __init__(self, pipeline_file: Path, max_batch: dict[str, int], run_dir: Path,
                 name: str = "sloline", source: Path | None = None,
                 routers: int = 1, replicas: int | Mapping[str, int] = 1,
                 args: Sequence[str] = ()) -> None:  # fmt: skip
        """`source`: run the sloline package found there (another build: its router and,
        through the inherited PYTHONPATH, its workers) instead of the importable one;
        `routers`: `sloline run --routers`; `replicas`: workers per stage (one count for
        all, or per stage); `args`: more `sloline run` flags (later ones win)."""
        self.name = name
        self.pipeline_file = pipeline_file
        self.max_batch = max_batch
        self.run_dir = run_dir
        self.env = None if source is None else {**os.environ, "PYTHONPATH": str(source)}
        self.source = source
        self.routers = routers
        self.replicas = replicas
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = self.grpc_port = 0
        self.metrics_urls: list[str] = []

    def start(self, timeout_s: float = 120.0) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        # A fixed configuration, the same as every other system's: no planning, no tuner
        # (`sloline run` would otherwise profile, plan and autoscale replicas under the
        # benchmark's load), `replicas` per stage (one by default), the given max batch.
        argv = [sys.executable, "-m", "sloline", "run", str(self.pipeline_file.resolve()),
                "--port", str(self.port), "--grpc-port", str(self.grpc_port), "--no-plan",
                "--no-tuner", "--status-interval", "0", "--duration", "3600",
                "--worker-nice", "0",  # as Ray's replicas (RAY_ENV)
                "--log-dir", str(self.run_dir.resolve() / f"{self.name}-workers")]  # fmt: skip
        if self.routers != 1 or has_routers_flag(self.source):
            argv += ["--routers", str(self.routers)]
        for stage, batch in self.max_batch.items():
            replicas = (self.replicas if isinstance(self.replicas, int)
                        else self.replicas[stage])  # fmt: skip
            argv += ["--max-batch", f"{stage}={batch}", "--replicas", f"{stage}={replicas}"]
        self.argv = [*argv, *self.args]
        log_path = self.run_dir / f"{self.name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 (closed with the process)
        # `python -m` puts the working directory first on sys.path: run another build from
        # its own folder, or a checkout's package would shadow it.
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                     env=self.env, cwd=self.source)  # fmt: skip
        log.close()
        wait_http(f"http://127.0.0.1:{self.port}/v2/health/ready", None, timeout_s, "sloline")
        # Every router's /metrics, from the start-up banner (one per router).
        deadline = time.monotonic() + timeout_s
        while not self.metrics_urls and time.monotonic() < deadline:
            for line in log_path.read_text(errors="replace").splitlines():
                if line.strip().startswith("metrics "):
                    self.metrics_urls = re.findall(r"http://[\d.:]+/metrics", line)
            time.sleep(0.05)
        ready = [url.replace("/metrics", "/v2/health/ready") for url in self.metrics_urls[1:]]
        for url in ready:  # the other routers' workers connected too
            wait_http(url, None, timeout_s, "sloline router")

    def scrape(self) -> list[str]:
        """Every router's `/metrics` text, in `metrics_urls` order."""
        texts = []
        for url in self.metrics_urls:
            with urllib.request.urlopen(url, timeout=5) as r:
                texts.append(r.read().decode())
        return texts

    def batch_stats(self, texts: list[str] | None = None) -> dict[str, tuple[float, float]]:
        """(sum, count) of `sloline_stage_batch_size` per stage, over every router (in
        `texts`, a `scrape`, or scraped now)."""
        text = "\n".join(self.scrape() if texts is None else texts)
        out: dict[str, tuple[float, float]] = {}
        for kind, stage, value in re.findall(
            r'^sloline_stage_batch_size_(sum|count)\{pipeline="[^"]*",stage="([^"]*)"\} (\S+)$',
            text, re.M):  # fmt: skip
            total, count = out.get(stage, (0.0, 0.0))
            if kind == "sum":
                total += float(value)
            else:
                count += float(value)
            out[stage] = (total, count)
        return out

    @staticmethod
    def metric_total(text: str, name: str) -> float:
        """The sum of every labelled series of the metric `name` in one router's text."""
        pattern = rf"^{re.escape(name)}\{{.*\}} (\S+)$"
        return sum(float(v) for v in re.findall(pattern, text, re.M))

    @classmethod
    def credit_messages(cls, texts: list[str]) -> float:
        """Credit messages in a `scrape` (`sloline_stage_credit_messages_total`), every
        router, stage and kind."""
        return sum(cls.metric_total(t, "sloline_stage_credit_messages_total") for t in texts)

    @property
    def root_pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def endpoint(self, workload: Any) -> tuple[str, Path, dict[str, str]]:
        """OIP v2 REST with the binary tensor extension (what tritonclient.http sends)."""
        return (f"http://127.0.0.1:{self.port}/v2/models/{workload.model}/infer",
                workload.sloline_body_file, workload.sloline_headers)  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc, 20.0)  # SIGTERM: drain, stop workers, close ports
            self.proc = None


class RaySystem:
    def __init__(self, mode: str, pipeline_file: Path, max_batch: dict[str, int],
                 threads: dict[str, int], run_dir: Path,
                 extra_env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.name = mode
        self.env = {**os.environ, **RAY_ENV, **RAY_MODES[mode], **(extra_env or {})}
        self.pipeline_file = pipeline_file
        self.max_batch = max_batch
        self.threads = threads
        self.run_dir = run_dir
        self.child: ChildProcess | None = None
        self.port = 0
        self.startup: dict[str, Any] = {}

    def start(self, timeout_s: float = 240.0) -> None:
        self.port = free_port()
        argv = [sys.executable, str(HERE / "ray_app.py"), str(self.pipeline_file),
                "--port", str(self.port)]  # fmt: skip
        for stage, batch in self.max_batch.items():
            argv += ["--max-batch", f"{stage}={batch}"]
        for stage, threads in self.threads.items():
            argv += ["--threads", f"{stage}={threads}"]
        self.child = ChildProcess(argv, env=self.env, stderr_path=self.run_dir / f"{self.name}.log")
        self.startup = self.child.read(timeout_s)

    @property
    def root_pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def endpoint(self, workload: Any) -> tuple[str, Path, dict[str, str]]:
        """The input tensor's raw bytes to Ray's HTTP proxy (or HAProxy)."""
        return f"http://127.0.0.1:{self.port}/", workload.raw_body_file, {}

    def stop(self) -> None:
        if self.child is not None:
            self.child.close(grace_s=60.0)
            self.child = None


class FloorSystem:
    name = "floor"

    def __init__(self, pipeline_file: Path, max_batch: dict[str, int], threads: int,
                 run_dir: Path) -> None:  # fmt: skip
        self.pipeline_file = pipeline_file
        self.max_batch = max_batch
        self.threads = threads
        self.run_dir = run_dir
        self.child: ChildProcess | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        self.child = ChildProcess([sys.executable, str(HERE / "floor.py")],
                                  stderr_path=self.run_dir / "floor.log")  # fmt: skip
        answer = self.child.request({"kind": "load", "pipeline": str(self.pipeline_file),
                                     "threads": self.threads, "max_batch": self.max_batch},
                                    timeout_s)  # fmt: skip
        if "failed" in answer:
            raise RuntimeError(f"floor: {answer['failed']}")

    @property
    def root_pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def stop(self) -> None:
        if self.child is not None:
            self.child.close(grace_s=10.0)
            self.child = None
