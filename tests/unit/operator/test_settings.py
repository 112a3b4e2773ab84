"""The operator's settings file: the documented YAML parses key for key, every key is
optional, and mistakes are reported with their field paths."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from sloline.operator.settings import (
    CONFIG_ENV,
    OperatorSettings,
    TunerOverrides,
    load_settings,
    parse_settings,
)
from sloline.spec import DEFAULT_CATALOG, PipelineError
from sloline.tuner.policy import TunerSettings

ROOT = Path(__file__).resolve().parents[3]


def documented_settings() -> dict:
    """The settings block of docs/kubernetes.md ("Operator configuration")."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    section = text.split("## Operator configuration", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, "docs/kubernetes.md lost its settings example"
    return yaml.safe_load(block.group(1).replace("[...]", "[{name: cpu-1, costPerHour: 0.05}]"))


def test_documented_example_parses_key_for_key() -> None:
    data = documented_settings()
    settings = parse_settings(data)
    assert settings.runtime_image == data["runtimeImage"]
    assert settings.models.root == data["models"]["root"]
    assert settings.profiling.active_deadline_s == data["profiling"]["activeDeadlineS"]
    assert settings.tuner.interval_s == data["tuner"]["intervalS"]
    assert settings.service_monitor == data["serviceMonitor"]


def test_chart_values_settings_parse() -> None:
    values = yaml.safe_load((ROOT / "helm" / "sloline" / "values.yaml").read_text())
    settings = parse_settings({**values["settings"], "runtimeImage": "r:1"})
    assert settings.catalog.names() == ["cpu-1", "cpu-2"]


def test_defaults_without_a_file() -> None:
    settings = load_settings(None, environ={})
    assert settings == OperatorSettings()
    assert settings.catalog == DEFAULT_CATALOG
    assert settings.prometheus_url == ""
    assert settings.service_monitor == "auto"


def test_file_from_flag_or_environment(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("prometheusUrl: http://prometheus:9090\nprofiling: {cap: 8}\n")
    from_env = load_settings(None, environ={CONFIG_ENV: str(path)})
    assert from_env.prometheus_url == "http://prometheus:9090"
    assert from_env.profiling.cap == 8
    assert load_settings(path, environ={CONFIG_ENV: "/nonexistent"}) == from_env


def test_errors_name_every_field(tmp_path: Path) -> None:
    with pytest.raises(PipelineError) as caught:
        parse_settings(
            {
                "profiling": {"cap": 0, "budgetS": 1, "bogus": 1},
                "serviceMonitor": "sometimes",
                "prometheusUrl": "prometheus:9090",
                "models": {"volume": {"emptyDir": {}, "hostPath": {"path": "/m"}}},
                "catalog": {"classes": [{"name": "a", "costPerHour": 1}] * 2},
            }
        )
    paths = {issue.path: issue.reason for issue in caught.value.issues}
    assert set(paths) == {
        "profiling.cap",
        "profiling.bogus",
        "serviceMonitor",
        "prometheusUrl",
        "models.volume",
        "catalog",
    }
    assert paths["profiling.bogus"] == "unknown key"
    assert "'sometimes'" in paths["serviceMonitor"]
    assert "repeated: ['a']" in paths["catalog"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("tuner: [1, 2\n")
    with pytest.raises(PipelineError, match="not valid YAML"):
        load_settings(bad, environ={})
    with pytest.raises(PipelineError, match="expected a mapping"):
        parse_settings([1, 2])


def test_tuner_overrides_cover_every_tuner_setting() -> None:
    """Every TunerSettings field but the plan's windows can be set, camelCase."""
    tuner_fields = {f.name for f in dataclasses.fields(TunerSettings)}
    assert tuner_fields - set(TunerOverrides.model_fields) == {"window_base_s", "window_max_s"}
    overrides = parse_settings(
        {"tuner": {"intervalS": 2, "stabilizationS": 30, "scaleDownEnabled": False}}
    ).tuner
    settings = overrides.tuner_settings(0.01, 40.96)
    assert (settings.interval_s, settings.stabilization_s) == (2.0, 30.0)
    assert settings.scale_down_enabled is False
    assert settings.lambda_window_s == TunerSettings(0.01).lambda_window_s
    assert settings.windows_s[0] == 0.01


def test_cli_reports_a_bad_settings_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sloline.cli import main

    bad = tmp_path / "config.yaml"
    bad.write_text("profiling: {cap: -1}\n")
    assert main(["operator", "--config", str(bad)]) == 2
    assert "profiling.cap" in capsys.readouterr().err
