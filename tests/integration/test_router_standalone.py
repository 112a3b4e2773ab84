"""The Kubernetes mode's processes on loopback: `sloline router` and `sloline worker`
started separately, in any order, the way pods start.

The pipeline file lives in its own folder (the ConfigMap) and its Python stages in
another, found through SLOLINE_MODEL_DIR. One worker starts before the router and must
keep retrying until it connects; its /ready goes 503 -> 200. Requests go through the real
tritonclient clients; metrics are on the separate metrics port and report connected
workers, not a desired count. SIGTERM to a worker under load loses no request, and
SIGTERM to the router drains and exits 0, after which the workers report not ready and
still exit 0 on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sloline.common.envelope import Envelope
from sloline.planner.plan import Plan, StagePlan
from tests.support.net import free_port
from tests.support.serve import NOOP

NOOP_DIR = NOOP.parent


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # not listening (yet)


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Processes:
    """Subprocesses of one test, logged to files; whatever is left is killed at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ,
            "SLOLINE_MODEL_DIR": str(NOOP_DIR),
            "PYTHONUNBUFFERED": "1",
            # The pipeline's worker token, as the operator's Secret gives it to both.
            "SLOLINE_WORKER_TOKEN": "standalone-test-token",
        }

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.folder / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "sloline", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.started[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def alive(self, name: str) -> bool:
        if self.started[name].poll() is None:
            return True
        raise AssertionError(f"{name} exited early:\n{self.log(name)[-3000:]}")

    def stop(self, name: str, timeout_s: float = 15.0) -> int:
        process = self.started[name]
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout_s)

    def kill_all(self) -> None:
        for process in self.started.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()


def write_plan(path: Path) -> None:
    stages = tuple(
        StagePlan(name, "cpu-1", batch, replicas, 0.05 * replicas, 1000.0, 0.5, 1.0, 0.001, 1, 0.1)
        for name, batch, replicas in (("s1", 1, 1), ("s2", 4, 2), ("s3", 2, 1))
    )
    plan = Plan(
        pipeline="noop",
        stages=stages,
        slo_s=5.0,
        percentile=99.0,
        cost_per_hour=0.2,
        p50_s=0.001,
        p99_s=0.002,
        tail_s=0.002,
        attainment=1.0,
        rate_rps=100.0,
        envelope=Envelope((0.1, 0.2, 0.4), (200.0, 150.0, 120.0)),
    )
    path.write_text(json.dumps(plan.to_dict()))


def test_router_and_workers_started_in_any_order(processes: Processes, tmp_path: Path) -> None:
    # The pipeline file alone in a folder, as a ConfigMap mounts it; a generous SLO so a
    # loaded CI machine does not turn slow answers into 504s.
    config = tmp_path / "etc"
    config.mkdir()
    pipeline = config / "pipeline.yaml"
    pipeline.write_text(NOOP.read_text().replace("latencyMs: 100", "latencyMs: 5000"))
    plan = config / "plan.json"
    write_plan(plan)
    http, grpc_port, metrics, worker_port = free_port(), free_port(), free_port(), free_port()
    router_address = f"127.0.0.1:{grpc_port}"
    worker_address = f"127.0.0.1:{worker_port}"
    health = {name: free_port() for name in ("s1", "s2a", "s2b", "s3")}

    def worker(name: str) -> None:
        stage = name[:2]
        processes.start(
            name,
            "worker",
            "--pipeline",
            str(pipeline),
            "--stage",
            stage,
            "--router",
            worker_address,
            "--health-port",
            str(health[name]),
        )

    def ready(name: str) -> int:
        return status(f"http://127.0.0.1:{health[name]}/ready")

    # A worker before its router: live, loaded, not ready, retrying.
    worker("s1")
    wait_for(lambda: processes.alive("s1") and ready("s1") == 503, "s1 /ready 503")
    assert status(f"http://127.0.0.1:{health['s1']}/live") == 200
    processes.start(
        "router",
        "router",
        "--pipeline",
        str(pipeline),
        "--plan",
        str(plan),
        "--port",
        str(http),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics),
        "--worker-port",
        str(worker_port),
    )
    for name in ("s2a", "s2b", "s3"):
        worker(name)
    router_ready = f"http://127.0.0.1:{http}/v2/health/ready"
    wait_for(lambda: processes.alive("router") and status(router_ready) == 200, "router ready", 40)
    for name in health:
        wait_for(lambda n=name: processes.alive(n) and ready(n) == 200, f"{name} /ready 200")
    assert "stage s2: max batch 4" in processes.log("router")  # from the plan

    x = np.arange(3, dtype=np.float32)
    http_in = httpclient.InferInput("x", [3], "FP32")
    http_in.set_data_from_numpy(x)
    answer = httpclient.InferenceServerClient(f"127.0.0.1:{http}").infer("noop", [http_in])
    assert answer.as_numpy("x").tolist() == x.tolist()

    def scrape() -> str:
        url = f"http://127.0.0.1:{metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def ready_replicas(text: str, stage: str) -> float:
        pattern = (
            rf'^sloline_stage_replicas\{{pipeline="noop",stage="{stage}",state="ready"\}} (\S+)$'
        )
        found = re.search(pattern, text, re.M)
        assert found, text
        return float(found.group(1))

    text = scrape()
    assert [ready_replicas(text, s) for s in ("s1", "s2", "s3")] == [1, 2, 1]
    assert 'state="desired"' not in text  # the operator owns desired on Kubernetes
    assert re.search(
        r'^sloline_stage_cost_per_hour\{pipeline="noop",stage="s2"\} 0\.1$', text, re.M
    )
    assert re.search(r'^sloline_requests_total\{code="200",pipeline="noop"\} 1\.0$', text, re.M)

    # SIGTERM one of the two s2 workers under load: every request is still answered.
    client = grpcclient.InferenceServerClient(router_address)
    outcomes: Counter[str] = Counter()
    stop = threading.Event()

    def load(thread: int) -> None:
        i = 0
        while not stop.is_set():
            value = np.array([thread, i], np.float32)
            tensor = grpcclient.InferInput("x", [2], "FP32")
            tensor.set_data_from_numpy(value)
            try:
                out = client.infer("noop", [tensor]).as_numpy("x")
                outcomes["ok" if out.tolist() == value.tolist() else "wrong"] += 1
            except InferenceServerException as exc:
                outcomes[f"error: {exc}"] += 1
            i += 1

    threads = [threading.Thread(target=load, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: outcomes["ok"] >= 50, "load to build up")
    assert processes.stop("s2a") == 0
    served_before = outcomes["ok"]
    wait_for(lambda: outcomes["ok"] >= served_before + 50, "serving on after the stop")
    stop.set()
    for t in threads:
        t.join(30)
    assert set(outcomes) == {"ok"}, outcomes
    wait_for(lambda: ready_replicas(scrape(), "s2") == 1, "s2 down to one connected worker")

    # SIGTERM the router: it drains and exits 0; the workers lose their stream, report
    # not ready, keep retrying, and still stop cleanly.
    assert processes.stop("router") == 0
    assert "stopping" in processes.log("router")
    wait_for(lambda: ready("s1") == 503, "s1 /ready 503 after the router left")
    for name in ("s1", "s2b", "s3"):
        assert processes.alive(name)
        assert processes.stop(name) == 0, processes.log(name)[-2000:]
