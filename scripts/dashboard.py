"""The Grafana dashboard "SLO attainment", built with grafana-foundation-sdk builders.

The panels are data (:data:`ROWS`: title, PromQL, unit, width); :func:`build` turns them
into an SDK dashboard and :func:`dashboard_json` into the JSON the Helm chart ships as
``helm/sloline/files/dashboards/slo-attainment.json``. Regenerate that file with::

    python scripts/dashboard.py helm/sloline/files/dashboards/slo-attainment.json

(a test checks it is in sync, and another runs every query against a real Prometheus).
Queries use only the metrics of :mod:`sloline.serving.metrics` and no hard-coded SLO:
targets come from ``sloline_slo_seconds`` / ``sloline_slo_percentile``. Every query
selects ``$namespace`` and series are aggregated ``by (namespace, pipeline, ...)``, so
pipelines of the same name in two namespaces stay apart, and several router replicas add
up (rates, ready workers) or de-duplicate (``max``: targets, desired replicas, cost).

Needs the ``grafana-foundation-sdk`` package (a dev dependency), which is why this lives
outside the ``sloline`` package; the shipped JSON does not.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

__all__ = ["ROWS", "UID", "Panel", "Query", "build", "dashboard_json", "main"]

UID = "sloline-slo-attainment"
TITLE = "SLO attainment"

_N = 'namespace=~"$namespace"'
_P = f'{_N}, pipeline=~"$pipeline"'
_S = f'{_P}, stage=~"$stage"'
_RI = "$__rate_interval"


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL target of a panel; ``instant`` for single-value (stat) panels."""

    expr: str
    legend: str
    instant: bool = False


@dataclass(frozen=True, slots=True)
class Panel:
    """A panel as data: what it shows, its queries, unit and width (of 24 columns)."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str
    width: int
    kind: Literal["timeseries", "bars", "stat"] = "timeseries"
    threshold: float | None = None  # a red line at this value
    height: int = 8


def _ratio_of_requests(numerator: str, window: str) -> str:
    return (
        f"sum by (namespace, pipeline) (rate({numerator}[{window}])) / "
        f"sum by (namespace, pipeline) (rate(sloline_requests_total{{{_P}}}[{window}]))"
    )


_ENVELOPE = (
    "sum by (namespace, pipeline, window) (max_over_time("
    f"sloline_arrival_envelope_requests_per_second{{{_P}}}[{_RI}]))"
)
_PLANNED = (
    f"max by (namespace, pipeline, window) (sloline_planned_envelope_requests_per_second{{{_P}}})"
)
_TARGET = Query(
    f"max by (namespace, pipeline) (sloline_slo_percentile{{{_P}}}) / 100",
    "{{namespace}}/{{pipeline}} target",
)

ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "SLO",
        (
            Panel(
                "Attainment over the time range",
                "Share of requests answered within the SLO over the dashboard's time range "
                "(failed and rejected requests count as misses), next to the target "
                "(the SLO percentile).",
                (
                    Query(
                        "1 - sum by (namespace, pipeline) (increase("
                        f"sloline_slo_miss_total{{{_P}}}[$__range])) / "
                        "sum by (namespace, pipeline) (increase("
                        f"sloline_requests_total{{{_P}}}[$__range]))",
                        "{{namespace}}/{{pipeline}}",
                        instant=True,
                    ),
                    Query(_TARGET.expr, _TARGET.legend, instant=True),
                ),
                "percentunit",
                6,
                kind="stat",
            ),
            Panel(
                "Attainment (5 min) vs target",
                "Share of requests within the SLO over the last 5 minutes at each point; "
                "below the target line the error budget burns (see the SLO alerts).",
                (
                    Query(
                        "1 - " + _ratio_of_requests(f"sloline_slo_miss_total{{{_P}}}", "5m"),
                        "{{namespace}}/{{pipeline}} attainment",
                    ),
                    _TARGET,
                ),
                "percentunit",
                9,
            ),
            Panel(
                "End-to-end latency P50 / P99 vs SLO",
                "Quantiles of the router's end-to-end latency histogram (it has a bucket "
                "bound at the SLO, so P99 crosses the SLO line exactly when more than 1% "
                "of requests miss it).",
                (
                    Query(
                        "histogram_quantile(0.5, sum by (namespace, pipeline, le) (rate("
                        f"sloline_request_latency_seconds_bucket{{{_P}}}[{_RI}])))",
                        "{{namespace}}/{{pipeline}} P50",
                    ),
                    Query(
                        "histogram_quantile(0.99, sum by (namespace, pipeline, le) (rate("
                        f"sloline_request_latency_seconds_bucket{{{_P}}}[{_RI}])))",
                        "{{namespace}}/{{pipeline}} P99",
                    ),
                    Query(
                        f"max by (namespace, pipeline) (sloline_slo_seconds{{{_P}}})",
                        "{{namespace}}/{{pipeline}} SLO",
                    ),
                ),
                "s",
                9,
            ),
        ),
    ),
    (
        "Traffic",
        (
            Panel(
                "Request rate and traffic envelope",
                "Requests per second, and the max arrival rate in any window of the selected "
                "size (window $window, 0 the shortest; sizes in "
                "sloline_arrival_envelope_window_seconds): observed by the router(s) and "
                "planned (the planning trace's envelope the deployment was sized for).",
                (
                    Query(
                        "sum by (namespace, pipeline) (rate("
                        f"sloline_requests_total{{{_P}}}[{_RI}]))",
                        "{{namespace}}/{{pipeline}} requests/s",
                    ),
                    Query(
                        "sum by (namespace, pipeline, window) (max_over_time("
                        "sloline_arrival_envelope_requests_per_second"
                        f'{{{_P}, window=~"$window"}}[{_RI}]))',
                        "{{namespace}}/{{pipeline}} observed envelope (window {{window}})",
                    ),
                    Query(
                        "max by (namespace, pipeline, window) ("
                        "sloline_planned_envelope_requests_per_second"
                        f'{{{_P}, window=~"$window"}})',
                        "{{namespace}}/{{pipeline}} planned envelope (window {{window}})",
                    ),
                ),
                "reqps",
                8,
            ),
            Panel(
                "Observed / planned envelope",
                "The largest ratio, over all window sizes, of the observed to the planned "
                "traffic envelope. Above 1 the traffic is faster or burstier than planned "
                "at some time scale, which is what makes the tuner add replicas.",
                (
                    Query(
                        f"max by (namespace, pipeline) ({_ENVELOPE} / ({_PLANNED} > 0))",
                        "{{namespace}}/{{pipeline}}",
                    ),
                ),
                "none",
                8,
                threshold=1.0,
            ),
            Panel(
                "Time to admission",
                "Per admitted request, the router's receipt to its admission (request "
                "checks, the admission estimate): P99 and mean, with the event loop's lag "
                "(the wait before the router sees a request) at P99.",
                (
                    Query(
                        "histogram_quantile(0.99, sum by (namespace, pipeline, le) (rate("
                        f"sloline_request_admission_seconds_bucket{{{_P}}}[{_RI}])))",
                        "{{namespace}}/{{pipeline}} P99",
                    ),
                    Query(
                        "sum by (namespace, pipeline) (rate("
                        f"sloline_request_admission_seconds_sum{{{_P}}}[{_RI}])) / "
                        "sum by (namespace, pipeline) (rate("
                        f"sloline_request_admission_seconds_count{{{_P}}}[{_RI}]))",
                        "{{namespace}}/{{pipeline}} mean",
                    ),
                    Query(
                        "histogram_quantile(0.99, sum by (namespace, pipeline, le) (rate("
                        f"sloline_event_loop_lag_seconds_bucket{{{_P}}}[{_RI}])))",
                        "{{namespace}}/{{pipeline}} event loop lag P99",
                    ),
                ),
                "s",
                8,
            ),
        ),
    ),
    (
        "Stages",
        (
            Panel(
                "Replicas (desired / ready)",
                "Desired replicas per stage (plan, then tuner) and ready ones (workers "
                "connected to the router).",
                (
                    Query(
                        "max by (namespace, pipeline, stage) (sloline_stage_replicas"
                        f'{{{_S}, state="desired"}})',
                        "{{stage}} desired",
                    ),
                    Query(
                        "sum by (namespace, pipeline, stage) ("
                        f'sloline_stage_replicas{{{_S}, state="ready"}})',
                        "{{stage}} ready",
                    ),
                ),
                "none",
                8,
            ),
            Panel(
                "Queue length",
                "Items waiting in each stage's queue; a queue that never drains means the "
                "stage is short of replicas.",
                (
                    Query(
                        f"sum by (namespace, pipeline, stage) (sloline_stage_queue_length{{{_S}}})",
                        "{{stage}}",
                    ),
                ),
                "none",
                8,
            ),
            Panel(
                "Queue wait per item",
                "Per item, the wait in the stage's queue from enqueued to dispatched to a "
                "worker (Triton's queue duration): P99 and mean.",
                (
                    Query(
                        "histogram_quantile(0.99, sum by (namespace, pipeline, stage, le) (rate("
                        f"sloline_stage_queue_wait_seconds_bucket{{{_S}}}[{_RI}])))",
                        "{{stage}} P99",
                    ),
                    Query(
                        "sum by (namespace, pipeline, stage) (rate("
                        f"sloline_stage_queue_wait_seconds_sum{{{_S}}}[{_RI}])) / "
                        "sum by (namespace, pipeline, stage) (rate("
                        f"sloline_stage_queue_wait_seconds_count{{{_S}}}[{_RI}]))",
                        "{{stage}} mean",
                    ),
                ),
                "s",
                8,
            ),
            Panel(
                "Mean batch size",
                "Items per dispatched batch, averaged over the rate interval.",
                (
                    Query(
                        "sum by (namespace, pipeline, stage) (rate(sloline_stage_batch_size_sum"
                        f"{{{_S}}}[{_RI}])) / sum by (namespace, pipeline, stage) (rate("
                        f"sloline_stage_batch_size_count{{{_S}}}[{_RI}]))",
                        "{{stage}}",
                    ),
                ),
                "none",
                8,
            ),
            Panel(
                "Service time per batch",
                "Model time per batch measured in the workers: P99 and mean.",
                (
                    Query(
                        "histogram_quantile(0.99, sum by (namespace, pipeline, stage, le) (rate("
                        f"sloline_stage_service_seconds_bucket{{{_S}}}[{_RI}])))",
                        "{{stage}} P99",
                    ),
                    Query(
                        "sum by (namespace, pipeline, stage) (rate("
                        f"sloline_stage_service_seconds_sum{{{_S}}}[{_RI}])) / "
                        "sum by (namespace, pipeline, stage) (rate("
                        f"sloline_stage_service_seconds_count{{{_S}}}[{_RI}]))",
                        "{{stage}} mean",
                    ),
                ),
                "s",
                8,
            ),
            Panel(
                "Cost per hour",
                "Hardware cost of the desired replicas: per stage and the pipeline's total.",
                (
                    Query(
                        "max by (namespace, pipeline, stage) ("
                        f"sloline_stage_cost_per_hour{{{_S}}})",
                        "{{stage}}",
                    ),
                    Query(
                        "sum by (namespace, pipeline) (max by (namespace, pipeline, stage) ("
                        f"sloline_stage_cost_per_hour{{{_P}}}))",
                        "{{namespace}}/{{pipeline}} total",
                    ),
                ),
                "currencyUSD",
                8,
            ),
            Panel(
                "Tuner decisions",
                "Replica changes the tuner applied, per stage and direction (also shown as "
                "annotations on every panel).",
                (
                    Query(
                        "sum by (namespace, pipeline, stage, direction) (increase("
                        f"sloline_tuner_decisions_total{{{_S}}}[{_RI}]))",
                        "{{stage}} {{direction}}",
                    ),
                ),
                "none",
                8,
                kind="bars",
            ),
            Panel(
                "Credit messages per batch",
                "With several routers: the messages that moved the workers' one credit "
                "between routers (grants, withdrawals and the routers' answers and notices), "
                "per dispatched batch, over all the pipeline's routers; 0 with one router.",
                (
                    Query(
                        "sum by (namespace, pipeline, stage) (rate("
                        f"sloline_stage_credit_messages_total{{{_S}}}[{_RI}])) / "
                        "sum by (namespace, pipeline, stage) (rate("
                        f"sloline_stage_batch_size_count{{{_S}}}[{_RI}]))",
                        "{{stage}}",
                    ),
                ),
                "none",
                8,
            ),
        ),
    ),
    (
        "Errors",
        (
            Panel(
                "Failed requests (share)",
                "Share of requests answered with a 5xx status: 503 (overload), "
                "504 (deadline), 500 (a stage failed).",
                (
                    Query(
                        "(sum by (namespace, pipeline) (rate("
                        f'sloline_requests_total{{{_P}, code=~"5.."}}[{_RI}])) or 0 * '
                        "sum by (namespace, pipeline) (rate("
                        f"sloline_requests_total{{{_P}}}[{_RI}]))) / "
                        "sum by (namespace, pipeline) (rate("
                        f"sloline_requests_total{{{_P}}}[{_RI}]))",
                        "{{namespace}}/{{pipeline}}",
                    ),
                ),
                "percentunit",
                8,
                threshold=0.05,
            ),
            Panel(
                "Failed requests by status code",
                "Requests per second answered with an error, by status code.",
                (
                    Query(
                        "sum by (namespace, pipeline, code) (rate(sloline_requests_total"
                        f'{{{_P}, code!="200"}}[{_RI}]))',
                        "{{namespace}}/{{pipeline}} {{code}}",
                    ),
                ),
                "reqps",
                8,
            ),
            Panel(
                "Stage errors and re-queued items",
                "Items failed in a stage (model_error: the model raised; worker_lost: a "
                "request that kept killing its worker, isolated and failed) and items "
                "re-queued after their worker died.",
                (
                    Query(
                        "sum by (namespace, pipeline, stage, reason) (rate("
                        f"sloline_stage_errors_total{{{_S}}}[{_RI}]))",
                        "{{stage}} {{reason}}",
                    ),
                    Query(
                        "sum by (namespace, pipeline, stage) (rate("
                        f"sloline_stage_requeued_items_total{{{_S}}}[{_RI}]))",
                        "{{stage}} re-queued",
                    ),
                ),
                "none",
                8,
            ),
        ),
    ),
    (
        "Operator",
        (
            Panel(
                "Reconciles by result",
                "Reconciles of the namespace's PredictionPipelines per second: ok "
                "(deployed), waiting (profiling Jobs run), failed (until the object "
                "changes), error (an API error, retried).",
                (
                    Query(
                        "sum by (namespace, result) (rate(sloline_operator_reconciles_total"
                        f"{{{_N}}}[{_RI}]))",
                        "{{namespace}} {{result}}",
                    ),
                ),
                "ops",
                8,
            ),
            Panel(
                "Reconcile duration",
                "Time one reconcile takes, P99 by result.",
                (
                    Query(
                        "histogram_quantile(0.99, sum by (namespace, result, le) (rate("
                        f"sloline_operator_reconcile_duration_seconds_bucket{{{_N}}}[{_RI}])))",
                        "{{namespace}} {{result}} P99",
                    ),
                ),
                "s",
                8,
            ),
            Panel(
                "Reconcile errors by reason",
                "Reconciles that ended in an error, by reason (the condition reason: "
                "InvalidSpec, ProfilingFailed, Infeasible, InternalError; ApiError).",
                (
                    Query(
                        "sum by (namespace, reason) (increase("
                        f"sloline_operator_reconcile_errors_total{{{_N}}}[{_RI}]))",
                        "{{namespace}} {{reason}}",
                    ),
                ),
                "none",
                8,
                kind="bars",
            ),
            Panel(
                "Profiling Jobs",
                "Profiling Jobs the operator started, and those it harvested by result.",
                (
                    Query(
                        "sum by (namespace) (increase("
                        f"sloline_operator_profiling_jobs_started_total{{{_N}}}[{_RI}]))",
                        "{{namespace}} started",
                    ),
                    Query(
                        "sum by (namespace, result) (increase("
                        f"sloline_operator_profiling_jobs_finished_total{{{_N}}}[{_RI}]))",
                        "{{namespace}} {{result}}",
                    ),
                ),
                "none",
                12,
                kind="bars",
            ),
            Panel(
                "Planning time",
                "Time the planner took per planning (mean over the rate interval).",
                (
                    Query(
                        "sum by (namespace) (rate("
                        f"sloline_operator_plan_duration_seconds_sum{{{_N}}}[{_RI}])) / "
                        "sum by (namespace) (rate("
                        f"sloline_operator_plan_duration_seconds_count{{{_N}}}[{_RI}]))",
                        "{{namespace}} mean",
                    ),
                ),
                "s",
                12,
            ),
        ),
    ),
)

TUNER_ANNOTATION_EXPR = (
    "sum by (namespace, pipeline, stage, direction) (increase("
    f"sloline_tuner_decisions_total{{{_P}}}[{_RI}])) > 0"
)

_DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Target series drawn as dashed red lines: the SLO, the attainment target.
_TARGET_STYLE = [
    dm.DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
    dm.DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "red"}),
]


def _targets(panel: Panel) -> list[Builder[Dataquery]]:
    targets: list[Builder[Dataquery]] = []
    for i, query in enumerate(panel.queries):
        target = (
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(chr(ord("A") + i))
            .datasource(_DATASOURCE)
        )
        targets.append(target.instant() if query.instant else target.range())
    return targets


def _stat() -> stat.Panel:
    return (
        stat.Panel()
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
        .color_mode(cm.BigValueColorMode.NONE)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .decimals(2)
    )


def _timeseries(panel: Panel) -> timeseries.Panel:
    built = (
        timeseries.Panel()
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.NONE))
        .line_width(1)
        .fill_opacity(80 if panel.kind == "bars" else 0)
        .draw_style(cm.GraphDrawStyle.BARS if panel.kind == "bars" else cm.GraphDrawStyle.LINE)
        .override_by_regexp(".* (SLO|target)$", _TARGET_STYLE)
    )
    if panel.threshold is not None:
        built = built.thresholds(
            db.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(None, "green"), dm.Threshold(panel.threshold, "red")])
        ).thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.LINE))
    return built


def build() -> dm.Dashboard:
    """The dashboard as an SDK model: variables, the tuner annotation, rows of panels."""
    builder = (
        db.Dashboard(TITLE)
        .uid(UID)
        .description(
            "sloline: per-pipeline SLO attainment vs target, latency vs SLO, traffic vs "
            "the planned envelope, per-stage replicas, queues, batches, cost and tuner "
            "decisions."
        )
        .tags(["sloline"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            _query_variable("namespace", "label_values(sloline_requests_total, namespace)")
            # Embedded mode's series have no namespace: "All" matches them too.
            .all_value(".*")
        )
        .with_variable(
            _query_variable("pipeline", f"label_values(sloline_requests_total{{{_N}}}, pipeline)")
        )
        .with_variable(
            _query_variable("stage", f"label_values(sloline_stage_queue_length{{{_P}}}, stage)")
        )
        .with_variable(
            db.QueryVariable("window")
            .label("Envelope window")
            .description(
                "Window of the traffic envelope shown with the request rate, by index (0 is "
                "the shortest; sloline_arrival_envelope_window_seconds has each size)."
            )
            .datasource(_DATASOURCE)
            .query(f"label_values(sloline_arrival_envelope_requests_per_second{{{_P}}}, window)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.NUMERICAL_DESC)
        )
        .annotation(
            db.AnnotationQuery()
            .name("Tuner decisions")
            .datasource(_DATASOURCE)
            .enable(True)
            .icon_color("orange")
            .expr(TUNER_ANNOTATION_EXPR)
        )
    )
    next_id = 1
    for row_title, panels in ROWS:
        builder = builder.with_row(db.Row(row_title).id(next_id))
        next_id += 1
        for panel in panels:
            built = _stat() if panel.kind == "stat" else _timeseries(panel)
            builder = builder.with_panel(
                built.id(next_id)
                .title(panel.title)
                .description(panel.description)
                .datasource(_DATASOURCE)
                .unit(panel.unit)
                .span(panel.width)
                .height(panel.height)
                .targets(_targets(panel))
            )
            next_id += 1
    return builder.build()


def _query_variable(name: str, query: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(name.capitalize())
        .datasource(_DATASOURCE)
        .query(query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
    )


def dashboard_json() -> str:
    """The dashboard as stable, diff-friendly JSON (sorted keys, trailing newline)."""
    as_dict: dict[str, Any] = json.loads(json.dumps(build(), cls=JSONEncoder))
    return json.dumps(as_dict, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the dashboard JSON to the file given, or to stdout."""
    args = sys.argv[1:] if argv is None else argv
    text = dashboard_json()
    if args:
        Path(args[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(args[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
