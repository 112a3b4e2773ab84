"""The hardware catalog: classes a stage replica can run on, what they cost, how many
devices a class has, and how a replica obtains one in each backend (embedded: CPU
threads / core set / CUDA device; Kubernetes: resources, nodeSelector, tolerations).

A class's ``devices`` bounds how many replicas of it the pipeline's stages may have
together (each replica takes one whole device); without it the class is unbounded, as a
cloud or Kubernetes class whose every replica gets a pod of its own. A catalog file
(:func:`load_catalog`, ``--catalog``) describes the machine the embedded mode runs on, so
there a class with ``embedded.cudaDevice`` is that one device: ``devices`` 1 where
unset, and more is an error (:func:`on_this_machine`).

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
    devices: int | None = Field(
        default=None,
        ge=1,
        description="How many devices of this class the pipeline can use: each replica "
        "takes one whole device, and all stages together have at most this many replicas "
        "of the class. Unset: unbounded (each replica gets its own, as a Kubernetes pod), "
        "except in a `--catalog` file, where a class with `embedded.cudaDevice` is 1.",
    )
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


def on_this_machine(catalog: HardwareCatalog, source: str = "catalog") -> HardwareCatalog:
    """The catalog as the embedded mode runs it on this machine: every replica of a class
    with ``embedded.cudaDevice`` runs on that one device, so the class has ``devices`` 1
    where unset; a larger ``devices`` would let the planner count replicas that share the
    device as devices of their own, and raises `PipelineError` (list one class per GPU
    instead)."""
    issues = [
        Issue(
            f"classes.{i}.devices",
            f"class {hw.name!r} runs every replica on embedded.cudaDevice "
            f"{hw.embedded.cuda_device}, one device: devices must be 1 or unset, got "
            f"{hw.devices} (list one class per GPU instead)",
        )
        for i, hw in enumerate(catalog.classes)
        if hw.embedded.cuda_device is not None and (hw.devices or 1) > 1
    ]
    if issues:
        raise PipelineError(issues, source)
    return HardwareCatalog(
        classes=[
            hw.model_copy(update={"devices": 1})
            if hw.embedded.cuda_device is not None and hw.devices is None
            else hw
            for hw in catalog.classes
        ]
    )


def load_catalog(path: str | Path) -> HardwareCatalog:
    """Read a catalog YAML file (`classes: [...]`) for this machine (:func:`on_this_machine`),
    raising `PipelineError` on problems."""
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PipelineError([Issue("(file)", str(exc))], source) from None
    try:
        catalog = HardwareCatalog.model_validate(data)
    except ValidationError as exc:
        issues = [Issue(".".join(str(p) for p in e["loc"]), e["msg"]) for e in exc.errors()]
        raise PipelineError(issues, source) from None
    return on_this_machine(catalog, source)
