"""Failure handling on the real embedded stack: bad input is a 4xx naming the problem,
a crashed worker's batch is retried once then failed explicitly, kill -9 under load loses
and duplicates nothing, overload sheds with 503, and /metrics counts every request."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sloline.serving.router import RouterSettings
from tests.support.serve import NOOP, BackgroundPipeline


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def infer_body(
    x: list[float], name: str = "x", datatype: str = "FP32", shape: list[int] | None = None
) -> bytes:
    return json.dumps(
        {"inputs": [{"name": name, "datatype": datatype, "shape": shape or [len(x)], "data": x}]}
    ).encode()


@pytest.fixture(scope="module")
def noop():
    with BackgroundPipeline(NOOP, max_batch={"s1": 8, "s2": 8, "s3": 8}) as served:
        yield served


def test_bad_input_is_4xx_naming_the_problem(noop: BackgroundPipeline) -> None:
    base = f"http://{noop.http_url}/v2/models"
    cases = [
        (f"{base}/noop/infer", b"{not json", 400, "json"),
        (f"{base}/noop/infer", infer_body([1.0], name="y"), 400, "'y'"),
        (f"{base}/noop/infer", infer_body([1], datatype="INT32"), 400, "datatype"),
        (f"{base}/noop/infer", infer_body([1.0, 2.0], shape=[2, 1, 1]), 400, "shape"),
        (f"{base}/noop/infer", infer_body([1.0, 2.0], shape=[3]), 400, "3"),
        (f"{base}/ghost/infer", infer_body([1.0]), 404, "ghost"),
    ]
    for url, body, status, needle in cases:
        code, payload = post(url, body)
        assert code == status, (body, payload)
        assert needle.lower() in payload["error"].lower(), payload
    code, payload = post(f"{base}/noop/infer", infer_body([1.0, 2.0]))
    assert code == 200 and payload["outputs"][0]["data"] == [1.0, 2.0]


def test_workers_run_below_the_routers_priority(noop: BackgroundPipeline) -> None:
    """Every thread of every worker is niced WORKER_NICE above the router, in the
    router's session (a per-session autogroup would undo the nice) and its own process
    group (a Ctrl-C in the terminal reaches only the router)."""
    from sloline.backends.local import WORKER_NICE

    router_nice = os.getpriority(os.PRIO_PROCESS, 0)
    for stage in ("s1", "s2", "s3"):
        for pid in noop.p.backend.pids(stage):
            for tid in os.listdir(f"/proc/{pid}/task"):
                nice = int(
                    Path(f"/proc/{pid}/task/{tid}/stat").read_text().split(")")[1].split()[16]
                )
                assert nice == min(19, router_nice + WORKER_NICE), (stage, tid)
            assert os.getsid(pid) == os.getsid(0)
            assert os.getpgid(pid) == pid


def test_oversize_body_is_413_and_server_keeps_serving(tmp_path: Path) -> None:
    with BackgroundPipeline(NOOP, max_body_bytes=100_000) as served:
        url = f"http://{served.http_url}/v2/models/noop/infer"
        code, payload = post(url, infer_body([0.5] * 50_000))
        assert code == 413 and "100000" in payload["error"]
        assert post(url, infer_body([1.0]))[0] == 200


def test_grpc_bad_input_and_unknown_model(noop: BackgroundPipeline) -> None:
    client = grpcclient.InferenceServerClient(noop.grpc_url)
    good = grpcclient.InferInput("x", [3], "FP32")
    good.set_data_from_numpy(np.ones(3, np.float32))
    with pytest.raises(InferenceServerException, match="ghost"):
        client.infer("ghost", [good])
    wrong = grpcclient.InferInput("x", [3], "INT32")
    wrong.set_data_from_numpy(np.ones(3, np.int32))
    with pytest.raises(InferenceServerException, match="datatype"):
        client.infer("noop", [wrong])
    assert client.infer("noop", [good]).as_numpy("x").tolist() == [1.0, 1.0, 1.0]


def test_metrics_names_and_histogram_count(noop: BackgroundPipeline) -> None:
    client = httpclient.InferenceServerClient(noop.http_url)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{noop.http_url}/metrics", timeout=10) as r:
            return r.read().decode()

    def served_count(text: str) -> float:
        m = re.search(
            r'^sloline_request_latency_seconds_count\{pipeline="noop"\} (\S+)$', text, re.M
        )
        return float(m.group(1)) if m else 0.0

    def ok_count(text: str) -> float:
        m = re.search(r'^sloline_requests_total\{code="200",pipeline="noop"\} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    before = scrape()
    x = httpclient.InferInput("x", [4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32))
    for _ in range(25):
        client.infer("noop", [x])
    text = scrape()
    assert served_count(text) - served_count(before) == 25
    assert served_count(text) == ok_count(text)
    for name in [
        "sloline_requests_total",
        "sloline_request_latency_seconds_bucket",
        "sloline_slo_miss_total",
        "sloline_arrival_envelope_requests_per_second",
        "sloline_arrival_envelope_window_seconds",
        "sloline_request_admission_seconds_bucket",
        "sloline_stage_queue_length",
        "sloline_stage_queue_wait_seconds_bucket",
        "sloline_stage_batch_size_bucket",
        "sloline_stage_service_seconds_bucket",
        "sloline_stage_replicas",
        "sloline_stage_cost_per_hour",
    ]:
        assert re.search(rf"^{name}\{{", text, re.M), f"{name} missing from /metrics"

    def total(family: str, text: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{family}\{{[^}}]*\}} (\S+)$", text, re.M))

    stages = len(noop.p.router.queues)
    # Every request is admitted once and queued once per stage.
    assert (
        total("sloline_request_admission_seconds_count", text)
        - total("sloline_request_admission_seconds_count", before)
        == 25
    )
    assert (
        total("sloline_stage_queue_wait_seconds_count", text)
        - total("sloline_stage_queue_wait_seconds_count", before)
        == 25 * stages
    )
    for created in ("sloline_requests_created", "sloline_stage_queue_wait_seconds_created"):
        assert re.search(rf"^{created}\{{", text, re.M), f"{created} missing from /metrics"
    for default in ("process_cpu_seconds_total", "python_info"):
        assert re.search(rf"^{default}[{{ ]", text, re.M), f"{default} missing from /metrics"


def test_worker_crash_retried_once_then_failed_explicitly() -> None:
    with BackgroundPipeline(NOOP.parent / "crashy.yaml", replicas={"s2": 2}) as served:
        client = httpclient.InferenceServerClient(served.http_url)
        poison = httpclient.InferInput("x", [2], "FP32")
        poison.set_data_from_numpy(np.array([-1.0, 0.0], np.float32))
        with pytest.raises(InferenceServerException, match="killed its worker 2 times"):
            client.infer("crashy", [poison], timeout=30)
        served.call(served.p.wait_ready(30))  # both crashed workers are replaced
        good = httpclient.InferInput("x", [2], "FP32")
        good.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        assert client.infer("crashy", [good]).as_numpy("x").tolist() == [1.0, 2.0]
        huge = httpclient.InferInput("x", [1], "FP32")
        huge.set_data_from_numpy(np.array([1e10], np.float32))
        with pytest.raises(InferenceServerException, match="too large for this model"):
            client.infer("crashy", [huge])
        assert served.p.backend.status()["s2"].restarts == 2


def test_kill_9_under_load_loses_and_duplicates_nothing() -> None:
    with BackgroundPipeline(
        NOOP,
        replicas={"s2": 2},
        max_batch={"s2": 4},
        router=RouterSettings(deadline_factor=100, admission_factor=100),
    ) as served:
        client = grpcclient.InferenceServerClient(served.grpc_url)
        answers: Counter[str] = Counter()
        errors: list[str] = []
        stop = threading.Event()
        sent = Counter()

        def load(worker: int) -> None:
            i = 0
            while not stop.is_set() and i < 2000:
                x = grpcclient.InferInput("x", [2], "FP32")
                value = np.array([worker, i], np.float32)
                x.set_data_from_numpy(value)
                rid = f"{worker}-{i}"
                sent[rid] += 1
                try:
                    out = client.infer("noop", [x], request_id=rid)
                    assert out.as_numpy("x").tolist() == value.tolist()
                    assert out.get_response().id == rid
                    answers[rid] += 1
                except InferenceServerException as exc:
                    errors.append(str(exc))
                    answers[rid] += 1
                i += 1

        def answered(count: int, what: str) -> None:
            deadline = time.monotonic() + 60  # only against a hang
            while len(answers) < count:
                assert time.monotonic() < deadline, f"{what}: {len(answers)} answered"
                time.sleep(0.01)

        threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        answered(60, "load before the kill")
        victim = served.p.backend.pids("s2")[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while served.p.backend.status()["s2"].restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        served.call(served.p.wait_ready(30))
        answered(len(answers) + 60, "load after the restart")
        stop.set()
        for t in threads:
            t.join(60)
        assert sum(sent.values()) > 100
        assert answers == sent, "every request answered exactly once"
        assert all("killed its worker" in e for e in errors), errors[:3]
        assert len(errors) <= 8, "at most the killed worker's batch may fail"
        assert served.p.backend.status()["s2"].restarts == 1
        assert victim not in served.p.backend.pids("s2")


def test_overload_sheds_with_503_and_retry_hint() -> None:
    settings = RouterSettings(queue_capacity=4, max_inflight=8, deadline_factor=100)
    with BackgroundPipeline(NOOP, router=settings) as served:
        url = f"http://{served.http_url}/v2/models/noop/infer"
        results: list[tuple[int, dict]] = []
        lock = threading.Lock()

        def fire() -> None:
            r = post(url, infer_body([0.5] * 100_000))
            with lock:
                results.append(r)

        threads = [threading.Thread(target=fire) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        codes = Counter(code for code, _ in results)
        assert codes[503] > 0 and codes[200] > 0, codes
        assert set(codes) <= {200, 503}
        assert all("retry" in p["error"] for c, p in results if c == 503)
        assert post(url, infer_body([1.0]))[0] == 200
