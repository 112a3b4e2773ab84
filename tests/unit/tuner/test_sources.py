"""Metric sources, the Prometheus client and the async Tuner shell (§5, I/O edge)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from sloline.common.envelope import Envelope, StreamingEnvelope, window_sizes
from sloline.tuner.load_estimate import equivalent_rate, fluctuations
from sloline.tuner.policy import TunerSettings
from sloline.tuner.sources import (
    MetricSnapshot,
    PrometheusError,
    PrometheusSource,
    StageTuning,
    StreamingSource,
    Tuner,
    urllib_get_json,
)

WINDOWS = window_sizes(0.25, 8.0)


def vector(*items: tuple[dict[str, str], float]) -> dict[str, Any]:
    result = [{"metric": m, "value": [1700000000.0, str(v)]} for m, v in items]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


class FakePrometheus:
    """Answers the four tuner queries by the metric they name; records every call."""

    def __init__(
        self,
        envelope: dict[str, Any],
        lambdas: dict[str, Any],
        ready: dict[str, Any],
        windows: dict[str, Any] | None = None,
    ):
        self.answers = {
            "sloline_arrival_envelope_requests_per_second": envelope,
            "sloline_arrival_envelope_window_seconds": envelope if windows is None else windows,
            "sloline_requests_total": lambdas,
            "sloline_stage_replicas": ready,
        }
        self.calls: list[tuple[str, dict[str, str]]] = []

    def __call__(self, url: str, params: Mapping[str, str]) -> Mapping[str, Any]:
        self.calls.append((url, dict(params)))
        return next(a for name, a in self.answers.items() if name in params["query"])


LAMBDAS = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [{"metric": {}, "values": [[t, str(v)] for t, v in enumerate([4, 6, 5])]}],
    },
}
READY = vector(({"stage": "resnet"}, 3), ({"stage": "bert"}, 1))


async def test_prometheus_source_queries_and_parses() -> None:
    envelope = vector(
        ({"window": "0"}, 80.0),
        ({"window": "5"}, 12.5),
        ({"window": "1"}, 7.0),
        ({"window": "6"}, 9.0),  # exported but not planned: ignored
        ({"window": "7"}, 3.0),  # its size is no longer exported (an old plan's): ignored
    )
    windows = vector(
        ({"window": "0"}, 0.25),
        ({"window": "5"}, 8.0),
        ({"window": "1"}, 0.5 * (1 + 3e-6)),  # a size through float formatting still matches
        ({"window": "6"}, 16.0),
    )
    fake = FakePrometheus(envelope, LAMBDAS, READY, windows)
    source = PrometheusSource(
        "http://prom:9090/", "team-a", 'my"pipe', windows_s=WINDOWS, get_json=fake
    )

    observation = await source.observe(123.0)

    assert {url for url, _ in fake.calls} == {"http://prom:9090/api/v1/query"}
    selector = 'namespace="team-a", pipeline="my\\"pipe"'
    assert {p["query"] for _, p in fake.calls} == {
        f"max_over_time(sloline_arrival_envelope_requests_per_second{{{selector}}}[60s])",
        f"max by (window) (sloline_arrival_envelope_window_seconds{{{selector}}})",
        f"sum(rate(sloline_requests_total{{{selector}}}[5s]))[30s:5s]",
        f'max by (stage) (sloline_stage_replicas{{{selector}, state="ready"}})',
    }
    assert observation.observed_envelope == Envelope(WINDOWS, (80.0, 7.0, 0.0, 0.0, 0.0, 12.5))
    assert observation.recent_lambdas_rps == (4.0, 6.0, 5.0)
    assert observation.ready_replicas == {"resnet": 3, "bert": 1}
    assert observation.streams == 1


async def test_prometheus_source_sums_the_routers_envelopes_and_counts_them() -> None:
    def router(pod: str, rates: tuple[float, float]) -> list[tuple[dict[str, str], float]]:
        return [({"pod": pod, "window": str(i)}, r) for i, r in enumerate(rates)]

    envelope = vector(
        *router("router-a", (40.0, 6.0)),
        *router("router-b", (24.0, 5.0)),
        *router("router-c", (0.0, 0.0)),  # saw no arrival in the look-back: not a stream
    )
    windows = vector(({"window": "0"}, 0.25), ({"window": "1"}, 0.5))
    source = PrometheusSource(
        "http://p",
        "ns",
        "x",
        windows_s=WINDOWS,
        get_json=FakePrometheus(envelope, LAMBDAS, READY, windows),
    )
    observation = await source.observe(0.0)
    assert observation.observed_envelope.rates_rps[:2] == (64.0, 11.0)
    assert observation.streams == 2


async def test_prometheus_source_before_any_data_sees_nothing() -> None:
    fake = FakePrometheus(vector(), vector(), vector())
    source = PrometheusSource("http://p", "ns", "x", windows_s=WINDOWS, get_json=fake)
    observation = await source.observe(0.0)
    assert observation == MetricSnapshot(Envelope(WINDOWS, (0.0,) * len(WINDOWS)), (), {})


async def test_prometheus_source_rejects_mismatched_windows() -> None:
    fake = FakePrometheus(
        vector(({"window": "0"}, 1.0)), LAMBDAS, READY, vector(({"window": "0"}, 0.3))
    )
    source = PrometheusSource("http://p", "ns", "x", windows_s=WINDOWS, get_json=fake)
    with pytest.raises(ValueError, match="window base T_s"):
        await source.observe(0.0)


async def test_prometheus_errors_carry_the_query() -> None:
    error = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    source = PrometheusSource(
        "http://p", "ns", "x", windows_s=WINDOWS, get_json=FakePrometheus(error, error, error)
    )
    with pytest.raises(PrometheusError, match=r"bad_data.*parse error.*query: "):
        await source.observe(0.0)


def test_prometheus_source_longer_rate_window_for_slow_scrapes() -> None:
    source = PrometheusSource(
        "http://p",
        "ns",
        "x",
        windows_s=WINDOWS,
        lambda_rate_window_s=30.0,
        get_json=FakePrometheus(vector(), vector(), vector()),
    )
    assert source.lambda_query == (
        'sum(rate(sloline_requests_total{namespace="ns", pipeline="x"}[30s]))[30s:5s]'
    )


@pytest.fixture
def json_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"status": "success", "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()
    server.server_close()


def test_urllib_get_json_over_real_http(json_server: str) -> None:
    body = urllib_get_json(json_server + "/api/v1/query", {"query": 'up{a="b"}'})
    assert body == {"status": "success", "path": "/api/v1/query?query=up%7Ba%3D%22b%22%7D"}
    with pytest.raises(ValueError, match="http"):
        urllib_get_json("file:///etc/passwd", {})


class FakeActuator:
    def __init__(self, replicas: dict[str, int]) -> None:
        self.desired = dict(replicas)
        self.calls: list[tuple[str, int]] = []

    async def scale(self, stage: str, replicas: int) -> None:
        self.calls.append((stage, replicas))
        self.desired[stage] = replicas

    async def replicas(self, stage: str) -> tuple[int, int]:
        return self.desired[stage], 0  # nothing ready yet: must not matter


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_tuner_scales_up_on_burst_then_down_after_stabilisation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(0.0)
    envelope = StreamingEnvelope(WINDOWS, start_s=0.0)
    actuator = FakeActuator({"a": 2})
    # planned: 10 rps, peaking at 12 rps in 0.25 s windows; 2 replicas (rho = 10/(2*10))
    planning = Envelope(WINDOWS, (12.0,) + (10.0,) * (len(WINDOWS) - 1))
    c = fluctuations(planning, 10.0)[0]
    tuner = Tuner(
        stages=[StageTuning("a", 1, 50, 1.0, 10.0, 0.5)],
        planning_envelope=planning,
        planning_rate_rps=10.0,
        source=StreamingSource(envelope),
        actuator=actuator,
        settings=TunerSettings(window_base_s=0.25, window_max_s=8.0),
        clock=clock,
    )
    envelope.observe_many(np.arange(0.0, 10.0, 0.1))  # 10 rps: within the plan
    clock.now = 10.0
    assert (await tuner.step()).decisions == ()

    envelope.observe(10.0, count=30)  # with 9.8 s and 9.9 s: 32 in 0.25 s = 128 rps
    clock.now = 10.5
    with caplog.at_level(logging.INFO, logger="sloline.tuner.sources"):
        outcome = await tuner.step()
    load = equivalent_rate(32.0, c, 0.25)  # 121 rps: the 10 rps stream scaled to 32 in 0.25 s
    k_m = math.ceil(load / (10.0 * 0.5))
    assert actuator.calls == [("a", k_m)] and k_m == 25  # desired 2, ready 0: vs desired
    assert tuner.last_change_s == 10.5
    assert f"k_m=ceil({load:.6g}*1/(10*0.5))=25" in caplog.text
    assert outcome.decisions[0].reason in caplog.text

    envelope.observe_many(np.arange(10.5, 100.0, 1.0))  # then 1 rps, burst long gone
    clock.now = 100.0
    await tuner.step()
    assert actuator.calls[-1] == ("a", 1)  # ceil(1 * 1 / (10 * 0.5)) = 1


async def test_tuner_run_ticks_until_stopped_and_survives_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()
    ticks = 0

    class FlakySource:
        async def observe(self, now_s: float) -> MetricSnapshot:
            del now_s
            nonlocal ticks
            ticks += 1
            if ticks == 1:
                raise PrometheusError("scrape target down")
            if ticks == 3:
                stop.set()
            return MetricSnapshot(Envelope(WINDOWS, (0.0,) * len(WINDOWS)), ())

    tuner = Tuner(
        stages=[StageTuning("a", 1, 2, 1.0, 1.0, 1.0)],
        planning_envelope=Envelope(WINDOWS, (1.0,) * len(WINDOWS)),
        source=FlakySource(),
        actuator=FakeActuator({"a": 1}),
        settings=TunerSettings(window_base_s=0.25, window_max_s=8.0, interval_s=0.001),
    )
    with caplog.at_level(logging.ERROR, logger="sloline.tuner.sources"):
        await asyncio.wait_for(tuner.run(stop), timeout=1.5)
    assert ticks == 3
    assert "tick failed" in caplog.text
