"""The shipped Grafana dashboard: generated from sloline.monitoring.dashboard, lossless
through grafana-foundation-sdk's models, laid out on Grafana's 24-column grid, querying
only metrics sloline exports and variables it defines, documented in operations.md."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import prometheus
from grafana_foundation_sdk.models.dashboard import Dashboard

from sloline.monitoring.dashboard import dashboard_json
from tests.support.metrics import exported_metrics

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "helm" / "sloline" / "files" / "dashboards" / "slo-attainment.json"
GRAFANA_VARIABLES = {"__rate_interval", "__range"}


def _load() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels() -> list[dict[str, Any]]:
    return [p for p in _load()["panels"] if p["type"] != "row"]


def _exprs() -> list[str]:
    board = _load()
    return [
        *(t["expr"] for p in _panels() for t in p["targets"]),
        *(a["expr"] for a in board["annotations"]["list"]),
        *(v["query"] for v in board["templating"]["list"] if v["type"] == "query"),
    ]


def test_dashboard_file_in_sync_with_code() -> None:
    assert DASHBOARD.read_text() == dashboard_json(), (
        "the dashboard JSON is stale: regenerate with `python -m sloline.monitoring.dashboard "
        "helm/sloline/files/dashboards/slo-attainment.json`"
    )


def test_round_trips_through_sdk_models_without_loss() -> None:
    register_default_plugins()  # decode options and targets into typed models, not dicts
    board = _load()
    model = Dashboard.from_json(board)
    first = model.panels[1]
    assert isinstance(first.targets[0], prometheus.Dataquery)
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == board


def test_panel_ids_unique_and_grid_without_overlap() -> None:
    panels = _load()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(i > 0 for i in ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["h"] > 0
        assert pos["x"] + pos["w"] <= 24, f"{panel['title']} is wider than the grid"
        for cell in itertools.product(
            range(pos["x"], pos["x"] + pos["w"]), range(pos["y"], pos["y"] + pos["h"])
        ):
            assert cell not in cells, f"{panel['title']} overlaps {cells[cell]}"
            cells[cell] = panel["title"]
    assert all(p["gridPos"]["w"] == 24 for p in panels if p["type"] == "row")


def test_queries_use_exported_metrics_and_defined_variables() -> None:
    board = _load()
    variables = {v["name"] for v in board["templating"]["list"]} | GRAFANA_VARIABLES
    assert {"datasource", "pipeline", "stage"} <= variables
    series = set()
    for name, kind in exported_metrics().items():
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        series |= {name + s for s in suffixes}
    for expr in _exprs():
        for metric in re.findall(r"\bsloline_\w+", expr):
            assert metric in series, f"{metric} is not exported (in {expr})"
        for variable in re.findall(r"\$(\w+)", expr):
            assert variable in variables, f"${variable} is not defined (in {expr})"
    for panel in _panels():
        assert panel["datasource"]["uid"] == "${datasource}"
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_every_panel_and_query_is_documented() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text()
    for panel in _panels():
        assert panel["title"] in docs, f"panel {panel['title']!r} is not in docs/operations.md"
    for expr in _exprs():
        assert f"`{expr}`" in docs, f"docs/operations.md lacks the query {expr}"
