"""The operator's own metrics, on its metrics port (one registry for every pipeline).

Every series carries the ``namespace`` of the pipelines it counts (the operator's
ServiceMonitor honors it, so it is not the operator's own namespace). Per pipeline: the
desired replicas the operator owns and the tuner's decisions. Per namespace: reconciles
by result and their duration, reconcile errors by reason, profiling Jobs started and
finished, and planning time. Names and labels are listed in docs/operations.md
("Metric reference").
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sloline.serving.metrics import LATENCY_BUCKETS_S, TunerMetrics

# How a reconcile ended: everything deployed (`ok`), waiting for profiling Jobs
# (`waiting`, retried after profiling.pollS), a permanent failure until the object
# changes (`failed`: an invalid spec, a failed profile, an infeasible SLO, an internal
# error), or a Kubernetes API error kopf retries (`error`).
RECONCILE_RESULTS = ("ok", "waiting", "failed", "error")
# Planning a large pipeline takes seconds to minutes.
PLAN_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class OperatorMetrics:
    """Every series the operator exports; their label sets start at 0 where they are known."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.tuner = TunerMetrics(registry, namespaced=True)
        self.replicas = Gauge(
            "sloline_stage_replicas",
            "Replicas per stage: desired by the plan/tuner (the operator owns this count).",
            ["namespace", "pipeline", "stage", "state"],
            registry=registry,
        )
        self.reconciles = Counter(
            "sloline_operator_reconciles",
            "Reconciles of PredictionPipelines, by result (ok, waiting, failed, error).",
            ["namespace", "result"],
            registry=registry,
        )
        self.reconcile_seconds = Histogram(
            "sloline_operator_reconcile_duration_seconds",
            "Time one reconcile took, by result.",
            ["namespace", "result"],
            buckets=(*LATENCY_BUCKETS_S, 60.0, 120.0, 300.0),
            registry=registry,
        )
        self.errors = Counter(
            "sloline_operator_reconcile_errors",
            "Reconciles that ended in an error, by reason (the condition reason, e.g. "
            "InvalidSpec, ProfilingFailed, Infeasible, InternalError, or ApiError).",
            ["namespace", "reason"],
            registry=registry,
        )
        self.jobs_started = Counter(
            "sloline_operator_profiling_jobs_started",
            "Profiling Jobs the operator created.",
            ["namespace"],
            registry=registry,
        )
        self.jobs_finished = Counter(
            "sloline_operator_profiling_jobs_finished",
            "Profiling Jobs harvested, by result (succeeded: a profile cached; failed).",
            ["namespace", "result"],
            registry=registry,
        )
        self.plan_seconds = Histogram(
            "sloline_operator_plan_duration_seconds",
            "Time the planner took per planning, infeasible ones included (a deployed plan "
            "reused because its inputs did not change is not counted).",
            ["namespace"],
            buckets=PLAN_BUCKETS_S,
            registry=registry,
        )
        self._namespaces: set[str] = set()

    def seen(self, namespace: str) -> None:
        """Start the per-namespace series at 0 the first time `namespace` is reconciled,
        so rate() and increase() see its first reconcile, Job and plan."""
        if namespace in self._namespaces:
            return
        self._namespaces.add(namespace)
        for result in RECONCILE_RESULTS:
            self.reconciles.labels(namespace, result)
            self.reconcile_seconds.labels(namespace, result)
        self.jobs_started.labels(namespace)
        for result in ("succeeded", "failed"):
            self.jobs_finished.labels(namespace, result)
        self.plan_seconds.labels(namespace)

    def reconciled(
        self, namespace: str, result: str, started: float, error: str | None = None
    ) -> None:
        """One reconcile in `namespace` ended with `result` (one of `RECONCILE_RESULTS`);
        `started` is its `time.perf_counter()` at the start; `error` why it failed."""
        self.seen(namespace)
        self.reconciles.labels(namespace, result).inc()
        self.reconcile_seconds.labels(namespace, result).observe(time.perf_counter() - started)
        if error is not None:
            self.errors.labels(namespace, error).inc()

    def desired(self, namespace: str, pipeline: str, stage: str, replicas: int) -> None:
        self.replicas.labels(namespace, pipeline, stage, "desired").set(replicas)

    def forget(self, namespace: str, pipeline: str, stages: list[str]) -> None:
        for stage in stages:
            try:
                self.replicas.remove(namespace, pipeline, stage, "desired")
            except KeyError:
                continue
