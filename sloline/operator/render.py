"""Render a PredictionPipeline into the Kubernetes objects that serve it: pure functions.

`(pipeline, plan, settings) -> manifests`, with the names, labels, commands, ports and
mounts fixed in docs/kubernetes.md (`naming.py` holds the names). Nothing here does I/O
or reads a clock, so the same inputs always give identical objects: the operator's apply
step compares what it renders with what is live, and a re-render after a restart changes
nothing.

This module renders the ConfigMaps, the routers' Services, NetworkPolicy and
PodDisruptionBudget, the worker token Secret and the ServiceMonitor, and composes
everything in `render`; the pods (router and worker Deployments, profiling Jobs) are in
`sloline.operator.pods`. The routers' worker port is reached through a headless Service
of its own, only by the pipeline's worker pods (a NetworkPolicy) and only with the
pipeline's worker token (`<p>-worker-token`, a Secret the operator creates once and
keeps; `render_worker_secret`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import yaml

from sloline.operator.naming import (
    ANNOTATION_PLAN_INPUTS,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    WORKER_PORT,
    WORKER_TOKEN_KEY,
    Target,
    config_map_name,
    labels,
    profiles_name,
    router_name,
    selector,
    worker_secret_name,
    worker_service_name,
)
from sloline.operator.pods import Manifest, render_router, render_worker
from sloline.operator.settings import OperatorSettings
from sloline.planner.plan import Plan
from sloline.spec import PipelineGraph
from sloline.spec.models import API_VERSION, KIND, KUBERNETES_ONLY


def pipeline_file(graph: PipelineGraph) -> str:
    """`pipeline.yaml` as `sloline validate` reads it: the normalised spec, no cluster
    metadata (labels and annotations would roll pods for no reason) and none of the
    fields only the operator reads (pod templates, exposure)."""
    pipeline = graph.pipeline
    doc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": pipeline.metadata.name},
        "spec": pipeline.spec.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude=KUBERNETES_ONLY
        ),
    }
    return yaml.safe_dump(doc, sort_keys=True)


def plan_file(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), sort_keys=True, indent=1) + "\n"


def render_config_map(target: Target, plan: Plan, plan_inputs: str) -> Manifest:
    """`<p>-config`: the pipeline file and the plan, the pair every serving pod reads. It
    changes only when a new plan is deployed, so a pod that restarts while a changed spec
    is being re-profiled still reads a pipeline and a plan that belong together."""
    meta = target.metadata(
        config_map_name(target.name),
        labels(target.name, "config"),
        {ANNOTATION_PLAN_INPUTS: plan_inputs},
    )
    data = {"pipeline.yaml": pipeline_file(target.graph), "plan.json": plan_file(plan)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def render_profiles_cache(
    target: Target, files: Mapping[str, str], entries: Mapping[str, str]
) -> Manifest:
    """`<p>-profiles`: what the profiling Jobs mount (`files`: `pipeline.yaml`, the spec
    being profiled, and `catalog.yaml`, the hardware classes) and one key per measured
    `<stage>.<hardware>.<digest>` holding that Job's message."""
    meta = target.metadata(profiles_name(target.name), labels(target.name, "profiler"), {})
    data = {k: files[k] for k in ("pipeline.yaml", "catalog.yaml")}
    data.update(sorted(entries.items()))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def render_router_network(target: Target) -> list[Manifest]:
    """The routers' Service with the clients' `http` and `grpc` ports and `metrics` (ready
    routers only), the headless Service `<p>-router-workers` with only the `worker` port
    (every router, ready or not), the NetworkPolicy that lets only the pipeline's worker
    pods reach that port, and the routers' PodDisruptionBudget."""
    name = router_name(target.name)
    pod_labels = labels(target.name, "router")
    ports = [
        {"name": n, "port": p, "targetPort": n, "protocol": "TCP"}
        for n, p in (("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT))
    ]
    ports[1]["appProtocol"] = "grpc"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": target.metadata(name, pod_labels, {}),
        # Ready routers only: a router is ready once a worker of every stage is connected
        # to it, and not while it drains.
        "spec": {"type": "ClusterIP", "selector": selector(target.name, "router"), "ports": ports},
    }
    worker_service = {
        "apiVersion": "v1",
        "kind": "Service",
        # Its own component label: the ServiceMonitor selects the client Service only.
        "metadata": target.metadata(
            worker_service_name(target.name), labels(target.name, "router-workers"), {}
        ),
        "spec": {
            "type": "ClusterIP",
            # Headless: the name resolves to every router pod's address, and each worker
            # connects to all of them (one cluster IP would give it one router).
            "clusterIP": "None",
            "selector": selector(target.name, "router"),
            "ports": [
                {
                    "name": "worker",
                    "port": WORKER_PORT,
                    "targetPort": "worker",
                    "protocol": "TCP",
                    "appProtocol": "grpc",
                }
            ],
            # A router turns ready only once workers have connected, and workers find it
            # through this name: with ready addresses only, none would ever start.
            "publishNotReadyAddresses": True,
        },
    }
    return [
        service,
        worker_service,
        render_network_policy(target),
        render_router_disruption_budget(target),
    ]


def render_router_disruption_budget(target: Target) -> Manifest:
    """`<p>-router`: voluntary evictions (node drains) take one router at a time, and none
    while another is not ready. `maxUnavailable: 1` rather than `minAvailable: 1`: with
    one router the latter would block every drain of its node. A router that is not ready
    (no workers, wedged) serves no one and may always be evicted."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": target.metadata(router_name(target.name), labels(target.name, "router"), {}),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector(target.name, "router")},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def render_network_policy(target: Target) -> Manifest:
    """`<p>-router`: ingress to the router pod: the worker port from this pipeline's worker
    pods only; the client ports and metrics from anywhere (the router's Service exposes
    them; a cluster may add its own policies on top)."""
    port = {"protocol": "TCP", "port": WORKER_PORT}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": target.metadata(router_name(target.name), labels(target.name, "router"), {}),
        "spec": {
            "podSelector": {"matchLabels": selector(target.name, "router")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": selector(target.name, "worker")}}],
                    "ports": [port],
                },
                {
                    "ports": [
                        {"protocol": "TCP", "port": p} for p in (HTTP_PORT, GRPC_PORT, METRICS_PORT)
                    ]
                },
            ],
        },
    }


def render_worker_secret(target: Target, token: str) -> Manifest:
    """`<p>-worker-token`: the token the router asks of workers. The caller supplies it
    (the live Secret's, or a new random one the first time), so rendering stays pure."""
    meta = target.metadata(worker_secret_name(target.name), labels(target.name, "worker-token"), {})
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {WORKER_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def secret_token(secret: Mapping[str, Any] | None) -> str | None:
    """The token in a live `<p>-worker-token`, or None when it is missing or unusable."""
    if secret is None:
        return None
    value = (secret.get("data") or {}).get(WORKER_TOKEN_KEY)
    try:
        token = base64.b64decode(value, validate=True).decode() if value else ""
    except (ValueError, UnicodeDecodeError):
        return None
    return token if token.strip() and token.isprintable() and " " not in token else None


def scrape_interval(settings: OperatorSettings) -> str:
    """The router's scrape interval: the tuner's λ query takes rate() over 5 s windows by
    default, which needs samples about every second (a fifth of the rate window)."""
    tuner = settings.tuner
    window_s = tuner.lambda_rate_window_s or tuner.lambda_window_s or 5.0
    millis = max(1000, round(window_s * 1000 / 5))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def render_service_monitor(target: Target, settings: OperatorSettings) -> Manifest:
    """Prometheus Operator scrape config for the router's `metrics` port."""
    endpoint = {"port": "metrics", "path": "/metrics", "interval": scrape_interval(settings)}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": target.metadata(target.name, labels(target.name, "router"), {}),
        "spec": {
            "selector": {"matchLabels": selector(target.name, "router")},
            "endpoints": [endpoint],
        },
    }


def render(
    target: Target,
    plan: Plan,
    settings: OperatorSettings,
    *,
    worker_token: str,
    plan_inputs: str = "",
    service_monitor: bool = False,
) -> list[Manifest]:
    """Everything that serves a planned pipeline: `<p>-worker-token`, `<p>-config`, the
    router Deployment (the plan's routers, at least `router.replicas`), its Services,
    NetworkPolicy and PodDisruptionBudget, one worker Deployment per stage, and the
    ServiceMonitor when wanted."""
    config = render_config_map(target, plan, plan_inputs)
    out = [render_worker_secret(target, worker_token), config]
    routers = max(plan.routers, settings.router.replicas)
    out.append(render_router(target, settings, config["data"], routers))
    out += render_router_network(target)
    out += [
        render_worker(target, settings, s.name, s.hardware, s.replicas)
        for s in sorted(plan.stages, key=lambda s: s.name)
    ]
    if service_monitor:
        out.append(render_service_monitor(target, settings))
    return out
