"""Front-door limits on a real router (reciprocal pipeline, y = 1 / x, one worker): slow
or idle clients are cut off while others are served, connection floods are refused
cleanly and service resumes, big JSON bodies are refused before they are read, and
NaN / infinity is answered the same way on REST and gRPC.

The limits are small here (2 s timeouts) so every case finishes in a few seconds; the
assertions are about what the client sees (a 408, a 413, a closed socket), with loose
time bounds only so that a missing limit fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from sloline.serving.server import ServerSettings
from tests.support.serve import RECIPROCAL, BackgroundPipeline

TIMEOUT_S = 2.0  # header, body and (half of it) keep-alive timeouts of the `served` router
JSON_LIMIT = 64 * 1024
BODY_LIMIT = 1024 * 1024
BUFFERED_LIMIT = 400 * 1024  # all bodies at once
GIVE_UP_S = 15.0  # a limit that is missing fails the test instead of hanging it
INFER = "/v2/models/reciprocal/infer"


@pytest.fixture(scope="module")
def served() -> Iterator[BackgroundPipeline]:
    settings = {
        "max_body_bytes": BODY_LIMIT,
        "max_json_body_bytes": JSON_LIMIT,
        "header_timeout_s": TIMEOUT_S,
        "body_timeout_s": TIMEOUT_S,
        "keepalive_timeout_s": TIMEOUT_S / 2,
        "max_buffered_body_bytes": BUFFERED_LIMIT,
    }
    with BackgroundPipeline(RECIPROCAL, server=settings) as pipeline:
        yield pipeline


def _address(url: str) -> tuple[str, int]:
    host, port = url.rsplit(":", 1)
    return host, int(port)


def _connect(url: str) -> socket.socket:
    sock = socket.create_connection(_address(url), timeout=GIVE_UP_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _json_body(values: list[float]) -> bytes:
    tensor = {"name": "x", "datatype": "FP32", "shape": [len(values)], "data": values}
    return json.dumps({"inputs": [tensor]}).encode()


def _head(length: int, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n" % (
        INFER.encode(),
        length,
        extra,
    )


def _read_response(sock: socket.socket) -> tuple[int, dict[str, Any], bytes]:
    """(status, JSON body, raw head) of one response on `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response; got {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-response"
        rest += chunk
    return int(head.split(b" ", 2)[1]), json.loads(rest[:length]), head


def _post(url: str, body: bytes, extra: bytes = b"") -> tuple[int, dict[str, Any]]:
    with _connect(url) as sock:
        sock.sendall(_head(len(body), extra) + body)
        status, doc, _ = _read_response(sock)
        return status, doc


def _closed_by_server(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes `sock` (fails after GIVE_UP_S)."""
    received = b""
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.1)[0]:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk
    raise AssertionError(f"the server kept the connection open; it sent {received!r}")


def test_slowloris_headers_are_cut_off_while_others_are_served(
    served: BackgroundPipeline,
) -> None:
    request = _head(10) + b"x" * 10
    sock = _connect(served.http_url)
    sent = 0
    answer = b""
    deadline = time.monotonic() + GIVE_UP_S
    with sock:
        while time.monotonic() < deadline:
            try:
                sock.send(request[sent % len(request) : sent % len(request) + 1])
            except OSError:
                break
            sent += 1
            if sent == 2:  # the trickle is under way: others are served meanwhile
                assert _post(served.http_url, _json_body([2.0, 4.0])) == (
                    200,
                    {
                        "model_name": "reciprocal",
                        "outputs": [
                            {"name": "y", "datatype": "FP32", "shape": [2], "data": [0.5, 0.25]}
                        ],
                    },
                )
            if select.select([sock], [], [], 0.1)[0]:
                answer = _closed_by_server(sock)
                break
        else:
            raise AssertionError("a connection trickling its headers was never closed")
    assert sent < len(request), "the whole request went through a byte at a time"
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"headers not received within %gs" % TIMEOUT_S in answer


def test_a_silent_connection_is_closed(served: BackgroundPipeline) -> None:
    with _connect(served.http_url) as sock:
        assert _closed_by_server(sock).startswith(b"HTTP/1.1 408 ")


def test_trickled_body_gets_408_and_leaks_nothing(served: BackgroundPipeline) -> None:
    body = _json_body([1.0, 2.0])
    with _connect(served.http_url) as sock:
        sock.sendall(_head(len(body)) + body[:1])
        answer = b""
        for byte in body[1:]:
            if select.select([sock], [], [], 0.1)[0]:
                answer = _closed_by_server(sock)
                break
            sock.send(bytes([byte]))
        else:
            answer = _closed_by_server(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"body not received within %gs" % TIMEOUT_S in answer
    assert served.p.router.inflight == 0
    assert _post(served.http_url, _json_body([2.0]))[0] == 200


def test_idle_keep_alive_connection_is_closed(served: BackgroundPipeline) -> None:
    with _connect(served.http_url) as sock:
        body = _json_body([4.0])
        sock.sendall(_head(len(body)) + body)
        assert _read_response(sock)[0] == 200
        assert _closed_by_server(sock) == b""


def test_over_limit_json_body_is_413_before_it_is_read(served: BackgroundPipeline) -> None:
    declared = 50 * 1024 * 1024
    with _connect(served.http_url) as sock:
        sock.sendall(_head(declared) + b'{"inputs": [' + b"0" * 60_000)
        status, doc, _ = _read_response(sock)
    assert status == 413
    assert f"{JSON_LIMIT}-byte limit for JSON" in doc["error"]
    assert "binary tensor extension" in doc["error"]
    # A JSON header beyond the JSON limit is refused the same way with the extension.
    extra = b"Inference-Header-Content-Length: %d\r\n" % (JSON_LIMIT + 1)
    with _connect(served.http_url) as sock:
        sock.sendall(_head(JSON_LIMIT + 100, extra) + b"{")
        status, doc, _ = _read_response(sock)
    assert status == 413 and "Inference-Header-Content-Length" in doc["error"]
    # The binary extension carries what JSON may not, up to max_body_bytes.
    x = np.full(JSON_LIMIT // 2, 2.0, np.float32)  # 128 KiB raw, ~2x the JSON limit
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [x.size],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    extra = b"Inference-Header-Content-Length: %d\r\n" % len(header)
    status, doc = _post(served.http_url, header + x.tobytes(), extra)
    assert status == 200 and doc["outputs"][0]["data"][:2] == [0.5, 0.5]


def _binary_request(values: np.ndarray, binary_output: bool = False) -> tuple[bytes, bytes]:
    """(extra headers, body) of a binary-extension request for `values` (FP32)."""
    tensor = {
        "name": "x",
        "datatype": "FP32",
        "shape": [values.size],
        "parameters": {"binary_data_size": values.nbytes},
    }
    doc = {"inputs": [tensor], "parameters": {"binary_data_output": binary_output}}
    header = json.dumps(doc).encode()
    return b"Inference-Header-Content-Length: %d\r\n" % len(header), header + values.tobytes()


def test_bodies_held_at_once_are_capped(served: BackgroundPipeline) -> None:
    """Bodies being received count toward `max_buffered_body_bytes` from their
    Content-Length: a second large one is 503 before it is read, and once the first is
    answered its bytes are free again."""
    extra, body = _binary_request(np.full(60_000, 2.0, np.float32))  # 240 KB each
    first = _connect(served.http_url)
    with first:
        first.sendall(_head(len(body), extra) + body[:1000])  # announced, not all sent
        _until(lambda: _post(served.http_url, body, extra)[0] == 503, "no 503 over the cap")
        status, doc = _post(served.http_url, body, extra)
        assert status == 503 and "max_buffered_body_bytes" in doc["error"], doc
        first.sendall(body[1000:])
        status, doc, _ = _read_response(first)
        assert status == 200 and doc["outputs"][0]["data"][:1] == [0.5]
    status, doc = _post(served.http_url, body, extra)
    assert status == 200, doc


def _grpc_infer(url: str, raw: bytes | None = None, fp32: list[float] | None = None) -> str:
    """The gRPC status and message for one x input sent raw or as typed contents."""
    values = np.frombuffer(raw, np.float32) if raw is not None else np.array(fp32, np.float32)
    request = service_pb2.ModelInferRequest(model_name="reciprocal")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[values.size])
    if raw is not None:
        request.raw_input_contents.append(raw)
    else:
        tensor.contents.fp32_contents.extend(fp32 or [])
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        try:
            call(request, timeout=GIVE_UP_S)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return "OK"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_is_400_alike_on_both_doors(
    served: BackgroundPipeline, bad: float
) -> None:
    values = np.array([1.0, bad, 2.0], np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [3],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
    ).encode()
    extra = b"Inference-Header-Content-Length: %d\r\n" % len(header)
    status, doc = _post(served.http_url, header + values.tobytes(), extra)
    message = f"input 'x' has a non-finite value ({bad} at flat index 1); FP32 inputs must be"
    assert status == 400 and doc["error"].startswith(message), doc
    assert _grpc_infer(served.grpc_url, raw=values.tobytes()) == "INVALID_ARGUMENT: " + doc["error"]
    typed = _grpc_infer(served.grpc_url, fp32=values.tolist())
    assert typed == "INVALID_ARGUMENT: " + doc["error"]
    assert served.p.router.inflight == 0


def test_non_finite_output_is_500_alike_on_both_doors(served: BackgroundPipeline) -> None:
    """1 / 0 is infinite: never `null` in JSON, never a 200 with binary infinities."""
    message = (
        "stage 'invert' returned pipeline output 'y' with NaN or infinite values; "
        "outputs must be finite"
    )
    status, doc = _post(served.http_url, _json_body([1.0, 0.0]))
    assert (status, doc) == (500, {"error": message})
    zero = np.array([1.0, 0.0], np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2],
                    "parameters": {"binary_data_size": zero.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    extra = b"Inference-Header-Content-Length: %d\r\n" % len(header)
    assert _post(served.http_url, header + zero.tobytes(), extra) == (status, doc)
    assert _grpc_infer(served.grpc_url, raw=zero.tobytes()) == "INTERNAL: " + doc["error"]


@pytest.fixture(scope="module")
def capped() -> Iterator[BackgroundPipeline]:
    settings = {
        "header_timeout_s": GIVE_UP_S * 4,  # held connections stay for the whole test
        "body_timeout_s": TIMEOUT_S,  # (for the unread answer: the held ones send no body)
        "max_connections": 4,
        "grpc_max_connections": 2,  # clients only: workers dial a port of their own
    }
    with BackgroundPipeline(RECIPROCAL, server=settings) as pipeline:
        yield pipeline


def _until(check: object, what: str) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_http_connection_cap_refuses_cleanly_and_recovers(capped: BackgroundPipeline) -> None:
    held = [_connect(capped.http_url) for _ in range(4)]
    try:
        for _ in range(3):
            status, doc = _post(capped.http_url, _json_body([2.0]))
            assert status == 503 and doc["error"] == "too many connections (limit 4); retry later"
        # A client that sends its request in two writes (as http.client does), both after
        # the 503 has arrived, still reads the 503: the refused connection waits for the
        # client to close it, so the second write does not meet a reset (EPIPE).
        with _connect(capped.http_url) as late:
            assert select.select([late], [], [], GIVE_UP_S)[0], "no 503"
            body = _json_body([2.0])
            late.sendall(_head(len(body)))
            time.sleep(0.1)  # the router's side has answered the first write by now
            late.sendall(body)
            assert _read_response(late)[0] == 503
    finally:
        for sock in held:
            sock.close()
    _until(lambda: _post(capped.http_url, _json_body([2.0]))[0] == 200, "service did not resume")


def test_grpc_connection_cap_refuses_and_recovers(capped: BackgroundPipeline) -> None:
    good = grpcclient.InferInput("x", [1], "FP32")
    good.set_data_from_numpy(np.array([4.0], np.float32))
    held = [_connect(capped.grpc_url) for _ in range(2)]
    try:
        with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
            grpcclient.InferenceServerClient(capped.grpc_url).infer(
                "reciprocal", [good], client_timeout=GIVE_UP_S
            )
        # Clients hold every gRPC slot: a worker killed now still gets back in, on its port.
        (pid,) = capped.p.backend.pids("invert")
        os.kill(pid, signal.SIGKILL)
        _until(
            lambda: (
                capped.p.backend.pids("invert") not in ([], [pid])
                and capped.p.router.ready_replicas() == {"invert": 1}
            ),
            "a restarted worker did not reconnect while clients held every gRPC slot",
        )
    finally:
        for sock in held:
            sock.close()

    def answered() -> bool:
        client = grpcclient.InferenceServerClient(capped.grpc_url)
        try:
            result = client.infer("reciprocal", [good], client_timeout=GIVE_UP_S)
        except InferenceServerException:
            return False
        finally:
            client.close()
        return bool(result.as_numpy("y").tolist() == [0.25])

    _until(answered, "gRPC service did not resume")
    assert capped.p.router.ready_replicas() == {"invert": 1}


def test_grpc_connection_without_handshake_is_closed(served: BackgroundPipeline) -> None:
    with _connect(served.grpc_url) as sock:
        _closed_by_server(sock)  # the server's SETTINGS frame, then the close


# ------------------------------------------------------------------ settings, pure


@pytest.mark.parametrize("command", ["run", "router"])
def test_every_limit_flag_reaches_server_settings(command: str) -> None:
    from sloline.cli.flags import LIMIT_FLAGS, limits
    from sloline.cli.parser import build_parser

    values = {name: (7 if kind is int else 1.5) for name, (kind, _) in LIMIT_FLAGS.items()}
    base = [command, "pipeline.yaml"] if command == "run" else [command, "--pipeline", "p"]
    argv = list(base)
    for name, value in values.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    settings = ServerSettings(**limits(build_parser().parse_args(argv)))
    assert {name: getattr(settings, name) for name in values} == values
    assert ServerSettings(**limits(build_parser().parse_args(base))) == ServerSettings()


def test_connection_caps_fit_the_open_files_limit() -> None:
    from sloline.serving.limits import FD_RESERVE, fd_budget

    assert fd_budget(2048, 2048, 1 << 20) == (2048, 2048)
    http, grpc_ = fd_budget(2048, 1024, 1024)
    assert http + grpc_ <= (1024 - FD_RESERVE) // 2 and http == 2 * grpc_
    assert min(fd_budget(10, 10, 0)) >= 1  # never zero: the router still serves


def test_a_client_that_does_not_read_its_answer_is_cut_off(capped: BackgroundPipeline) -> None:
    """A 16 MiB answer to a client that never reads: once the kernel's buffers are full the
    router gives it the body timeout to make room, then drops the connection (and the
    answer it was holding); others are served meanwhile and after."""
    values = np.full(4 * 1024 * 1024, 2.0, np.float32)
    extra, body = _binary_request(values, binary_output=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small window
    sock.settimeout(GIVE_UP_S)
    with sock:
        sock.connect(_address(capped.http_url))
        sock.sendall(_head(len(body), extra) + body)
        # Not reading, for longer than the router allows (this is the client under test).
        time.sleep(TIMEOUT_S * 3)
        assert _post(capped.http_url, _json_body([4.0]))[0] == 200
        received = 0
        try:
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
    assert received < values.nbytes, "the whole answer waited for the client"
    assert capped.p.router.inflight == 0
