"""Poison requests on the real embedded stack: a request that kills its worker process
(os._exit(1) in a Python stage) fails alone with a 500 naming the stage; the requests it
was batched with are answered correctly, and the pipeline keeps answering while the
backend restarts the workers it killed."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.serve import BackgroundPipeline

POISON = Path(__file__).resolve().parents[1] / "support" / "pipelines" / "poison" / "pipeline.yaml"
MAGIC = 666.0  # poison_stages.MAGIC: the value that kills a `double` worker


def infer(url: str, x: float, timeout_s: float = 60.0) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [x]}]})
    request = urllib.request.Request(
        url, data=body.encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def requeued(served: BackgroundPipeline, stage: str) -> float:
    with urllib.request.urlopen(f"http://{served.http_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(
        rf'^sloline_stage_requeued_items_total\{{pipeline="poison",stage="{stage}"\}} (\S+)$',
        text,
        re.M,
    )
    return float(m.group(1)) if m else 0.0


def test_poison_requests_fail_alone_and_the_pipeline_keeps_answering() -> None:
    """A burst of 40 requests, 3 of them poison, on 2 replicas batching up to 8: each
    poison batch dies twice whole, then is halved until the poison is alone."""
    with BackgroundPipeline(POISON, replicas={"double": 2}) as served:
        url = f"http://{served.http_url}/v2/models/poison/infer"
        values = [float(i) for i in range(40)]
        poison = {3, 17, 30}
        for i in poison:
            values[i] = MAGIC
        start = threading.Barrier(len(values))

        def send(x: float) -> tuple[int, dict[str, Any]]:
            start.wait()
            return infer(url, x)

        with ThreadPoolExecutor(len(values)) as pool:
            results = list(pool.map(send, values))

        failed = {i for i, (code, _) in enumerate(results) if code != 200}
        assert failed == poison, [results[i] for i in sorted(failed | poison)]
        for i, (_, answer) in enumerate(results):
            if i in poison:
                assert "stage 'double'" in answer["error"], answer
                assert "killed its worker" in answer["error"], answer
            else:
                assert answer["outputs"][0]["data"] == [2 * values[i] + 1], (i, answer)
        # The poison shared batches with innocents, which were retried without it.
        assert requeued(served, "double") > len(poison)
        # The pipeline answers right away; the workers the poison killed come back.
        code, answer = infer(url, 20.5, timeout_s=10)
        assert code == 200 and answer["outputs"][0]["data"] == [42.0], answer
        served.call(served.p.wait_ready(30))
        status = served.p.backend_status()["double"]
        assert status.restarts >= 2 * len(poison)
        assert "exited with 1" in status.last_error, status


def test_repeated_poison_does_not_stall_the_stage() -> None:
    """Poison requests one after another crash the stage's one worker twice each; every
    crash is of a worker that was serving, so it is restarted at once, and a good request
    after each poison is answered (no crash-loop back-off stalls the stage)."""
    with BackgroundPipeline(POISON, replicas={"double": 1}) as served:
        url = f"http://{served.http_url}/v2/models/poison/infer"
        for i in range(5):
            code, answer = infer(url, MAGIC)
            assert code == 500, answer
            assert answer["error"] == (
                "stage 'double': this request killed its worker 2 times; it was isolated "
                "(alone in its batch) and failed"
            )
            code, answer = infer(url, float(i), timeout_s=10)
            assert code == 200 and answer["outputs"][0]["data"] == [2.0 * i + 1], (i, answer)
        status = served.p.backend_status()["double"]
        assert status.restarts == 10
        assert "exited with 1" in status.last_error and "restart in" not in status.last_error
