"""Property-based fuzz of both front doors against a real router serving a real pipeline
(reciprocal: y = 1 / x on FP32 [-1], one worker process) on 127.0.0.1.

Requests start from a valid one and have any part replaced by something hostile: JSON
and binary-extension bodies, wrong or absurd lengths, shapes, datatypes and parameters
(`timeout_ms` as NaN / infinity / 1e300 / negative / a string / a bool, `priority`),
huge dimensions, unicode and non-UTF-8 names, truncated bodies; on gRPC, raw contents of
mismatched sizes, typed contents, parameters of every ParameterType and BYTES tensors.

Every answer must be one the docs promise (docs/architecture.md, "Failure rules"): 200
with finite outputs, 4xx, 503 overload, 504 deadline, or 500 only for the pipeline's one
documented model failure (a non-finite output). After every example the router holds no
request (its in-flight counter is back to 0), and a correct request is still answered
correctly after the run.
"""

from __future__ import annotations

import json
import math
import select
import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloline.common.tensors import DTYPES
from sloline.serving.proto import grpc_service_pb2 as pb
from tests.support.serve import RECIPROCAL, BackgroundPipeline

EXAMPLES = 150
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
GIVE_UP_S = 10.0
SEEN: dict[str, Counter[Any]] = {"rest": Counter(), "grpc": Counter()}  # answers, by door
# The one 500 the reciprocal pipeline documents: 1 / 0 (or a tiny x) is infinite.
MODEL_FAILURE = "stage 'invert' returned pipeline output 'y' with NaN or infinite values"
REST_OK = {200, 400, 404, 408, 413, 503, 504}
GRPC_OK = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


@pytest.fixture(scope="module")
def served() -> Iterator[BackgroundPipeline]:
    settings = {
        "max_body_bytes": 256 * 1024,
        "max_json_body_bytes": 64 * 1024,
        "header_timeout_s": 1.0,
        "body_timeout_s": 1.0,
    }
    with BackgroundPipeline(RECIPROCAL, server=settings) as pipeline:
        yield pipeline


def _settled(pipeline: BackgroundPipeline) -> None:
    """No request may stay in the router once its answer is out (no leaked slot)."""
    deadline = time.monotonic() + GIVE_UP_S
    while pipeline.p.router.inflight:
        assert time.monotonic() < deadline, f"{pipeline.p.router.inflight} requests leaked"
        time.sleep(0.01)


# ------------------------------------------------------------------------------ values


def mostly(valid: Any, hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` three times in four, else something from `hostile`: each example breaks a
    few parts of a request, so most of them get past the parser to the deeper checks."""
    return st.integers(0, 3).flatmap(lambda i: hostile if i == 3 else st.just(valid))


weird_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1.0, 0.0, 0.001, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.integers(min_value=-(2**70), max_value=2**70),
)
anything = st.recursive(
    st.one_of(st.none(), st.booleans(), weird_numbers, st.text(max_size=6), st.binary(max_size=4)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
names = mostly(
    "x",
    st.sampled_from(["", "y", "X", "x" * 300, "ü", "\u0000", "x\ud800", "💥"])
    | st.text(max_size=4),
)
datatypes = mostly("FP32", st.sampled_from([*DTYPES, "BYTES", "BF16", "fp32", ""]) | anything)
dims = st.one_of(
    st.integers(min_value=-2, max_value=6),
    st.sampled_from([2**31, 2**62, 2**63 - 1, 10**30]),
)
shapes = st.one_of(st.lists(dims, max_size=4), anything)
floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
parameters = st.dictionaries(
    st.sampled_from(["timeout_ms", "priority", "binary_data_output", "sequence_id", "ü"]),
    anything,
    max_size=3,
)


def _to_json(doc: Any) -> bytes:
    """JSON as a careless client writes it: NaN / Infinity literals, binary as latin-1."""

    def default(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.decode("latin-1")
        raise TypeError

    return json.dumps(doc, allow_nan=True, default=default).encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------------------ REST


@st.composite
def rest_requests(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(head, body) of one POST; the body may be truncated or not match its headers."""
    values = draw(st.lists(floats32, min_size=0, max_size=6))
    binary = draw(st.booleans())
    tensor: dict[str, Any] = {
        "name": draw(names),
        "datatype": draw(datatypes),
        "shape": draw(mostly([len(values)], st.just([1, len(values)]) | shapes)),
    }
    raw = np.array(values, np.float32).tobytes()
    if binary:
        raw = draw(mostly(raw, st.binary(max_size=40)))
        size = draw(mostly(len(raw), anything))
        tensor["parameters"] = {"binary_data_size": size}
    else:
        tensor["data"] = draw(mostly(values, anything))
    doc: dict[str, Any] = {"inputs": draw(mostly([tensor], anything))}
    if draw(st.booleans()):
        doc["parameters"] = draw(parameters)
    if draw(st.booleans()):
        doc["outputs"] = draw(mostly([{"name": "y"}], anything))
    header = draw(
        mostly(
            _to_json(doc),
            st.binary(max_size=30) | st.just(_to_json(doc)[:-3]),  # not JSON, not UTF-8
        )
    )
    body = header + raw if binary else header
    lines = [b"POST " + draw(_paths) + b" HTTP/1.1", b"Host: fuzz"]
    if binary:
        length = draw(
            mostly(
                str(len(header)).encode(),
                st.sampled_from([b"0", b"-1", b"abc", b"99999999999999999999", b""])
                | st.integers(0, len(body) + 5).map(lambda n: str(n).encode()),
            )
        )
        lines.append(b"Inference-Header-Content-Length: " + length)
    declared = draw(mostly(len(body), st.integers(0, len(body) + 10)))
    lines.append(b"Content-Length: %d" % declared)
    if draw(st.integers(0, 7)) == 7:
        body = body[: draw(st.integers(0, len(body)))]  # truncated
    return b"\r\n".join(lines) + b"\r\n\r\n", body


_paths = mostly(
    b"/v2/models/reciprocal/infer",
    st.sampled_from(
        [
            b"/v2/models/reciprocal/versions/1/infer",
            b"/v2/models/reciprocal/versions/2/infer",
            b"/v2/models/ghost/infer",
            b"/v2/models/%C3%BC/infer",
            b"/v2/models/\xff\xfe/infer",
            b"/v2/models//infer",
        ]
    ),
)


def _exchange(url: str, head: bytes, body: bytes) -> tuple[int, bytes] | None:
    """Send one request; the status and body of the answer, or None when the server
    closed without one (the client ended its half of the connection mid-body)."""
    host, port = url.rsplit(":", 1)
    declared = _content_length(head) or 0
    with socket.create_connection((host, int(port)), timeout=GIVE_UP_S) as sock:
        try:
            sock.sendall(head + body)
            if len(body) < declared:
                sock.shutdown(socket.SHUT_WR)  # a truncated body: the client gives up
        except OSError:
            pass
        data = b""
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            assert time.monotonic() < deadline, f"no answer and no close; got {data!r}"
            if not select.select([sock], [], [], 0.1)[0]:
                continue
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            data += chunk
            head_end = data.find(b"\r\n\r\n")
            if head_end >= 0:
                length = _content_length(data[:head_end])
                if length is not None and len(data) >= head_end + 4 + length:
                    break
    if not data:
        return None
    status = int(data.split(b" ", 2)[1])
    return status, data[data.find(b"\r\n\r\n") + 4 :]


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return None


def _check_rest_answer(answer: tuple[int, bytes] | None) -> None:
    SEEN["rest"][None if answer is None else answer[0]] += 1
    if answer is None:
        return
    status, body = answer
    text = body.decode("utf-8", "replace")
    if status == 500:
        assert MODEL_FAILURE in text, f"an undocumented 500: {text}"
    else:
        assert status in REST_OK, f"status {status}: {text}"
    if status == 200 and body.lstrip().startswith(b"{"):
        outputs = json.loads(body)["outputs"]  # binary answers carry a header first
        for output in outputs:
            assert None not in output.get("data", []), output


@FUZZ
@given(request=rest_requests())
def test_fuzz_rest(served: BackgroundPipeline, request: tuple[bytes, bytes]) -> None:
    head, body = request
    _check_rest_answer(_exchange(served.http_url, head, body))
    _settled(served)


# ------------------------------------------------------------------------------ gRPC

int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_CONTENT_FIELDS = [
    "fp64_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "bool_contents",
    "bytes_contents",
]
_PARAMETER_NAMES = ["timeout_ms", "priority", "binary_data_output", "ü", ""]


@st.composite
def parameters_pb(draw: st.DrawFn, message: Any) -> None:
    """Fill `message.parameters` with values of every ParameterType."""
    for key in draw(st.lists(st.sampled_from(_PARAMETER_NAMES), max_size=3)):
        param = message.parameters[key]
        kind = draw(st.sampled_from(["bool", "int64", "string", "double", "uint64", "unset"]))
        if kind == "bool":
            param.bool_param = draw(st.booleans())
        elif kind == "int64":
            param.int64_param = draw(int64s)
        elif kind == "string":
            param.string_param = draw(st.text(max_size=5))
        elif kind == "double":
            param.double_param = draw(
                st.one_of(st.floats(), st.sampled_from([math.nan, math.inf, 1e300, -1.0]))
            )
        elif kind == "uint64":
            param.uint64_param = draw(st.integers(min_value=0, max_value=2**64 - 1))


@st.composite
def grpc_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(
        model_name=draw(mostly("reciprocal", st.sampled_from(["", "ghost", "ü"]))),
        model_version=draw(mostly("", st.sampled_from(["1", "2"]))),
        id=draw(st.text(max_size=4)),
    )
    raw = draw(st.booleans())
    for _ in range(draw(mostly(1, st.sampled_from([0, 2])))):
        values = draw(st.lists(floats32, max_size=6))
        datatype = draw(mostly("FP32", st.sampled_from([*DTYPES, "BYTES", ""])))
        shape = draw(
            mostly([len(values)], st.just([1, len(values)]) | st.lists(int64s, max_size=3))
        )
        name = draw(names).encode("utf-8", "replace").decode("utf-8")
        tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
        if raw:
            data = np.array(values, np.float32).tobytes()
            message.raw_input_contents.append(draw(mostly(data, st.binary(max_size=40))))
        else:
            field = draw(mostly("fp32_contents", st.sampled_from(_CONTENT_FIELDS)))
            _fill(getattr(tensor.contents, field), field, values, draw)
        if draw(st.booleans()):
            draw(parameters_pb(tensor))
    if raw and draw(mostly(False, st.just(True))):
        message.raw_input_contents.append(draw(st.binary(max_size=8)))  # one too many
    draw(parameters_pb(message))
    for name in draw(st.lists(st.sampled_from(["y", "x", ""]), max_size=2)):
        message.outputs.add(name=name)
    return message


def _fill(field: Any, kind: str, values: list[float], draw: st.DrawFn) -> None:
    if kind in ("fp32_contents", "fp64_contents"):
        field.extend(draw(mostly(values, st.lists(st.floats(), max_size=4))))
    elif kind == "bool_contents":
        field.extend(draw(st.lists(st.booleans(), max_size=4)))
    elif kind == "bytes_contents":
        field.extend(draw(st.lists(st.binary(max_size=4), max_size=3)))
    elif kind in ("uint_contents",):
        field.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=4)))
    elif kind == "uint64_contents":
        field.extend(draw(st.lists(st.integers(0, 2**64 - 1), max_size=4)))
    elif kind == "int_contents":
        field.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4)))
    else:
        field.extend(draw(st.lists(int64s, max_size=4)))


@pytest.fixture(scope="module")
def channel(served: BackgroundPipeline) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.grpc_url) as opened:
        yield opened


def _model_infer(channel: grpc.Channel) -> Any:
    return channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )


@FUZZ
@given(message=grpc_requests())
def test_fuzz_grpc(
    served: BackgroundPipeline, channel: grpc.Channel, message: pb.ModelInferRequest
) -> None:
    try:
        response = _model_infer(channel)(message, timeout=GIVE_UP_S)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        SEEN["grpc"][code.name] += 1
        if code == grpc.StatusCode.INTERNAL:
            assert MODEL_FAILURE in details, f"an undocumented INTERNAL: {details}"
        else:
            assert code in GRPC_OK, f"{code.name}: {details}"
    else:
        SEEN["grpc"]["OK"] += 1
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            assert np.isfinite(np.frombuffer(raw, np.float32)).all(), output
    _settled(served)


def test_still_answers_correctly_after_the_fuzz(
    served: BackgroundPipeline, channel: grpc.Channel
) -> None:
    """Run last in this module: both doors still serve a correct request correctly."""
    body = _to_json(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [2.0, 4.0]}]}
    )
    head = b"POST /v2/models/reciprocal/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
    answer = _exchange(served.http_url, head % len(body), body)
    assert answer is not None and answer[0] == 200
    assert json.loads(answer[1])["outputs"][0]["data"] == [0.5, 0.25]
    message = pb.ModelInferRequest(model_name="reciprocal")
    message.inputs.add(name="x", datatype="FP32", shape=[2])
    message.raw_input_contents.append(np.array([2.0, 4.0], np.float32).tobytes())
    response = _model_infer(channel)(message, timeout=GIVE_UP_S)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [0.5, 0.25]
    assert served.p.router.inflight == 0
    # The fuzz reached the pipeline and its checks, not just the parsers.
    if SEEN["rest"]:
        assert {200, 400} <= set(SEEN["rest"]), SEEN["rest"]
    if SEEN["grpc"]:
        assert {"OK", "INVALID_ARGUMENT"} <= set(SEEN["grpc"]), SEEN["grpc"]


@pytest.mark.parametrize("timeout_ms", [math.nan, math.inf])
def test_non_finite_timeout_ms_is_invalid(channel: grpc.Channel, timeout_ms: float) -> None:
    """Found by the fuzz: gRPC's double parameters carry NaN and infinity (JSON cannot)."""
    message = pb.ModelInferRequest(model_name="reciprocal")
    message.inputs.add(name="x", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.array([2.0], np.float32).tobytes())
    message.parameters["timeout_ms"].double_param = timeout_ms
    with pytest.raises(grpc.RpcError) as caught:
        _model_infer(channel)(message, timeout=GIVE_UP_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_ms" in (caught.value.details() or "")
