"""Triton's statistics extension answers for the whole pipeline whichever router a
connection lands on (`sloline run --routers 3`, REST and gRPC, the pipeline and its
stages; `sloline router --peers`, the Kubernetes mode's routers), and a peer that does
not answer is left out without failing the request."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from sloline.serving.triton_stats import LOCAL_STATS_PATH
from tests.support.net import free_port
from tests.support.serve import NOOP, BackgroundPipeline, run_routers

BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}
).encode()
REQUESTS = 60


def get(url: str, data: bytes | None = None) -> Any:
    """One request on a connection of its own (the kernel picks a router per connection)."""
    headers = {"Content-Type": "application/json", "Connection": "close"}
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())


def wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def ready(metrics_url: str) -> bool:
    try:
        return bool(get(f"{metrics_url}/v2/health/ready")["ready"])
    except OSError:
        return False


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in doc["model_stats"]}


@pytest.fixture(scope="module")
def three_routers() -> Iterator[tuple[str, str, list[str]]]:
    """`sloline run --routers 3`: (HTTP url, gRPC address, every router's metrics url)."""
    http_port, grpc_port = free_port(), free_port()
    process, urls = run_routers("--port", str(http_port), "--grpc-port", str(grpc_port),
                                "--no-plan", "--no-tuner", "--routers", "3",
                                "--status-interval", "0")  # fmt: skip
    try:
        metrics = [u.removesuffix("/metrics") for u in urls]
        assert len(metrics) == 3, urls
        for url in metrics:
            wait_for(lambda u=url: ready(u), f"{url} to be ready")
        yield f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", metrics
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.communicate(timeout=30)


def test_every_router_reports_the_pipelines_totals(
    three_routers: tuple[str, str, list[str]],
) -> None:
    http, grpc, metrics = three_routers
    for _ in range(REQUESTS):
        assert get(f"{http}/v2/models/noop/infer", BODY)["outputs"]
    # Each router's own counts (its metrics port): the requests spread over all three.
    local = [by_name(get(f"{url}{LOCAL_STATS_PATH}")) for url in metrics]
    served = [doc["noop"]["execution_count"] for doc in local]
    assert sum(served) == REQUESTS and all(served), served
    assert len({get(f"{url}{LOCAL_STATS_PATH}")["router"] for url in metrics}) == 3
    expected = {name: sum(doc[name]["inference_count"] for doc in local) for name in local[0]}
    assert expected == {"noop": REQUESTS, "s1": REQUESTS, "s2": REQUESTS, "s3": REQUESTS}
    success_ns = sum(doc["noop"]["inference_stats"]["success"]["ns"] for doc in local)
    last = max(doc["noop"]["last_inference"] for doc in local)

    # Asked on the shared port, every router answers with the sum.
    for _ in range(12):
        every = by_name(get(f"{http}/v2/models/stats"))
        assert {n: e["inference_count"] for n, e in every.items()} == expected
        pipeline = get(f"{http}/v2/models/noop/stats")["model_stats"][0]
        assert pipeline == every["noop"]
        assert pipeline["execution_count"] == REQUESTS
        assert pipeline["inference_stats"]["success"] == {"count": REQUESTS, "ns": success_ns}
        assert pipeline["last_inference"] == last
        assert [
            (b["batch_size"], b["compute_infer"]["count"]) for b in pipeline["batch_stats"]
        ] == [(1, REQUESTS)]
        (stage,) = get(f"{http}/v2/models/s2/versions/1/stats")["model_stats"]
        assert stage["name"] == "s2" and stage["execution_count"] == every["s2"]["execution_count"]
        assert stage["inference_count"] == REQUESTS

    # gRPC ModelStatistics (a new connection each time, so a new router each time).
    for _ in range(6):
        client = grpcclient.InferenceServerClient(grpc)
        try:
            doc = client.get_inference_statistics("noop", as_json=True)
            stage = client.get_inference_statistics("s3", as_json=True)
        finally:
            client.close()
        (entry,) = doc["model_stats"]
        assert int(entry["execution_count"]) == REQUESTS
        assert int(entry["inference_stats"]["success"]["count"]) == REQUESTS
        assert int(stage["model_stats"][0]["inference_count"]) == REQUESTS


def test_a_peer_that_does_not_answer_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    """A router whose peers are down (nothing listens) and silent (a socket that never
    accepts): its statistics come back with its own counts, in about the peer timeout,
    and each peer is logged once."""
    down = f"127.0.0.1:{free_port()}"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # the kernel completes connections that no one accepts
    silent_at = f"127.0.0.1:{silent.getsockname()[1]}"
    caplog.set_level(logging.WARNING, "sloline.serving.peers")
    server = {"metrics_port": 0, "stats_peers": (down, silent_at)}
    try:
        with BackgroundPipeline(NOOP, server=server) as served:
            http = f"http://{served.http_url}"
            for _ in range(3):
                get(f"{http}/v2/models/noop/infer", BODY)
            for _ in range(2):
                start = time.monotonic()
                (entry,) = get(f"{http}/v2/models/noop/stats")["model_stats"]
                assert time.monotonic() - start < 5.0
                assert entry["execution_count"] == 3
            client = grpcclient.InferenceServerClient(served.grpc_url)
            try:
                doc = client.get_inference_statistics("noop", as_json=True)
            finally:
                client.close()
            assert int(doc["model_stats"][0]["execution_count"]) == 3
    finally:
        silent.close()
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert sorted(
        peer for line in left_out for peer in (down, silent_at) if peer in line
    ) == sorted([down, silent_at])


def test_kubernetes_routers_find_their_peers_by_name(tmp_path: Path) -> None:
    """Two `sloline router`s, each told `--peers` with the same entries naming both
    metrics ports (as the operator names the headless Service), and one worker per stage
    serving both: each answers with both routers' requests."""
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(NOOP.read_text().replace("latencyMs: 100", "latencyMs: 5000"))
    ports = [{k: free_port() for k in ("http", "grpc", "metrics", "worker")} for _ in range(2)]
    peers = ",".join(f"127.0.0.1:{p['metrics']}" for p in ports)
    env = {
        **os.environ,
        "SLOLINE_MODEL_DIR": str(NOOP.parent),
        "SLOLINE_WORKER_TOKEN": "stats-test-token",
    }
    started: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(name: str, *args: str) -> None:
        logs.append(tmp_path / f"{name}.log")
        with logs[-1].open("wb") as log:
            command = [sys.executable, "-m", "sloline", *args]
            started.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))

    try:
        for i, p in enumerate(ports):
            start(f"router-{i}", "router", "--pipeline", str(pipeline),
                  "--port", str(p["http"]), "--grpc-port", str(p["grpc"]),
                  "--metrics-port", str(p["metrics"]), "--worker-port", str(p["worker"]),
                  "--peers", peers)  # fmt: skip
        routers = ",".join(f"127.0.0.1:{p['worker']}" for p in ports)
        for stage in ("s1", "s2", "s3"):
            start(stage, "worker", "--pipeline", str(pipeline), "--stage", stage,
                  "--router", routers, "--health-port", str(free_port()))  # fmt: skip
        for p in ports:
            url = f"http://127.0.0.1:{p['metrics']}"
            wait_for(lambda u=url: ready(u), f"{url} to be ready")
        for p, n in zip(ports, (3, 5), strict=True):
            for _ in range(n):
                get(f"http://127.0.0.1:{p['http']}/v2/models/noop/infer", BODY)
        for p in ports:
            (entry,) = get(f"http://127.0.0.1:{p['http']}/v2/models/noop/stats")["model_stats"]
            assert entry["execution_count"] == 8
            local = get(f"http://127.0.0.1:{p['metrics']}{LOCAL_STATS_PATH}")
            assert by_name(local)["noop"]["execution_count"] in (3, 5)
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{p['grpc']}")
            try:
                doc = client.get_inference_statistics("s2", as_json=True)
            finally:
                client.close()
            assert int(doc["model_stats"][0]["inference_count"]) == 8
    finally:
        for process in started:
            process.kill()
            process.wait(10)
    for log in logs[:2]:
        text = log.read_text(errors="replace")
        assert f"peers   {peers.replace(',', ', ')}" in text  # the start-up banner
        assert "left out" not in text  # no router asks itself


def test_with_tokens_the_client_door_needs_one_and_the_peers_do_not() -> None:
    """Bearer tokens on: statistics on the client door need the token and still count
    both routers (the routers fetch each other's documents on the metrics ports, like a
    Prometheus scrape); the client door does not serve a router's own document."""
    token = "stats-client-token"  # noqa: S105 (a test token)
    with BackgroundPipeline(NOOP, routers=2, server={"auth_tokens": (token,)}) as served:
        http = f"http://{served.http_url}"
        bearer = {"Authorization": f"Bearer {token}", "Connection": "close"}

        def ask(path: str, data: bytes | None = None, headers: dict[str, str] = bearer) -> Any:
            request = urllib.request.Request(f"{http}{path}", data=data, headers=headers)
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())

        for _ in range(20):
            ask("/v2/models/noop/infer", BODY, bearer | {"Content-Type": "application/json"})
        metrics = [served.p.metrics_url] + [r.metrics_url for r in served.p.extra_routers]
        served_by = [
            by_name(get(f"http://{url}{LOCAL_STATS_PATH}"))["noop"]["execution_count"]
            for url in metrics
        ]
        assert sum(served_by) == 20 and all(served_by), served_by
        for _ in range(6):
            assert ask("/v2/models/noop/stats")["model_stats"][0]["execution_count"] == 20
        for path, headers in (
            ("/v2/models/noop/stats", {"Connection": "close"}),
            (LOCAL_STATS_PATH, bearer),
        ):
            with pytest.raises(urllib.error.HTTPError) as refused:
                ask(path, headers=headers)
            assert refused.value.code == (401 if path != LOCAL_STATS_PATH else 404)
