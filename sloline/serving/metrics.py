"""Prometheus metrics of sloline (router, SLO and plan, tuner), with fixed names
(docs/operations.md, "Metric reference").

Dashboards, alerts and the tuner's Prometheus source depend on these names; change them
only together (docs/operations.md lists them all, and a test keeps that list complete).
The registry is injected so tests and several routers in one process do not collide;
`new_registry` adds the default process and platform collectors (``process_*``,
``python_*``). Queue lengths and replica counts are read at scrape time through a
collector, and the request path only adds to plain numbers that another collector
exports.

Label values are names and codes, never numbers derived from a float: the traffic
envelope's window sizes are gauge values (``..._window_seconds``) keyed by the window's
index (``window="0"`` is the shortest), so a re-plan changes values, not series.
Every counter and histogram has a ``_created`` series (when its series started).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from sloline.common.envelope import Envelope
from sloline.tuner.policy import Decision

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
    0.25,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Reasons of sloline_stage_errors_total the router reports; their series start at 0 so
# rate() and alerts see the first error.
STAGE_ERROR_REASONS = ("model_error", "worker_lost")
# Messages that move a worker's one credit between several routers (docs/architecture.md,
# "Many routers"): received from workers, and sent to them.
CREDIT_MESSAGE_KINDS = ("grant", "withdraw", "released", "backlog")
# Why the router shed a request with 503 (sloline_admission_rejected_total): its
# estimated finish was past its budget, max_inflight requests were in the router, or a
# stage queue was full. (A draining router sheds nothing: it answers what still arrives.)
REJECT_REASONS = ("deadline", "inflight", "queue_full")
# How late the router's event loop runs a timer: the wait every request, response and
# worker message sees before the loop gets to it (time a request spends before the
# router sees it included).
LOOP_LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def new_registry() -> CollectorRegistry:
    """A registry with the default process and platform collectors (``process_*``,
    ``python_info``, ``python_gc_*``), as prometheus_client's global registry has them."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def latency_buckets(slo_s: float | None) -> tuple[float, ...]:
    """The end-to-end latency buckets: :data:`LATENCY_BUCKETS_S` plus the SLO itself.

    With a bucket bound at the SLO, ``histogram_quantile`` crosses the SLO exactly when
    the fraction of requests slower than the SLO crosses the quantile's complement, so
    "P99 above the SLO" on the dashboard agrees with the attainment panel and the alerts.
    """
    if slo_s is None or slo_s in LATENCY_BUCKETS_S:
        return LATENCY_BUCKETS_S
    return tuple(sorted((*LATENCY_BUCKETS_S, slo_s)))


class Series:
    """One histogram series kept as plain numbers on the request path.

    prometheus_client's `Histogram.observe` takes a lock and walks the buckets in Python
    (docs/benchmarks.md); this is a C bisect and two additions. Only the router's event loop writes;
    a scrape on that loop reads a consistent snapshot, one from another thread at worst
    a count one observation behind its buckets.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative counts per `le` bound, as Prometheus exposes them."""
        edges = [*map(floatToGoString, self.bounds), "+Inf"]
        return list(zip(edges, accumulate(self.counts), strict=True))


def _created(family: Metric, labels: Mapping[str, str], created: float) -> None:
    """Add the ``_created`` sample of one histogram series (the families of
    prometheus_client's collector API take it only for counters)."""
    family.samples.append(Sample(f"{family.name}_created", dict(labels), created))


class RouterMetrics:
    """All metric families of one pipeline's router.

    The per-request families (requests by code, latency, time to admission, SLO misses,
    and per stage queue wait, batch sizes, service times) are plain counters and
    `Series` exported at scrape time by a collector, so recording costs well under a
    microsecond; the rare-event counters (re-queues, stage errors, credit messages) are ordinary
    prometheus_client counters. Each router exports its own series; Prometheus tells
    routers apart by the scrape's ``instance`` (and, on Kubernetes, ``pod``) label.
    """

    def __init__(
        self,
        pipeline: str,
        stages: Iterable[str],
        registry: CollectorRegistry,
        *,
        slo_s: float | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.created = time.time()
        self.codes: dict[int, int] = {200: 0}
        self.latency = Series(latency_buckets(slo_s))
        self.admission = Series(LOOP_LAG_BUCKETS_S)
        self.slo_miss = 0
        self.batch_size = {s: Series(tuple(map(float, BATCH_BUCKETS))) for s in stages}
        self.service = {s: Series(LATENCY_BUCKETS_S) for s in self.batch_size}
        self.queue_wait = {s: Series(LATENCY_BUCKETS_S) for s in self.batch_size}
        self.rejections = dict.fromkeys(REJECT_REASONS, 0)
        self.loop_lag = Series(LOOP_LAG_BUCKETS_S)
        registry.register(_HotPathCollector(self))
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
        credit_messages = Counter(
            "sloline_stage_credit_messages",
            "Messages moving the credit of workers that serve several routers, by kind.",
            ["pipeline", "stage", "kind"],
            registry=registry,
        )
        self.credit_messages = {
            (stage, kind): credit_messages.labels(pipeline, stage, kind)
            for stage in self.batch_size
            for kind in CREDIT_MESSAGE_KINDS
        }
        for stage in self.batch_size:
            self.requeued.labels(pipeline, stage)
            for reason in STAGE_ERROR_REASONS:
                self.stage_errors.labels(pipeline, stage, reason)

    def answered(self, code: int, latency_s: float | None, slo_s: float) -> None:
        self.codes[code] = self.codes.get(code, 0) + 1
        if latency_s is not None:
            self.latency.observe(latency_s)
        if latency_s is None or latency_s > slo_s:
            self.slo_miss += 1

    def rejected(self, reason: str) -> None:
        self.rejections[reason] += 1

    def service_time(self, stage: str, seconds: float) -> None:
        self.service[stage].observe(seconds)


class _HotPathCollector(Collector):
    """Exports `RouterMetrics`' plain counters and series under their fixed names."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterable[Metric]:
        m, p, created = self._m, self._m.pipeline, self._m.created
        requests = CounterMetricFamily(
            "sloline_requests", "Requests answered, by status code.", labels=["pipeline", "code"]
        )
        for code, count in sorted(m.codes.items()):
            requests.add_metric([p, str(code)], count, created=created)
        latency = HistogramMetricFamily(
            "sloline_request_latency_seconds",
            "End-to-end latency of answered requests.",
            labels=["pipeline"],
        )
        admission = HistogramMetricFamily(
            "sloline_request_admission_seconds",
            "Per admitted request, the router's receipt to its admission: request checks, "
            "arrival bookkeeping and the admission estimate (the wait before the router "
            "receives it is in sloline_event_loop_lag_seconds).",
            labels=["pipeline"],
        )
        lag = HistogramMetricFamily(
            "sloline_event_loop_lag_seconds",
            "How late the router's event loop woke a periodic timer.",
            labels=["pipeline"],
        )
        for family, series in ((latency, m.latency), (admission, m.admission), (lag, m.loop_lag)):
            family.add_metric([p], series.buckets(), series.sum)
            _created(family, {"pipeline": p}, created)
        miss = CounterMetricFamily(
            "sloline_slo_miss", "Requests slower than the SLO or failed.", labels=["pipeline"]
        )
        miss.add_metric([p], m.slo_miss, created=created)
        per_stage = (
            (
                HistogramMetricFamily(
                    "sloline_stage_queue_wait_seconds",
                    "Per item, the wait in the stage queue: enqueued to dispatched to a worker.",
                    labels=["pipeline", "stage"],
                ),
                m.queue_wait,
            ),
            (
                HistogramMetricFamily(
                    "sloline_stage_batch_size",
                    "Items per dispatched batch.",
                    labels=["pipeline", "stage"],
                ),
                m.batch_size,
            ),
            (
                HistogramMetricFamily(
                    "sloline_stage_service_seconds",
                    "Model time per batch, measured in the worker.",
                    labels=["pipeline", "stage"],
                ),
                m.service,
            ),
        )
        for family, by_stage in per_stage:
            for stage, series in by_stage.items():
                family.add_metric([p, stage], series.buckets(), series.sum)
                _created(family, {"pipeline": p, "stage": stage}, created)
        rejected = CounterMetricFamily(
            "sloline_admission_rejected",
            "Requests shed with 503, by reason (also counted in sloline_requests_total).",
            labels=["pipeline", "reason"],
        )
        for reason, count in m.rejections.items():
            rejected.add_metric([p, reason], count, created=created)
        return [requests, latency, admission, miss, *(f for f, _ in per_stage), rejected, lag]


def _envelope_families(
    name: str,
    help_rate: str,
    help_window: str,
    pipeline: str,
    windows: Iterable[tuple[float, float]],
) -> list[GaugeMetricFamily]:
    """A traffic envelope as two gauges keyed by the window's index (shortest first): its
    rate and its window size."""
    rate = GaugeMetricFamily(
        f"{name}_requests_per_second", help_rate, labels=["pipeline", "window"]
    )
    size = GaugeMetricFamily(f"{name}_window_seconds", help_window, labels=["pipeline", "window"])
    for i, (window_s, rps) in enumerate(sorted(windows)):
        rate.add_metric([pipeline, str(i)], rps)
        size.add_metric([pipeline, str(i)], window_s)
    return [rate, size]


class StateCollector(Collector):
    """Scrape-time gauges: queue length, replicas, cost and the arrival envelope."""

    def __init__(
        self,
        pipeline: str,
        queue_lengths: Callable[[], Mapping[str, int]],
        ready_replicas: Callable[[], Mapping[str, int]],
        desired_replicas: Callable[[], Mapping[str, int]],
        cost_per_hour: Callable[[], Mapping[str, float]],
        envelope: Callable[[], Mapping[float, float]],
    ) -> None:
        self._pipeline = pipeline
        self._queue_lengths = queue_lengths
        self._ready = ready_replicas
        self._desired = desired_replicas
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
        # Desired only where this process owns the count (embedded mode); on Kubernetes
        # the operator exports it and the router reports what it sees: connected workers.
        for stage, desired in self._desired().items():
            replicas.add_metric([p, stage, "desired"], desired)
        for stage, ready in self._ready().items():
            replicas.add_metric([p, stage, "ready"], ready)
        cost = GaugeMetricFamily(
            "sloline_stage_cost_per_hour",
            "Cost per hour of the stage's replicas (desired ones where this process owns "
            "the count, else connected ones).",
            labels=["pipeline", "stage"],
        )
        for stage, dollars in self._cost().items():
            cost.add_metric([p, stage], dollars)
        envelope = _envelope_families(
            "sloline_arrival_envelope",
            "Max arrival rate in any window of this size over the recent look-back "
            "(traffic envelope, InferLine §5); window 0 is the shortest.",
            "Size of each window of sloline_arrival_envelope_requests_per_second.",
            p,
            self._envelope().items(),
        )
        return [queue, replicas, cost, *envelope]


class TargetCollector(Collector):
    """The pipeline's targets as constant gauges, so dashboards and alerts compare against
    them without hard-coded numbers: the SLO (latency and percentile) and, with a plan, the
    planned traffic envelope the deployment was sized for (InferLine §4.3, §5)."""

    def __init__(
        self, pipeline: str, slo_s: float, percentile: float, planned: Envelope | None = None
    ) -> None:
        self._pipeline = pipeline
        self._slo_s = slo_s
        self._percentile = percentile
        self._planned = planned

    def collect(self) -> Iterable[GaugeMetricFamily]:
        p = self._pipeline
        slo = GaugeMetricFamily(
            "sloline_slo_seconds",
            "The pipeline's end-to-end latency SLO.",
            labels=["pipeline"],
        )
        slo.add_metric([p], self._slo_s)
        percentile = GaugeMetricFamily(
            "sloline_slo_percentile",
            "The SLO percentile: this share of requests (in %) must finish within the SLO.",
            labels=["pipeline"],
        )
        percentile.add_metric([p], self._percentile)
        planned = _envelope_families(
            "sloline_planned_envelope",
            "Max arrival rate per window size in the planning trace (the planned traffic "
            "envelope; compare with sloline_arrival_envelope_requests_per_second).",
            "Size of each window of sloline_planned_envelope_requests_per_second.",
            p,
            ()
            if self._planned is None
            else zip(self._planned.windows_s, self._planned.rates_rps, strict=True),
        )
        return [slo, percentile, *planned]


class TunerMetrics:
    """The tuner's decision counter. One per registry: every pipeline a process tunes
    (one in the embedded mode, many in the operator) records through it. The operator's
    series carry the pipeline's ``namespace`` (`namespaced`); a router's get it from the
    scrape."""

    def __init__(self, registry: CollectorRegistry, *, namespaced: bool = False) -> None:
        labels = ["pipeline", "stage", "direction"]
        self.decisions = Counter(
            "sloline_tuner_decisions",
            "Replica changes the tuner applied, by direction (up or down).",
            ["namespace", *labels] if namespaced else labels,
            registry=registry,
        )

    def recorder(
        self, pipeline: str, stages: Iterable[str], *, namespace: str | None = None
    ) -> Callable[[Decision], None]:
        """The ``on_decision`` callback of ``pipeline``'s tuner (in ``namespace`` for a
        namespaced counter); its series start at 0."""
        scope = (pipeline,) if namespace is None else (namespace, pipeline)
        for stage in stages:
            for direction in ("up", "down"):
                self.decisions.labels(*scope, stage, direction)

        def record(decision: Decision) -> None:
            direction = "up" if decision.is_scale_up else "down"
            self.decisions.labels(*scope, decision.stage, direction).inc()

        return record
