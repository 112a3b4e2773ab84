"""A stranger cannot flood the router's log: the lines a client can cause at will (uvicorn's
per-request warning for malformed HTTP, the token guard's per-call refusal) are throttled
by `sloline.serving.logthrottle`, which every `sloline` command installs."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import httpx
import pytest

from sloline.serving.logthrottle import STRANGER_LOGGERS, Throttle, throttle_logs
from tests.support.serve import NOOP, BackgroundPipeline

FLOOD = 200


def test_throttle_passes_one_per_kind_per_window_and_counts_the_rest() -> None:
    now = [0.0]
    throttle = Throttle(every_s=10.0, clock=lambda: now[0])

    def record(msg: str, name: str = "a") -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, (), None)

    assert throttle.filter(record("refused %s"))
    assert not any(throttle.filter(record("refused %s")) for _ in range(5))
    assert throttle.filter(record("other"))  # another template is another kind
    assert throttle.filter(record("refused %s", name="b"))  # and so is another logger
    now[0] = 10.0
    passed = record("refused %s")
    assert throttle.filter(passed)
    assert passed.msg == "refused %s (5 more like this in the last 10 s)"


@pytest.fixture
def guarded() -> Iterator[BackgroundPipeline]:
    throttle_logs()  # taken off again after the test (tests/conftest.py)
    with BackgroundPipeline(NOOP, server={"auth_tokens": ("a-token-0123456789abcdef",)}) as bg:
        yield bg


def test_a_flood_of_refused_and_malformed_requests_logs_a_few_lines(
    guarded: BackgroundPipeline, caplog: pytest.LogCaptureFixture
) -> None:
    host, port = guarded.http_url.rsplit(":", 1)
    with caplog.at_level(logging.WARNING):
        with httpx.Client() as client:
            for _ in range(FLOOD):
                assert client.get(f"http://{guarded.http_url}/v2").status_code == 401
        for _ in range(FLOOD):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                sock.recv(1024)
        with httpx.Client() as client:  # a later line of a kind says what it dropped
            assert client.get(f"http://{guarded.http_url}/v2/health/ready").status_code == 200
    lines = [r for r in caplog.records if r.name in STRANGER_LOGGERS]
    assert any(r.name == "sloline.serving.guard" for r in lines)
    assert any(r.name == "uvicorn.error" for r in lines)
    assert len(lines) <= 4, [r.getMessage() for r in lines]
