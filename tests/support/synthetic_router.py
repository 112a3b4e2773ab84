"""A router's metrics without a router: the router's own metric classes, served over HTTP,
at a rate and envelope the test sets (for tests of what reads them: the operator's
tuner daemon, the tuner's Prometheus source)."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, start_http_server

from sloline.serving.metrics import RouterMetrics, StateCollector
from tests.support.net import free_port


class SyntheticRouter:
    """The router's metrics for a pipeline, exported with the router's own collectors, at
    a rate the test sets: requests counted per second and the arrival envelope gauges."""

    def __init__(self, pipeline: str, stages: list[str], windows_s: tuple[float, ...]) -> None:
        self.registry = CollectorRegistry()
        self.metrics = RouterMetrics(pipeline, stages, self.registry)
        self.rate_rps = 0.0
        self.envelope: dict[float, float] = dict.fromkeys(windows_s, 0.0)
        self.registry.register(
            StateCollector(
                pipeline,
                queue_lengths=lambda: dict.fromkeys(stages, 0),
                ready_replicas=lambda: dict.fromkeys(stages, 1),
                desired_replicas=dict,
                cost_per_hour=dict,
                envelope=lambda: self.envelope,
            )
        )
        self.port = free_port()
        self._stop = threading.Event()

    def __enter__(self) -> SyntheticRouter:
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        self.thread = threading.Thread(target=self._count, daemon=True)
        self.thread.start()
        return self

    def _count(self) -> None:
        while not self._stop.wait(0.1):
            for _ in range(round(self.rate_rps / 10)):
                self.metrics.answered(200, 0.01, 1.0)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(5)
        self.server.shutdown()
