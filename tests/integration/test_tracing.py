"""Request traces, exported with OTLP to a real OTLP/gRPC receiver.

`sloline run` serves the digits-cascade example with `--otlp-endpoint` pointing at an
OTLP TraceService (opentelemetry-proto's generated service) on loopback; requests sent
with a W3C `traceparent` (HTTP header, gRPC metadata) come back as span trees in the
client's trace: the front door's server span, and under it one span per stage visited,
with the cascade's `accurate` stage only for the images the fast model is unsure about,
and one span per batch the stage's worker ran for it, exported by the worker process
(its trace context crossed the worker channel in the batch message).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.integration.test_examples_served import digits_module, wait_ready  # noqa: F401
from tests.support.net import free_port
from tests.support.serve import EXAMPLES

otlp = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc")
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402

SERVER, INTERNAL, CONSUMER = 2, 1, 5  # opentelemetry.proto.trace.v1.Span.SpanKind
SLACK_NS = 1_000_000  # router and worker convert their clocks to epoch time separately


class Receiver(otlp.TraceServiceServicer):  # type: ignore[misc]
    """Collects every span exported to it."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []  # (service name, Span)
        self.lock = threading.Lock()

    def Export(self, request, _context):  # noqa: N802 (the OTLP method)
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    self.spans += [(service, span) for span in scope_spans.spans]
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[object]:
        with self.lock:
            return [span for _, span in self.spans if span.trace_id.hex() == trace_id]


def _attrs(span) -> dict[str, object]:
    out = {}
    for a in span.attributes:
        value = a.value
        out[a.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_cascade_request_traces_join_the_clients_trace(digits_module, tmp_path: Path) -> None:  # noqa: F811
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    otlp.add_TraceServiceServicer_to_server(receiver, server)
    otlp_port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    x_test, _ = digits_module.labelled_test_split()
    fast = ort.InferenceSession(str(EXAMPLES / "digits-cascade" / "models" / "fast.onnx"))
    top = fast.run(None, {"features": digits_module.scale(x_test)})[-1].max(axis=1)
    sure, unsure = int(np.argmax(top >= 0.9)), int(np.argmax(top < 0.9))
    assert top[sure] >= 0.9 > top[unsure]

    http_port, grpc_port = free_port(), free_port()
    env = {"OTEL_SERVICE_NAME": "digits-test", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    process = subprocess.Popen(
        [sys.executable, "-m", "sloline", "run", str(EXAMPLES / "digits-cascade" / "pipeline.yaml"),
         "--port", str(http_port), "--grpc-port", str(grpc_port), "--no-plan",
         "--status-interval", "0", "--otlp-endpoint", f"http://127.0.0.1:{otlp_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **env},
    )  # fmt: skip
    traces = {}  # trace id -> (row, door)
    try:
        wait_ready(f"127.0.0.1:{http_port}", process, timeout_s=120)
        url = f"http://127.0.0.1:{http_port}/v2/models/digits-cascade/infer"
        for n, row in enumerate((sure, unsure)):
            trace_id = f"{n + 1:032x}"
            body = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                "data": x_test[row].tolist()}]}  # fmt: skip
            traceparent = f"00-{trace_id}-{n + 1:016x}-01"
            response = httpx.post(url, json=body, headers={"traceparent": traceparent}, timeout=10)
            assert response.status_code == 200, response.text
            traces[trace_id] = (row, "http")

        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        pixels = grpcclient.InferInput("pixels", [1, 64], "FP32")
        pixels.set_data_from_numpy(x_test[unsure][None].astype(np.float32))
        trace_id = f"{3:032x}"
        client.infer(
            "digits-cascade", [pixels], headers={"traceparent": f"00-{trace_id}-{3:016x}-01"}
        )
        client.close()
        traces[trace_id] = (unsure, "grpc")

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
            len(receiver.trace(t)) >= 1 + 2 * (3 + (row == unsure))
            for t, (row, _) in traces.items()
        ):
            time.sleep(0.05)
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
        server.stop(None)
    assert process.returncode == 0, output

    assert {service for service, _ in receiver.spans} == {"digits-test"}
    for trace_id, (row, door) in traces.items():
        spans = receiver.trace(trace_id)
        (root,) = [s for s in spans if s.kind == SERVER]
        client_span = int(trace_id, 16)
        assert root.parent_span_id == client_span.to_bytes(8, "big")  # the client's span
        assert root.name == (
            "POST /v2/models/{name}/infer" if door == "http"
            else "inference.GRPCInferenceService/ModelInfer"
        )  # fmt: skip
        stages = {s.name: s for s in spans if s.kind == INTERNAL}
        workers = {s.name: s for s in spans if s.kind == CONSUMER}
        assert len(stages) + len(workers) + 1 == len(spans)
        expected = {"preprocess", "fast", "combine"} | ({"accurate"} if row == unsure else set())
        assert set(stages) == {f"stage {s}" for s in expected}, (door, row, sorted(stages))
        assert set(workers) == {f"worker {s}" for s in expected}, (door, row, sorted(workers))
        for stage in expected:  # the worker's model execution, within the stage visit
            visit, batch = stages[f"stage {stage}"], workers[f"worker {stage}"]
            assert batch.parent_span_id == root.span_id
            assert [link.span_id for link in batch.links] == [root.span_id]
            assert batch.links[0].trace_id == root.trace_id
            assert visit.start_time_unix_nano - SLACK_NS <= batch.start_time_unix_nano
            assert batch.start_time_unix_nano <= batch.end_time_unix_nano
            assert batch.end_time_unix_nano <= visit.end_time_unix_nano + SLACK_NS
            attrs = _attrs(batch)
            assert attrs["sloline.stage"] == stage and attrs["sloline.batch_size"] == 1
            assert attrs["sloline.service_s"] > 0 and attrs["sloline.worker"]
        for span in stages.values():
            assert span.parent_span_id == root.span_id
            assert root.start_time_unix_nano <= span.start_time_unix_nano
            assert span.start_time_unix_nano <= span.end_time_unix_nano <= root.end_time_unix_nano
            attrs = _attrs(span)
            assert attrs["sloline.batch_size"] >= 1
            assert attrs["sloline.queue_wait_s"] >= 0
            assert attrs["sloline.service_s"] > 0
            assert attrs["sloline.worker"]
        assert (
            stages["stage fast"].start_time_unix_nano
            >= stages["stage preprocess"].end_time_unix_nano
        )
