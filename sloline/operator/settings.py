"""The operator's settings file (`sloline operator --config FILE`, docs/kubernetes.md).

The Helm chart renders this file from its values, key for key. Keys are camelCase like
the pipeline spec, every key is optional, unknown keys are errors (a misspelt key would
otherwise be silently ignored), and every problem is reported with its field path. The
file is read once, in the CLI, and the parsed settings are passed down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from sloline.spec.hardware import DEFAULT_CATALOG, HardwareCatalog
from sloline.spec.models import K8sObjects, PodTemplate, SpecModel
from sloline.spec.validate import Issue, PipelineError
from sloline.tuner.policy import TunerSettings

CONFIG_ENV = "SLOLINE_OPERATOR_CONFIG"
DEFAULT_RUNTIME_IMAGE = "ghcr.io/sloline/sloline-runtime:0.1.0"
RUNTIME_USER = 10001  # the runtime image's user and group (docker/Dockerfile.runtime)
Exposure = Literal["ingress", "httpRoute", "grpcRoute"]


class SettingsModel(SpecModel):
    """camelCase aliases, unknown keys rejected, immutable (like the spec models)."""


class ModelsSettings(SettingsModel):
    """Where every pipeline pod finds the pipeline's files: `<root>/<pipeline>`."""

    root: str = Field(default="/models", pattern=r"^/")
    volume: dict[str, Any] = Field(
        default_factory=dict,
        description="A pod volume source (e.g. {persistentVolumeClaim: {claimName: models}}) "
        "mounted read-only at root; {} = the files are in the runtime image.",
    )

    @field_validator("volume")
    @classmethod
    def _one_source(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > 1:
            raise ValueError(
                f"give one volume source (e.g. persistentVolumeClaim), got {sorted(value)}"
            )
        if "name" in value:
            raise ValueError("give only the volume source; the operator names the volume")
        return value


class ProfilingSettings(SettingsModel):
    """Profiling Jobs: one per (stage, hardware class) the profile cache lacks."""

    cap: int = Field(default=32, ge=1, le=4096, description="largest batch size profiled")
    repeats: int = Field(default=20, ge=1, le=10_000)
    budget_s: float = Field(default=2.0, gt=0, description="time budget per batch size")
    active_deadline_s: int = Field(default=900, ge=1, description="the Job's deadline")
    poll_s: float = Field(
        default=5.0, gt=0, description="how often the operator checks running profiling Jobs"
    )
    hop_s: float | None = Field(
        default=None,
        ge=0,
        description="router -> worker -> router overhead per stage visit the planner assumes; "
        "default: the median the Jobs measured on loopback",
    )


class TunerOverrides(SettingsModel):
    """The tuner daemon: its tick and any `TunerSettings` field (docs/tuner.md).

    The envelope windows (`windowBaseS`, `windowMaxS`) come from the plan, so the router's
    envelope gauges and the tuner agree window by window; they are not settings here.
    """

    interval_s: float = Field(default=5.0, gt=0)
    stabilization_s: float | None = Field(default=None, gt=0)
    lambda_lookback_s: float | None = Field(default=None, gt=0)
    lambda_window_s: float | None = Field(default=None, gt=0)
    envelope_lookback_s: float | None = Field(default=None, gt=0)
    scale_up_enabled: bool | None = None
    scale_down_enabled: bool | None = None
    down_respects_up_demand: bool | None = None
    lambda_rate_window_s: float | None = Field(
        default=None,
        gt=0,
        description="rate() window of the λ query; default lambdaWindowS (needs 1 s scrapes)",
    )
    max_replicas: int = Field(
        default=8, ge=1, le=1024, description="per stage, unless the spec sets maxReplicas"
    )

    def tuner_settings(self, window_base_s: float, window_max_s: float) -> TunerSettings:
        """`TunerSettings` for a plan's envelope windows, with these overrides."""
        names = {f.name for f in fields(TunerSettings)}
        given = {k: v for k, v in self.model_dump().items() if k in names and v is not None}
        return TunerSettings(window_base_s=window_base_s, window_max_s=window_max_s, **given)


class RouterDeploymentSettings(SettingsModel):
    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="the fewest routers per pipeline (every worker connects to each); the "
        "plan and the tuner may run more",
    )
    resources: dict[str, dict[str, str | int]] = Field(default_factory=dict)


class ObservabilitySettings(SettingsModel):
    """Logs and traces of every pipeline's pods (docs/operations.md), as their environment."""

    log_format: Literal["text", "json"] = "text"
    access_log_sample: float = Field(
        default=0.0, ge=0, le=1, description="fraction of requests in the router's access log"
    )
    otlp_endpoint: str = Field(
        default="",
        description="OTLP/gRPC endpoint the routers export request traces to; '' = off "
        "(the runtime image needs the otel extra)",
    )

    def env(self, service: str) -> list[dict[str, str]]:
        """The pods' environment entries for the settings that differ from the defaults."""
        env = []
        if self.log_format != "text":
            env.append({"name": "SLOLINE_LOG_FORMAT", "value": self.log_format})
        if self.access_log_sample:
            env.append({"name": "SLOLINE_ACCESS_LOG_SAMPLE", "value": repr(self.access_log_sample)})
        if self.otlp_endpoint:
            env += [
                {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": self.otlp_endpoint},
                {"name": "OTEL_SERVICE_NAME", "value": service},
            ]
        return env


def _default_pods() -> PodTemplate:
    return PodTemplate(security_context={"runAsUser": RUNTIME_USER, "runAsGroup": RUNTIME_USER})


class ExposureSettings(SettingsModel):
    """Defaults of the pipelines' Ingress and Gateway API routes (`spec.exposure`)."""

    enabled: list[Exposure] = Field(
        default_factory=list,
        description="what every pipeline gets even without spec.exposure",
    )
    host: str = Field(
        default="",
        max_length=253,
        description="host template of Ingresses and routes: {name} and {namespace} are the "
        "pipeline's; '' = every host",
    )
    ingress_class_name: str = Field(
        default="", max_length=253, description="'' = the cluster's default IngressClass"
    )
    ingress_annotations: dict[str, str] = Field(default_factory=dict)
    parent_refs: K8sObjects = Field(
        default_factory=list, description="the Gateway(s) the routes attach to"
    )

    @field_validator("host")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(name="p", namespace="n")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{name}} and {{namespace}} may be used ({exc})") from None
        return value


class OperatorSettings(SettingsModel):
    """Everything `sloline operator` is configured with (docs/kubernetes.md)."""

    runtime_image: str = Field(default=DEFAULT_RUNTIME_IMAGE, min_length=1)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    catalog: HardwareCatalog = DEFAULT_CATALOG
    prometheus_url: str = Field(default="", pattern=r"^(https?://.+)?$")
    models: ModelsSettings = Field(default_factory=ModelsSettings)
    profiling: ProfilingSettings = Field(default_factory=ProfilingSettings)
    tuner: TunerOverrides = Field(default_factory=TunerOverrides)
    router: RouterDeploymentSettings = Field(default_factory=RouterDeploymentSettings)
    service_monitor: Literal["auto", "always", "never"] = "auto"
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    pods: PodTemplate = Field(
        default_factory=_default_pods,
        description="defaults of every pipeline pod, under each pipeline's podTemplate",
    )
    exposure: ExposureSettings = Field(default_factory=ExposureSettings)

    @field_validator("catalog")
    @classmethod
    def _unique_classes(cls, value: HardwareCatalog) -> HardwareCatalog:
        names = value.names()
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"hardware class names must be unique; repeated: {twice}")
        return value


def parse_settings(data: Any, source: str = "operator settings") -> OperatorSettings:
    """Validate a decoded settings document; raise `PipelineError` with field paths."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PipelineError([Issue("(document)", "expected a mapping at the top level")], source)
    try:
        return OperatorSettings.model_validate(data)
    except ValidationError as exc:
        raise PipelineError([_issue(e) for e in exc.errors()], source) from None


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] = os.environ
) -> OperatorSettings:
    """Read the settings file `path`, else `$SLOLINE_OPERATOR_CONFIG`, else the defaults."""
    chosen = path or environ.get(CONFIG_ENV) or None
    if chosen is None:
        return OperatorSettings()
    source = str(chosen)
    try:
        text = Path(chosen).read_text()
    except OSError as exc:
        raise PipelineError([Issue("(file)", f"cannot read: {exc.strerror}")], source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PipelineError([Issue("(document)", f"not valid YAML: {exc}")], source) from None
    return parse_settings(data, source)


def _issue(error: Mapping[str, Any]) -> Issue:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    reason = str(error["msg"])
    if error["type"] == "extra_forbidden":
        reason = "unknown key"
    elif error["type"] == "value_error":
        reason = str(error.get("ctx", {}).get("error", reason))
    elif error["type"] == "literal_error":
        reason = f"{reason} (got {error['input']!r})"
    return Issue(path or "(document)", reason)
