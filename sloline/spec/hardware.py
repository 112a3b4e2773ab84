"""The hardware catalog: classes a stage replica can run on, what they cost, and how a
replica obtains one in each backend (embedded: CPU threads / core set / CUDA device;
Kubernetes: resources, nodeSelector, tolerations).

The embedded default offers CPU classes of different size and price so the planner has
a real choice on any machine; users replace it with a YAML file (`--catalog`) or, on
Kubernetes, through Helm values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from sloline.spec.models import NAME_PATTERN, SpecModel
from sloline.spec.validate import Issue, PipelineError


class EmbeddedPlacement(SpecModel):
    """How a local worker process gets this class: intra-op threads, optional CPU set,
    optional CUDA device index."""

    threads: int = Field(default=1, ge=1, le=256)
    cpus: list[int] | None = None
    cuda_device: int | None = Field(default=None, ge=0)


class KubernetesPlacement(SpecModel):
    resources: dict[str, dict[str, str]] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)


class HardwareClass(SpecModel):
    name: str = Field(pattern=NAME_PATTERN, max_length=40)
    accelerator: Literal["cpu", "gpu"] = "cpu"
    cost_per_hour: float = Field(ge=0)
    embedded: EmbeddedPlacement = Field(default_factory=EmbeddedPlacement)
    kubernetes: KubernetesPlacement = Field(default_factory=KubernetesPlacement)


class HardwareCatalog(SpecModel):
    classes: list[HardwareClass] = Field(min_length=1)

    def get(self, name: str) -> HardwareClass:
        for hw in self.classes:
            if hw.name == name:
                return hw
        raise KeyError(f"hardware class {name!r} is not in the catalog ({self.names()})")

    def names(self) -> list[str]:
        return [hw.name for hw in self.classes]


def _cpu(name: str, threads: int, cost: float) -> HardwareClass:
    cpu = f"{threads * 1000}m"
    return HardwareClass(
        name=name,
        cost_per_hour=cost,
        embedded=EmbeddedPlacement(threads=threads),
        kubernetes=KubernetesPlacement(
            resources={"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"cpu": cpu}}
        ),
    )


# Prices follow the usual cloud ratio of about $0.05 per vCPU-hour.
DEFAULT_CATALOG = HardwareCatalog(classes=[_cpu("cpu-1", 1, 0.05), _cpu("cpu-2", 2, 0.10)])


def load_catalog(path: str | Path) -> HardwareCatalog:
    """Read a catalog YAML file (`classes: [...]`), raising `PipelineError` on problems."""
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PipelineError([Issue("(file)", str(exc))], source) from None
    try:
        return HardwareCatalog.model_validate(data)
    except ValidationError as exc:
        issues = [Issue(".".join(str(p) for p in e["loc"]), e["msg"]) for e in exc.errors()]
        raise PipelineError(issues, source) from None
