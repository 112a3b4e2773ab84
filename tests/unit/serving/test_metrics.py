"""The metrics dashboards and alerts read: SLO and plan gauges, the tuner's decision
counter, the SLO bucket of the latency histogram, series that exist before the first
event, and a metric reference in docs/operations.md that lists every metric."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sloline.common.envelope import Envelope, StreamingEnvelope, window_sizes
from sloline.operator.metrics import OperatorMetrics
from sloline.serving.metrics import (
    LATENCY_BUCKETS_S,
    RouterMetrics,
    StateCollector,
    TargetCollector,
    TunerMetrics,
    latency_buckets,
    new_registry,
)
from sloline.tuner.policy import Decision, TunerSettings
from sloline.tuner.sources import StageTuning, StreamingSource, Tuner
from tests.support.metrics import exported_metrics

ROOT = Path(__file__).resolve().parents[3]


def test_targets_export_slo_and_planned_envelope_with_the_observed_window_labels() -> None:
    registry = CollectorRegistry()
    windows = window_sizes(0.05, 1.0)
    planned = Envelope(windows, tuple(100.0 / (i + 1) for i in range(len(windows))))
    registry.register(TargetCollector("p", 0.25, 99.5, planned))
    observed = StreamingEnvelope(windows, start_s=0.0)
    registry.register(
        StateCollector(
            "p", dict, dict, dict, dict, lambda: dict.fromkeys(reversed(observed.windows_s), 1.0)
        )
    )
    assert registry.get_sample_value("sloline_slo_seconds", {"pipeline": "p"}) == 0.25
    assert registry.get_sample_value("sloline_slo_percentile", {"pipeline": "p"}) == 99.5
    for i, (window, rate) in enumerate(zip(planned.windows_s, planned.rates_rps, strict=True)):
        # The window's index is the label (shortest first), its size a value: the same
        # labels as the router's observed envelope, so the two divide window by window.
        labels = {"pipeline": "p", "window": str(i)}
        get = registry.get_sample_value
        assert get("sloline_planned_envelope_requests_per_second", labels) == rate
        assert get("sloline_planned_envelope_window_seconds", labels) == window
        assert get("sloline_arrival_envelope_requests_per_second", labels) == 1.0
        assert get("sloline_arrival_envelope_window_seconds", labels) == window


def test_targets_without_a_plan_export_no_planned_envelope() -> None:
    registry = CollectorRegistry()
    registry.register(TargetCollector("p", 0.1, 99.0))
    assert registry.get_sample_value("sloline_slo_seconds", {"pipeline": "p"}) == 0.1
    families = {m.name: m for m in registry.collect()}
    assert families["sloline_planned_envelope_requests_per_second"].samples == []
    assert families["sloline_planned_envelope_window_seconds"].samples == []


@pytest.mark.parametrize(("slo_s", "added"), [(0.25, False), (0.123, True), (None, False)])
def test_latency_buckets_contain_the_slo(slo_s: float | None, added: bool) -> None:
    buckets = latency_buckets(slo_s)
    assert list(buckets) == sorted(set(buckets))
    assert len(buckets) == len(LATENCY_BUCKETS_S) + added
    if slo_s is not None:
        assert slo_s in buckets


def test_latency_histogram_splits_exactly_at_the_slo() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics("p", ["a"], registry, slo_s=0.123)
    for latency_s in (0.1, 0.123, 0.124, 0.2):
        metrics.answered(200, latency_s, slo_s=0.123)
    within = registry.get_sample_value(
        "sloline_request_latency_seconds_bucket", {"pipeline": "p", "le": "0.123"}
    )
    missed = registry.get_sample_value("sloline_slo_miss_total", {"pipeline": "p"})
    assert (within, missed) == (2.0, 2.0)  # the bucket and the miss counter agree


def test_stage_error_series_exist_before_the_first_error() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics("p", ["a", "b"], registry)
    for stage in ("a", "b"):
        labels = {"pipeline": "p", "stage": stage}
        assert registry.get_sample_value("sloline_stage_requeued_items_total", labels) == 0.0
        for reason in ("model_error", "worker_lost"):
            value = registry.get_sample_value(
                "sloline_stage_errors_total", {**labels, "reason": reason}
            )
            assert value == 0.0
        for kind in ("grant", "withdraw", "released", "backlog"):
            value = registry.get_sample_value(
                "sloline_stage_credit_messages_total", {**labels, "kind": kind}
            )
            assert value == 0.0
    metrics.stage_errors.labels("p", "a", "model_error").inc(3)
    errors = {"pipeline": "p", "stage": "a", "reason": "model_error"}
    assert registry.get_sample_value("sloline_stage_errors_total", errors) == 3.0


def test_tuner_metrics_count_decisions_by_direction() -> None:
    registry = CollectorRegistry()
    metrics = TunerMetrics(registry)
    record_p = metrics.recorder("p", ["a", "b"])
    record_q = metrics.recorder("q", ["a"])  # one counter serves every pipeline

    def count(pipeline: str, stage: str, direction: str) -> float | None:
        labels = {"pipeline": pipeline, "stage": stage, "direction": direction}
        return registry.get_sample_value("sloline_tuner_decisions_total", labels)

    assert count("p", "b", "down") == 0.0  # exists before the first decision
    record_p(Decision("a", 1, 3, "burst"))
    record_p(Decision("a", 3, 4, "burst"))
    record_p(Decision("a", 4, 2, "calm"))
    record_q(Decision("a", 2, 1, "calm"))
    assert (count("p", "a", "up"), count("p", "a", "down")) == (2.0, 1.0)
    assert (count("p", "b", "up"), count("q", "a", "down")) == (0.0, 1.0)


async def test_tuner_reports_each_applied_decision() -> None:
    windows = window_sizes(0.25, 8.0)
    envelope = StreamingEnvelope(windows, start_s=0.0)
    now = [0.0]
    scaled: list[tuple[str, int]] = []

    class Actuator:
        async def scale(self, stage: str, replicas: int) -> None:
            scaled.append((stage, replicas))

        async def replicas(self, stage: str) -> tuple[int, int]:
            del stage  # one stage
            return 2, 2

    registry = CollectorRegistry()
    tuner = Tuner(
        stages=[StageTuning("a", 1, 50, 1.0, 10.0, 0.5)],
        planning_envelope=Envelope(windows, (40.0,) * len(windows)),
        source=StreamingSource(envelope),
        actuator=Actuator(),
        settings=TunerSettings(window_base_s=0.25, window_max_s=8.0),
        clock=lambda: now[0],
        on_decision=TunerMetrics(registry).recorder("p", ["a"]),
    )
    envelope.observe(1.0, count=40)  # 160 rps in 0.25 s: 4x the plan
    now[0] = 1.5
    outcome = await tuner.step()
    assert scaled and len(outcome.decisions) == 1
    up = {"pipeline": "p", "stage": "a", "direction": "up"}
    assert registry.get_sample_value("sloline_tuner_decisions_total", up) == 1.0


def _reference_table() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    match = re.search(r"^### Metric reference\n(.*?)(?=^#)", text + "\n#", re.S | re.M)
    assert match, "docs/operations.md has no '### Metric reference' section"
    return match.group(1)


def test_metric_reference_lists_every_metric() -> None:
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(sloline_\w+)` \| (\w+) \|", _reference_table(), re.M)
    }
    exported = exported_metrics()
    assert len(exported) >= 15
    for name, kind in exported.items():
        assert name in rows, f"{name} is missing from the metric reference in docs/operations.md"
        assert rows[name] == kind, f"{name} is a {kind}, the reference says {rows[name]}"


def _busy_registry() -> CollectorRegistry:
    """Every family of a router (and its tuner in the embedded mode), each with data."""
    registry = new_registry()
    metrics = RouterMetrics("p", ["a"], registry, slo_s=0.1)
    metrics.answered(200, 0.05, 0.1)
    metrics.rejected("deadline")
    metrics.admission.observe(0.0001)
    metrics.queue_wait["a"].observe(0.002)
    metrics.batch_size["a"].observe(3)
    metrics.service_time("a", 0.004)
    windows = window_sizes(0.0058055629, 1.0)  # window sizes that print as long floats
    registry.register(
        StateCollector(
            "p",
            lambda: {"a": 1},
            lambda: {"a": 1},
            lambda: {"a": 2},
            lambda: {"a": 0.25},
            lambda: dict.fromkeys(windows, 1.5),
        )
    )
    registry.register(TargetCollector("p", 0.1, 99.0, Envelope(windows, (2.0,) * len(windows))))
    TunerMetrics(registry).recorder("p", ["a"])(Decision("a", 1, 2, "burst"))
    return registry


def _all_samples() -> list[tuple[str, dict[str, str]]]:
    """Every sample of a busy router's registry and of the operator's."""
    router = _busy_registry()
    operator = CollectorRegistry()
    metrics = OperatorMetrics(operator)
    metrics.desired("ns", "p", "a", 2)
    metrics.tuner.recorder("p", ["a"], namespace="ns")(Decision("a", 1, 2, "burst"))
    metrics.reconciled("ns", "ok", 0.0)
    metrics.reconciled("ns", "failed", 0.0, "InvalidSpec")
    metrics.jobs_started.labels("ns").inc()
    metrics.plan_seconds.labels("ns").observe(0.3)
    return [(s.name, s.labels) for r in (router, operator) for m in r.collect() for s in m.samples]


def test_no_label_value_is_a_number_derived_from_a_float() -> None:
    """Label values are names and codes: a float-derived value (a window size, a rate)
    would make a new series whenever it changes. Only `le`, `quantile` and small integers
    (status codes, window indexes) parse as numbers."""
    samples = [(n, labels) for n, labels in _all_samples() if n.startswith("sloline_")]
    assert len(samples) > 50  # (python_info's version labels are the platform collector's)
    for name, labels in samples:
        for label, value in labels.items():
            if label in ("le", "quantile"):
                continue
            try:
                number = float(value)
            except ValueError:
                continue
            assert re.fullmatch(r"\d{1,3}", value), f"{name}{{{label}={value!r}}} is a float"
            assert label in ("code", "window"), (name, label, number)


def test_every_counter_and_histogram_has_created_and_default_collectors_are_there() -> None:
    registry = _busy_registry()
    families = {m.name: m for m in registry.collect()}
    for name, family in families.items():
        if not name.startswith("sloline_") or family.type not in ("counter", "histogram"):
            continue
        names = {s.name for s in family.samples}
        assert f"{name}_created" in names, f"{name} has no _created series"
    assert "process_cpu_seconds" in families
    assert "python_info" in families
    assert "python_gc_objects_collected" in families
