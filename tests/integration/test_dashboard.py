"""Every query of the shipped Grafana dashboard returns data from a real Prometheus that
scrapes a running embedded pipeline under load: panels, the tuner annotation and the
template variables, with Grafana's variables replaced as Grafana would. The same scrape
shows every per-stage and per-request series moving, the default collectors, and no
label value derived from a float."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from prometheus_client import CollectorRegistry, start_http_server
from tritonclient.utils import InferenceServerException

from sloline.measure.session import PlanningSession
from sloline.operator.metrics import OperatorMetrics
from tests.integration.test_tuner_live import open_loop
from tests.support.net import free_port
from tests.support.prometheus import Prometheus
from tests.support.serve import SLEEPY, BackgroundPipeline

DASHBOARD = (
    Path(__file__).resolve().parents[2]
    / "helm"
    / "sloline"
    / "files"
    / "dashboards"
    / "slo-attainment.json"
)
# At the plan's rate, then a burst past the slow stage's capacity: the tuner scales it up.
PHASES = [(25.0, 4.0), (80.0, 8.0)]
TUNER = {
    "stabilization_s": 4.0,
    "lambda_window_s": 1.0,
    "lambda_lookback_s": 4.0,
    "envelope_lookback_s": 6.0,
}
RATE_INTERVAL = "4s"  # Grafana's $__rate_interval for a 1 s scrape: 4 x scrape interval


def _api(prometheus: Prometheus, path: str, **params: str) -> Any:
    url = f"{prometheus.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def _expand(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):  # $__rate_interval before $__range
        expr = expr.replace(f"${name}", variables[name])
    return expr


def _finite(values: list[list[Any]]) -> bool:
    return any(math.isfinite(float(v)) for _, v in values)


def _wait_for(prometheus: Prometheus, promql: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not prometheus.query(promql):
        assert time.monotonic() < deadline, f"Prometheus never saw {promql}"
        time.sleep(0.25)


def _scrapes(prometheus: Prometheus) -> int:
    """How many times Prometheus has scraped the router so far."""
    (series,) = prometheus.query('count_over_time(up{job="sloline"}[1h])')
    return int(series["value"][1])


def _deadline_misses(url: str, count: int) -> None:
    """Requests with a 1 ms deadline: answered 504, counted as failures and SLO misses."""
    client = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("x", [4], "FP32")
    x.set_data_from_numpy(np.ones(4, np.float32))
    failed = 0
    for _ in range(count):
        try:
            client.infer("sleepy", [x], parameters={"timeout_ms": 1})
        except InferenceServerException:
            failed += 1
    assert failed == count


def _operator_activity(metrics: OperatorMetrics, stop: threading.Event) -> None:
    """What an operator reconciling team-a's pipelines records, through the operator's
    own metrics class (the operator itself needs a Kubernetes API: tests/integration/
    test_operator.py checks its series there)."""
    while not stop.wait(0.2):
        started = time.perf_counter()
        metrics.jobs_started.labels("team-a").inc(2)
        metrics.jobs_finished.labels("team-a", "succeeded").inc()
        metrics.jobs_finished.labels("team-a", "failed").inc()
        metrics.plan_seconds.labels("team-a").observe(0.05)
        metrics.reconciled("team-a", "waiting", started)
        metrics.reconciled("team-a", "failed", started, "Infeasible")


# Per-stage and per-request series that must move under load, and the default collectors.
MOVING = (
    'increase(sloline_stage_queue_wait_seconds_count{stage="parse"}[RANGE])',
    'increase(sloline_stage_queue_wait_seconds_count{stage="slow"}[RANGE])',
    'increase(sloline_stage_queue_wait_seconds_sum{stage="slow"}[RANGE])',
    'increase(sloline_stage_service_seconds_count{stage="slow"}[RANGE])',
    'increase(sloline_stage_batch_size_count{stage="slow"}[RANGE])',
    "increase(sloline_request_admission_seconds_count[RANGE])",
    "increase(sloline_request_admission_seconds_sum[RANGE])",
    "increase(sloline_event_loop_lag_seconds_count[RANGE])",
    "max_over_time(sloline_arrival_envelope_requests_per_second[RANGE])",
    "sloline_arrival_envelope_window_seconds",
    "sloline_planned_envelope_window_seconds",
    "sloline_requests_created",
    "sloline_stage_queue_wait_seconds_created",
    'increase(process_cpu_seconds_total{job="sloline"}[RANGE])',
    'python_info{job="sloline"}',
    'increase(sloline_operator_reconciles_total{result="waiting"}[RANGE])',
    "increase(sloline_operator_reconcile_duration_seconds_count[RANGE])",
    "increase(sloline_operator_profiling_jobs_started_total[RANGE])",
    "increase(sloline_operator_plan_duration_seconds_count[RANGE])",
)


def _moving(prometheus: Prometheus, window: str, at: float) -> list[str]:
    """The MOVING queries with no series above 0 in `window` before `at`."""
    still = []
    for query in MOVING:
        expr = query.replace("RANGE", window)
        result = _api(prometheus, "query", query=f"({expr}) > 0", time=str(at))["result"]
        if not result:
            still.append(expr)
    return still


def _float_labels(prometheus: Prometheus, start: float) -> list[str]:
    """Label values of sloline's scraped series that parse as a number, other than `le`,
    `quantile`, status codes and window indexes (small integers)."""
    series = _api(
        prometheus, "series", **{"match[]": '{__name__=~"sloline_.+"}', "start": str(start)}
    )
    assert len(series) > 50
    found = []
    for labels in series:
        for label, value in labels.items():
            if label in ("le", "quantile") or label == "__name__":
                continue
            try:
                float(value)
            except ValueError:
                continue
            if not (label in ("code", "window") and value.isdigit() and len(value) <= 3):
                found.append(f"{labels['__name__']}{{{label}={value!r}}}")
    return found


def test_every_dashboard_query_returns_data(
    tmp_path: Path, sleepy_session: PlanningSession
) -> None:
    board = json.loads(DASHBOARD.read_text())
    plan = sleepy_session.plan
    registry = CollectorRegistry()
    operator_metrics = OperatorMetrics(registry)
    operator_port, stop = free_port(), threading.Event()
    server, _ = start_http_server(operator_port, addr="127.0.0.1", registry=registry)
    activity = threading.Thread(target=_operator_activity, args=(operator_metrics, stop))
    activity.start()
    with BackgroundPipeline(SLEEPY, plan=plan, tuner=TUNER) as served:
        prometheus = Prometheus(
            tmp_path,
            [],
            free_port(),
            scrape_configs=[
                {
                    "job_name": "sloline",
                    "static_configs": [
                        {"targets": [served.http_url], "labels": {"namespace": "team-a"}}
                    ],
                },
                {  # as the chart's ServiceMonitor for the operator: its labels win
                    "job_name": "sloline-operator",
                    "honor_labels": True,
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{operator_port}"],
                            "labels": {"namespace": "sloline-system"},
                        }
                    ],
                },
            ],
        )
        try:
            prometheus.wait_ready()
            _wait_for(prometheus, 'sloline_slo_seconds{pipeline="sleepy"}')
            start = time.time()
            load = threading.Thread(
                target=lambda: asyncio.run(open_loop(served.grpc_url, PHASES)), daemon=True
            )
            load.start()
            _deadline_misses(served.http_url, 5)
            load.join(60)
            assert not load.is_alive()
            # The scale-up and the 504s have been scraped, and a few more points after them.
            _wait_for(prometheus, 'sum(sloline_tuner_decisions_total{pipeline="sleepy"}) > 0')
            _wait_for(prometheus, 'sloline_requests_total{pipeline="sleepy", code="504"}')
            # Two more scrapes: the last rate windows see the tail of the load.
            scrapes = _scrapes(prometheus)
            _wait_for(prometheus, f'count_over_time(up{{job="sloline"}}[1h]) >= {scrapes + 2}')
            end = time.time()
            variables = {
                "pipeline": "sleepy",
                "stage": "(parse|slow)",  # Grafana's value of a multi-value "All"
                "namespace": "(team-a)",  # Grafana's value of a multi-value "All"
                "window": str(len(plan.envelope.windows_s) - 1),  # sort: numerical desc
                "__rate_interval": RATE_INTERVAL,
                "__range": f"{math.ceil(end - start)}s",
                "datasource": "unused",
            }
            empty: list[Any] = []
            still: list[str] = []
            floats: list[str] = []
            for panel in board["panels"]:
                for target in panel.get("targets", []):
                    expr = _expand(target["expr"], variables)
                    if target.get("instant"):
                        result = _api(prometheus, "query", query=expr, time=str(end))["result"]
                        ok = any(_finite([s["value"]]) for s in result)
                    else:
                        result = _api(
                            prometheus,
                            "query_range",
                            query=expr,
                            start=str(start),
                            end=str(end),
                            step="1",
                        )["result"]
                        ok = any(_finite(s["values"]) for s in result)
                    if not ok:
                        empty.append((panel["title"], expr, result))
            for annotation in board["annotations"]["list"]:
                expr = _expand(annotation["expr"], variables)
                result = _api(
                    prometheus, "query_range", query=expr, start=str(start), end=str(end), step="1"
                )["result"]
                if not result:
                    empty.append(("annotation " + annotation["name"], expr, result))
            still.extend(_moving(prometheus, f"{math.ceil(end - start)}s", end))
            floats.extend(_float_labels(prometheus, start))
            for variable in board["templating"]["list"]:
                if variable["type"] != "query":
                    continue
                # label_values(selector, label): Grafana asks the label values API.
                selector, label = variable["query"][len("label_values(") : -1].rsplit(", ", 1)
                values = _api(
                    prometheus,
                    f"label/{label}/values",
                    **{"match[]": _expand(selector, variables), "start": str(start)},
                )
                if not values:
                    empty.append(("variable " + variable["name"], selector, values))
        finally:
            prometheus.stop()
            stop.set()
            activity.join()
            server.shutdown()
    assert not empty, "queries without data:\n" + "\n".join(map(str, empty))
    assert not still, f"series that did not move under load: {still}"
    assert not floats, f"label values that are floats: {floats}"
