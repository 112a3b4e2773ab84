"""The OIP v2 front doors on real sockets, driven by Triton's own clients.

A fake `DataPlane` ("add_one": y = x + 1 on FP32, plus models that shed load or crash)
sits behind the real REST app (uvicorn) and the real gRPC service (grpc.aio), both on one
event loop in a background thread, the way the router serves them. The stock
`tritonclient.http` / `tritonclient.grpc` clients check readiness, metadata and
inference (JSON and binary); every bad request gets the right status and a message
naming the problem, and the doors keep serving afterwards.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from typing import Any, ClassVar, TypeVar

import grpc
import httpx
import numpy as np
import orjson
import prometheus_client
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import uvicorn
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from sloline.common.tensors import (
    InferRequest,
    InferResponse,
    InvalidInput,
    ModelMetadata,
    ModelNotFound,
    Overloaded,
    Tensor,
    TensorMetadata,
)
from sloline.serving import logs
from sloline.serving.grpc_frontdoor import add_inference_service, server_options
from sloline.serving.http import bind_socket, create_http_app

T = TypeVar("T")
LIMIT_BYTES = 1024 * 1024  # both doors: small enough to test 413 / RESOURCE_EXHAUSTED cheaply
IMAGE = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)  # 602 112 bytes


def _metadata(name: str) -> ModelMetadata:
    x, y = TensorMetadata("x", "FP32", (-1, -1)), TensorMetadata("y", "FP32", (-1, -1))
    return ModelMetadata(name, "sloline_test", ("1",), (x,), (y,))


class FakePlane:
    """`add_one` answers y = x + 1; `busy` sheds load; `crash` raises a bug."""

    models: ClassVar = {name: _metadata(name) for name in ("add_one", "busy", "crash")}

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def check_model(self, name: str, version: str = "") -> None:
        self.model_metadata(name, version)

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.model_metadata(name, version) is not None

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        try:
            metadata = self.models[name]
        except KeyError:
            raise ModelNotFound(f"unknown model {name!r}; serving {sorted(self.models)}") from None
        if version and version not in metadata.versions:
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        return metadata

    async def infer(self, request: InferRequest) -> InferResponse:
        self.check_model(request.model_name, request.model_version)
        if request.model_name == "busy":
            raise Overloaded("queue of stage 'busy' is full", retry_after_s=0.25)
        if request.model_name == "crash":
            raise RuntimeError("boom in the model")
        x = request.inputs.get("x")
        if x is None or len(request.inputs) != 1:
            raise InvalidInput(f"model 'add_one' takes one input 'x', got {sorted(request.inputs)}")
        if x.datatype != "FP32":
            raise InvalidInput(f"input 'x' must be FP32, got {x.datatype}")
        y = Tensor.from_array(x.array() + 1)
        return InferResponse(request.model_name, {"y": y}, request.id)


class FrontDoors:
    """Both doors on one event loop in a background thread (blocking clients in tests)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.registry = prometheus_client.CollectorRegistry()
        self.requests = prometheus_client.Counter("fake_requests", "test", registry=self.registry)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(30)

    async def _start(self) -> None:
        plane = FakePlane()
        self.grpc_server = grpc.aio.server(options=server_options(LIMIT_BYTES))
        add_inference_service(self.grpc_server, plane)
        self.grpc_port = self.grpc_server.add_insecure_port("127.0.0.1:0")
        await self.grpc_server.start()

        sock = bind_socket("127.0.0.1", 0)
        self.http_port = sock.getsockname()[1]
        metrics = prometheus_client.make_asgi_app(self.registry)
        app = create_http_app(plane, max_body_bytes=LIMIT_BYTES, metrics_app=metrics)
        self.http_server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        )
        self.http_task = asyncio.create_task(self.http_server.serve(sockets=[sock]))
        deadline = self.loop.time() + 10
        while not self.http_server.started:  # poll with a deadline, surfacing start errors
            if self.http_task.done():
                self.http_task.result()
            assert self.loop.time() < deadline, "uvicorn did not start within 10 s"
            await asyncio.sleep(0.002)

    async def _stop(self) -> None:
        self.http_server.should_exit = True
        await self.http_task
        await self.grpc_server.stop(grace=None)

    def __enter__(self) -> FrontDoors:
        self.thread.start()
        self.call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def doors() -> Iterator[FrontDoors]:
    with FrontDoors() as served:
        yield served


@pytest.fixture(scope="module")
def http(doors: FrontDoors) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{doors.http_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(doors: FrontDoors) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{doors.grpc_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def raw(doors: FrontDoors) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{doors.http_port}", timeout=10) as client:
        yield client


def http_add_one(client: httpclient.InferenceServerClient, x: np.ndarray, *,
                 binary_in: bool = True, binary_out: bool = True) -> np.ndarray:  # fmt: skip
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary_in)
    output = httpclient.InferRequestedOutput("y", binary_data=binary_out)
    result = client.infer("add_one", [tensor], outputs=[output], request_id="r-1")
    assert result.get_response()["id"] == "r-1"
    y: np.ndarray = result.as_numpy("y")
    return y


def grpc_add_one(client: grpcclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("add_one", [tensor], outputs=[grpcclient.InferRequestedOutput("y")])
    y: np.ndarray = result.as_numpy("y")
    return y


# ------------------------------------------------------------------ REST


def test_http_health_and_metadata(http: httpclient.InferenceServerClient,
                                  raw: httpx.Client) -> None:  # fmt: skip
    assert http.is_server_live()
    assert http.is_server_ready()
    assert http.is_model_ready("add_one")
    assert http.is_model_ready("add_one", model_version="1")
    assert http.get_server_metadata()["name"] == "sloline"
    assert "binary_tensor_data" in http.get_server_metadata()["extensions"]
    assert http.get_model_metadata("add_one") == {
        "name": "add_one", "versions": ["1"], "platform": "sloline_test",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, -1]}],
    }  # fmt: skip
    with pytest.raises(InferenceServerException, match="no version '7'") as info:
        http.get_model_metadata("add_one", model_version="7")
    assert info.value.status() == "404"
    assert not http.is_model_ready("ghost")
    response = raw.get("/v2/models/ghost/ready")
    assert response.status_code == 404
    assert "unknown model 'ghost'" in response.json()["error"]


@pytest.mark.parametrize(("binary_in", "binary_out"), [(True, True), (False, False), (True, False)])
def test_http_infer(http: httpclient.InferenceServerClient, binary_in: bool,
                    binary_out: bool) -> None:  # fmt: skip
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(http_add_one(http, x, binary_in=binary_in,
                                               binary_out=binary_out), x + 1)  # fmt: skip


def test_http_infer_602kb_binary_and_default_outputs(
    http: httpclient.InferenceServerClient,
) -> None:
    image = IMAGE.reshape(3, -1)
    np.testing.assert_array_equal(http_add_one(http, image), image + 1)
    tensor = httpclient.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    result = http.infer("add_one", [tensor], model_version="1")  # no outputs: all, binary
    assert result.get_output("y")["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, 2), 2, np.float32))


def body(data: object = (1.0, 2.0), datatype: str = "FP32", shape: object = (1, 2)) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                     "data": data}]})  # fmt: skip


BAD_HTTP = [
    ("add_one", b'{"inputs": [', 400, "malformed JSON"),
    ("add_one", b'{"id": "1"}', 400, "needs 'inputs'"),
    ("add_one", body(datatype="FP31"), 400, "unsupported datatype 'FP31'"),
    ("add_one", body(data=[1, 2], datatype="INT32"), 400, "input 'x' must be FP32, got INT32"),
    ("add_one", body(data=[1.0, 2.0, 3.0]), 400, "has 3 values but shape [1, 2] needs 2"),
    ("add_one", body(shape=[-1, 2]), 400, "negative dimension"),
    ("add_one", body(data=[1, "two"]), 400, 'non-numeric value "two"'),
    ("ghost", body(), 404, "unknown model 'ghost'"),
    ("ghost", b'{"inputs": [', 404, "unknown model 'ghost'"),
    ("crash", body(), 500, "RuntimeError: boom in the model"),
    ("add_one", b"x" * (LIMIT_BYTES + 1), 413, "over the 1048576-byte limit"),
]


@pytest.mark.parametrize("case", BAD_HTTP, ids=[f"{case[0]}: {case[3]}" for case in BAD_HTTP])
def test_http_bad_requests_name_the_problem(
    raw: httpx.Client, http: httpclient.InferenceServerClient, case: tuple[str, bytes, int, str]
) -> None:
    model, payload, status, message = case
    response = raw.post(f"/v2/models/{model}/infer", content=payload)
    assert response.status_code == status
    assert message in response.json()["error"]
    np.testing.assert_array_equal(http_add_one(http, np.zeros((1, 1), np.float32)), [[1]])


def test_http_overloaded_is_503_with_retry_after(raw: httpx.Client) -> None:
    response = raw.post("/v2/models/busy/infer", content=body())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"  # 0.25 s rounded up to whole seconds
    assert "queue of stage 'busy' is full" in response.json()["error"]


def test_http_oversize_streamed_body_is_413(raw: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the door must count
        for _ in range(3):
            yield b"x" * (LIMIT_BYTES // 2)

    response = raw.post("/v2/models/add_one/infer", content=chunks())
    assert response.status_code == 413
    assert "exceeds the 1048576-byte limit" in response.json()["error"]


def test_http_oversize_via_tritonclient(http: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("x", [1, 2 * LIMIT_BYTES // 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 2 * LIMIT_BYTES // 4), np.float32))
    with pytest.raises(InferenceServerException, match="byte limit") as info:
        http.infer("add_one", [tensor])
    assert info.value.status() == "413"
    assert http.is_server_live()


def test_http_metrics_are_mounted(raw: httpx.Client, doors: FrontDoors) -> None:
    doors.requests.inc()
    response = raw.get("/metrics")
    assert response.status_code == 200
    assert "fake_requests_total 1.0" in response.text


# ------------------------------------------------------------------ gRPC


def test_grpc_health_and_metadata(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready("add_one")
    assert grpc_client.get_server_metadata().name == "sloline"
    metadata = grpc_client.get_model_metadata("add_one", as_json=True)
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "-1"]}]
    assert metadata["versions"] == ["1"]
    with pytest.raises(InferenceServerException, match="unknown model 'ghost'") as info:
        grpc_client.is_model_ready("ghost")
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_grpc_infer(grpc_client: grpcclient.InferenceServerClient) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(grpc_add_one(grpc_client, x), x + 1)
    image = IMAGE.reshape(3, -1)
    np.testing.assert_array_equal(grpc_add_one(grpc_client, image), image + 1)


def grpc_input(datatype: str = "FP32", data: np.ndarray | None = None) -> grpcclient.InferInput:
    data = np.ones((1, 2), np.float32) if data is None else data
    tensor = grpcclient.InferInput("x", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def grpc_short_contents() -> grpcclient.InferInput:
    """Two FP32 values under a shape that needs three: the tensor does not decode."""
    tensor = grpc_input()
    tensor.set_shape([1, 3])
    return tensor


BAD_GRPC = [
    ("add_one", lambda: grpc_input("INT32", np.ones((1, 2), np.int32)), "INVALID_ARGUMENT",
     "input 'x' must be FP32, got INT32"),
    ("add_one", grpc_short_contents, "INVALID_ARGUMENT", "shape [1, 3]"),
    ("ghost", grpc_input, "NOT_FOUND", "unknown model 'ghost'"),
    ("ghost", grpc_short_contents, "NOT_FOUND", "unknown model 'ghost'"),
    ("busy", grpc_input, "UNAVAILABLE", "queue of stage 'busy' is full (retry after 250 ms)"),
    ("crash", grpc_input, "INTERNAL", "RuntimeError: boom in the model"),
    ("add_one", lambda: grpc_input(data=np.zeros((1, LIMIT_BYTES // 4 + 1), np.float32)),
     "RESOURCE_EXHAUSTED", "larger than max"),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD_GRPC, ids=[f"{case[0]}: {case[2]}" for case in BAD_GRPC])
def test_grpc_bad_requests_name_the_problem(
    grpc_client: grpcclient.InferenceServerClient, case: tuple[str, Any, str, str]
) -> None:
    model, make_input, code, message = case
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(model, [make_input()])
    assert info.value.status() == f"StatusCode.{code}"
    assert message in str(info.value.message())
    np.testing.assert_array_equal(grpc_add_one(grpc_client, np.zeros((1, 1), np.float32)), [[1]])


def test_grpc_bad_shape_and_retry_metadata(doors: FrontDoors) -> None:
    """Through Triton's raw stub: shape/data mismatch, and the retry-after-ms trailer."""
    with grpc.insecure_channel(f"127.0.0.1:{doors.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="add_one")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 3])
        request.raw_input_contents.append(b"\0" * 8)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "8 bytes of raw data but FP32 shape [1, 3] needs 12" in info.value.details()

        request.model_name = "busy"
        request.raw_input_contents[0] = b"\0" * 12
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("retry-after-ms", "250") in info.value.trailing_metadata()


def test_http_unknown_route_and_method_are_json_errors(raw: httpx.Client) -> None:
    response = raw.get("/v2/nothing/here")
    assert (response.status_code, response.json()) == (404, {"error": "Not Found"})
    response = raw.get("/v2/models/add_one/infer")
    assert response.status_code == 405
    assert response.json() == {"error": "Method Not Allowed"}
    assert response.headers["allow"] == "POST"


# ------------------------------------------------------------------ request ids, JSON logs


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The JSON log lines the process writes during the test, access log on for all."""
    out = io.StringIO()
    handler = logs.handler("json", out)
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    logs.set_access_sample(1.0)
    yield out
    logs.set_access_sample(0.0)
    root.setLevel(level)
    root.removeHandler(handler)


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


def test_http_request_id_is_returned_and_in_every_log_line(
    raw: httpx.Client, json_log: io.StringIO
) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    response = raw.post("/v2/models/add_one/infer", json=body, headers={"x-request-id": "req-42"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "req-42"
    # No id sent: one is made, returned, and on the log lines of the crash it causes.
    response = raw.post("/v2/models/crash/infer", json=body)
    assert response.status_code == 500
    made = response.headers["x-request-id"]
    assert len(made) == 32
    lines = _lines(json_log)
    access = [line for line in lines if line["logger"] == "sloline.access"]
    assert [(a["request_id"], a["model"], a["status"]) for a in access] == [
        ("req-42", "add_one", 200),
        (made, "crash", 500),
    ]
    (crash,) = [line for line in lines if line["logger"] == "sloline.serving.http"]
    assert crash["request_id"] == made
    assert crash["level"] == "ERROR"
    assert "boom in the model" in crash["exc_info"]


def test_grpc_request_id_is_in_trailing_metadata_and_log_lines(
    doors: FrontDoors, json_log: io.StringIO
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{doors.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="add_one")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
        request.raw_input_contents.append(b"\0" * 4)
        _, call = stub.ModelInfer.with_call(request, metadata=(("x-request-id", "g-7"),))
        assert ("x-request-id", "g-7") in call.trailing_metadata()
        request.model_name = "busy"
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, metadata=(("x-request-id", "g-8"),))
        assert ("x-request-id", "g-8") in info.value.trailing_metadata()
        assert ("retry-after-ms", "250") in info.value.trailing_metadata()
    access = [line for line in _lines(json_log) if line["logger"] == "sloline.access"]
    assert [(a["request_id"], a["door"], a["status"]) for a in access] == [
        ("g-7", "grpc", 200),
        ("g-8", "grpc", 503),
    ]
