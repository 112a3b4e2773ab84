"""The worker channel: only the pipeline's own workers may dial in.

An attacker who can reach the router's ports says Hello as a stage, the way a real worker
does (`sloline.worker.WorkerService/Connect`), hoping to receive other clients' tensors
and answer for the pipeline. Here it tries without a token and with a wrong one on the
worker port, and at all on the clients' gRPC port, while a real pipeline serves: every
try is refused before Hello is read (no Welcome, no batch), the refusal is logged with the
peer's address, and the real workers keep answering correctly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient

from sloline.cli import main
from sloline.serving import wire
from sloline.serving.auth import WORKER_TOKEN_ENV
from sloline.serving.proto import worker_pb2 as pb
from tests.support.serve import NOOP, BackgroundPipeline


def _hello(stage: str) -> bytes:
    message = pb.WorkerMessage(
        hello=pb.Hello(pipeline="noop", stage=stage, worker_id="evil", pid=1, hardware="cpu-1")
    )
    return wire.encode(message, ())


def say_hello(address: str, stage: str, token: str | None) -> tuple[list[object], grpc.StatusCode]:
    """Dial `address` as a worker of `stage`, keep the stream open for a while and return
    what the router sent and how the call ended."""
    done = threading.Event()

    def requests() -> Iterator[bytes]:
        yield _hello(stage)
        done.wait(5.0)  # stay connected, as a worker waiting for batches would

    metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
    received: list[object] = []
    with grpc.insecure_channel(address) as channel:
        connect = channel.stream_stream(
            wire.CONNECT,
            request_serializer=wire.identity,
            response_deserializer=wire.decode_router_message,
        )
        call = connect(requests(), metadata=metadata, timeout=3.0)
        try:
            for message, _payload in call:
                received.append(message)
            code = call.code()
        except grpc.RpcError as exc:
            code = exc.code()
        finally:
            done.set()
    return received, code


@pytest.fixture(scope="module")
def served() -> Iterator[BackgroundPipeline]:
    with BackgroundPipeline(NOOP) as bg:
        yield bg


def _infer(url: str, n: int) -> None:
    client = httpclient.InferenceServerClient(url)
    for i in range(n):
        x = np.arange(i, i + 4, dtype=np.float32)
        tensor = httpclient.InferInput("x", [4], "FP32")
        tensor.set_data_from_numpy(x)
        assert client.infer("noop", [tensor]).as_numpy("x").tolist() == x.tolist()


def test_workers_without_the_token_are_refused_while_real_ones_serve(
    served: BackgroundPipeline, caplog: pytest.LogCaptureFixture
) -> None:
    p = served.p
    workers = f"127.0.0.1:{p.server.worker_port}"
    assert p.server.worker_port not in (p.server.grpc_port, p.server.http_port)
    caplog.set_level(logging.WARNING, logger="sloline.serving.guard")
    load = threading.Thread(target=_infer, args=(served.http_url, 30))
    load.start()
    try:
        for stage in ("s1", "s3"):
            for token in (None, "wrong-token", ""):
                received, code = say_hello(workers, stage, token)
                assert (received, code) == ([], grpc.StatusCode.UNAUTHENTICATED), token
    finally:
        load.join(60)
    _infer(served.http_url, 5)
    # Only the pipeline's own three workers joined.
    assert sorted(c.stage for c in p.router.workers.values()) == ["s1", "s2", "s3"]
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 6
    assert all("127.0.0.1" in m and "worker" in m for m in refusals), refusals


def test_the_client_grpc_port_offers_no_worker_service(served: BackgroundPipeline) -> None:
    p = served.p
    received, code = say_hello(served.grpc_url, "s1", None)
    assert (received, code) == ([], grpc.StatusCode.UNIMPLEMENTED)
    token = p.settings.server.worker_token
    assert token
    received, code = say_hello(served.grpc_url, "s1", token)  # not even with the token
    assert (received, code) == ([], grpc.StatusCode.UNIMPLEMENTED)
    _infer(served.http_url, 3)
    assert len(p.router.workers) == 3


def test_the_right_token_is_welcomed(served: BackgroundPipeline) -> None:
    """The control: the same client with the pipeline's token gets its Welcome (and would
    get batches), so the refusals above are about the token, not the client."""
    p = served.p
    received, _code = say_hello(
        f"127.0.0.1:{p.server.worker_port}", "nosuchstage", p.settings.server.worker_token
    )
    assert len(received) == 1
    welcome = received[0]
    assert isinstance(welcome, pb.RouterMessage)
    assert "no stage 'nosuchstage'" in welcome.welcome.error  # refused by the router, not auth


def test_embedded_workers_get_the_token_in_their_environment_not_argv(
    served: BackgroundPipeline,
) -> None:
    p = served.p
    token = p.settings.server.worker_token
    assert token
    assert p.backend is not None
    pids = [pid for stage in ("s1", "s2", "s3") for pid in p.backend.pids(stage)]
    assert len(pids) == 3
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert token.encode() not in argv
        assert f"{WORKER_TOKEN_ENV}={token}".encode() in environ
        assert f"127.0.0.1:{p.server.worker_port}".encode() in argv


def test_each_embedded_run_has_its_own_token() -> None:
    from sloline.embedded import EmbeddedPipeline
    from sloline.spec import load_pipeline

    loaded = load_pipeline(NOOP)
    first = EmbeddedPipeline(loaded).settings.server.worker_token
    second = EmbeddedPipeline(loaded).settings.server.worker_token
    assert first and second and first != second
    assert len(first) >= 40


def test_standalone_router_refuses_to_start_without_a_worker_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv(WORKER_TOKEN_ENV, raising=False)
    assert main(["router", "--pipeline", str(NOOP), "--port", "0", "--grpc-port", "0"]) == 2
    err = capsys.readouterr().err
    assert "no worker token" in err and "--insecure-workers" in err
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert main(["router", "--pipeline", str(NOOP), "--worker-token-file", str(empty)]) == 2
    assert "holds no token" in capsys.readouterr().err
