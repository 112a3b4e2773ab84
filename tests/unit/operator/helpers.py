"""Pipelines, catalogs and plans for the operator's unit tests (no cluster, no planner run)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from sloline.common.envelope import Envelope, window_sizes
from sloline.operator.naming import Target
from sloline.operator.settings import OperatorSettings, parse_settings
from sloline.planner.plan import Plan, StagePlan

ROOT = Path(__file__).resolve().parents[3]
NOOP = ROOT / "tests" / "support" / "pipelines" / "noop" / "pipeline.yaml"
DIGITS = ROOT / "examples" / "digits-cascade" / "pipeline.yaml"

GPU_SETTINGS: dict[str, Any] = {
    "runtimeImage": "registry.example/sloline-runtime@sha256:" + "a" * 64,
    "imagePullPolicy": "Always",
    "models": {"root": "/srv/models", "volume": {"persistentVolumeClaim": {"claimName": "m"}}},
    "router": {"resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}},
    "catalog": {
        "classes": [
            {
                "name": "cpu-2",
                "costPerHour": 0.1,
                "embedded": {"threads": 2},
                "kubernetes": {"resources": {"requests": {"cpu": "2000m", "memory": "1Gi"}}},
            },
            {
                "name": "gpu-l4",
                "accelerator": "gpu",
                "costPerHour": 0.8,
                "embedded": {"threads": 4, "cudaDevice": 0},
                "kubernetes": {
                    "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                        "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"},
                    },
                    "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                },
            },
        ]
    },
}


def gpu_settings() -> OperatorSettings:
    return parse_settings(copy.deepcopy(GPU_SETTINGS))


def pipeline_object(path: Path = NOOP, namespace: str = "team-a", **meta: Any) -> dict[str, Any]:
    """The pipeline as the API server returns it: with uid, generation and status."""
    doc = yaml.safe_load(path.read_text())
    doc["metadata"].update(
        namespace=namespace,
        uid="0b7e1c2a-5f1d-4c8e-9a51-6f1a2b3c4d5e",
        generation=3,
        resourceVersion="812",
        creationTimestamp="2026-11-22T08:00:00Z",
        **meta,
    )
    doc["status"] = {"phase": "Pending"}
    return doc


def target(path: Path = NOOP, **meta: Any) -> Target:
    return Target.of(pipeline_object(path, **meta))


def make_plan(t: Target, hardware: str = "cpu-1", replicas: int = 2) -> Plan:
    """A plan with the stages of `t` on one class, without running the planner."""
    windows = window_sizes(0.01, 40.96)
    stages = tuple(
        StagePlan(
            name=name,
            hardware=hardware,
            max_batch=4,
            replicas=replicas,
            cost_per_hour=0.05 * replicas,
            throughput_rps=200.0,
            rho=0.5,
            scale_factor=1.0,
            service_s=0.02,
            mean_batch=2.0,
            utilisation=0.4,
        )
        for name in t.graph.order
    )
    return Plan(
        pipeline=t.name,
        stages=stages,
        slo_s=0.1,
        percentile=99.0,
        cost_per_hour=sum(s.cost_per_hour for s in stages),
        p50_s=0.01,
        p99_s=0.04,
        tail_s=0.04,
        attainment=1.0,
        rate_rps=100.0,
        envelope=Envelope(windows, tuple(100.0 + 1000.0 / (i + 1) for i in range(len(windows)))),
    )
