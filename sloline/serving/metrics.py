"""Prometheus metrics of the router, with the names fixed in DESIGN.md.

Dashboards, alerts and the tuner's Prometheus source depend on these names; change them
only together. The registry is injected so tests and several routers in one process do
not collide. Queue lengths and replica counts are read at scrape time through a
collector, so the request hot path only touches counters and histograms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sloline.tuner.envelope import window_label

# Latency buckets from 1 ms to 30 s, dense around typical SLOs.
LATENCY_BUCKETS_S = (
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class RouterMetrics:
    """All metric families of one pipeline's router."""

    def __init__(self, pipeline: str, stages: Iterable[str], registry: CollectorRegistry):
        self.pipeline = pipeline
        self.requests = Counter(
            "sloline_requests",
            "Requests answered, by status code.",
            ["pipeline", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "sloline_request_latency_seconds",
            "End-to-end latency of answered requests.",
            ["pipeline"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.slo_miss = Counter(
            "sloline_slo_miss",
            "Requests slower than the SLO or failed.",
            ["pipeline"],
            registry=registry,
        )
        self.batch_size = Histogram(
            "sloline_stage_batch_size",
            "Items per dispatched batch.",
            ["pipeline", "stage"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.service = Histogram(
            "sloline_stage_service_seconds",
            "Model time per batch, measured in the worker.",
            ["pipeline", "stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.requeued = Counter(
            "sloline_stage_requeued_items",
            "Items re-queued after their worker died.",
            ["pipeline", "stage"],
            registry=registry,
        )
        self.stage_errors = Counter(
            "sloline_stage_errors",
            "Items failed in a stage, by reason.",
            ["pipeline", "stage", "reason"],
            registry=registry,
        )
        self._latency = self.latency.labels(pipeline)
        self._slo_miss = self.slo_miss.labels(pipeline)
        self._batch = {s: self.batch_size.labels(pipeline, s) for s in stages}
        self._service = {s: self.service.labels(pipeline, s) for s in self._batch}
        self._codes: dict[int, Counter] = {200: self.requests.labels(pipeline, "200")}

    def answered(self, code: int, latency_s: float | None, slo_s: float) -> None:
        counter = self._codes.get(code)
        if counter is None:
            counter = self._codes[code] = self.requests.labels(self.pipeline, str(code))
        counter.inc()
        if latency_s is not None:
            self._latency.observe(latency_s)
        if latency_s is None or latency_s > slo_s:
            self._slo_miss.inc()

    def batch(self, stage: str, size: int) -> None:
        self._batch[stage].observe(size)

    def service_time(self, stage: str, seconds: float) -> None:
        self._service[stage].observe(seconds)


class StateCollector(Collector):
    """Scrape-time gauges: queue length, replicas, cost and the arrival envelope."""

    def __init__(
        self,
        pipeline: str,
        queue_lengths: Callable[[], Mapping[str, int]],
        replicas: Callable[[], Mapping[str, tuple[int, int]]],
        cost_per_hour: Callable[[], Mapping[str, float]],
        envelope: Callable[[], Mapping[float, float]],
    ) -> None:
        self._pipeline = pipeline
        self._queue_lengths = queue_lengths
        self._replicas = replicas
        self._cost = cost_per_hour
        self._envelope = envelope

    def collect(self) -> Iterable[GaugeMetricFamily]:
        p = self._pipeline
        queue = GaugeMetricFamily(
            "sloline_stage_queue_length",
            "Items waiting in the stage queue.",
            labels=["pipeline", "stage"],
        )
        for stage, length in self._queue_lengths().items():
            queue.add_metric([p, stage], length)
        replicas = GaugeMetricFamily(
            "sloline_stage_replicas",
            "Replicas per stage: desired by the plan/tuner, ready (connected to the router).",
            labels=["pipeline", "stage", "state"],
        )
        for stage, (desired, ready) in self._replicas().items():
            replicas.add_metric([p, stage, "desired"], desired)
            replicas.add_metric([p, stage, "ready"], ready)
        cost = GaugeMetricFamily(
            "sloline_stage_cost_per_hour",
            "Cost per hour of the stage's desired replicas.",
            labels=["pipeline", "stage"],
        )
        for stage, dollars in self._cost().items():
            cost.add_metric([p, stage], dollars)
        envelope = GaugeMetricFamily(
            "sloline_arrival_envelope_rps",
            "Max arrival rate in any window of this size over "
            "the recent look-back (traffic envelope, InferLine §5).",
            labels=["pipeline", "window_s"],
        )
        for window_s, rate in self._envelope().items():
            envelope.add_metric([p, window_label(window_s)], rate)
        return [queue, replicas, cost, envelope]
