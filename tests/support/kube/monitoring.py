"""Prometheus for the process kubelet: what the Prometheus Operator makes of
ServiceMonitors, with a real Prometheus server (the Debian package).

The kubelet turns every ServiceMonitor (`monitoring.coreos.com/v1`) into file_sd target
groups (`service_monitor_targets`): the Services it selects (`spec.selector`,
`namespaceSelector`; default its own namespace), their endpoints (as the kube-proxy
sees them), and for each of its `endpoints` the named Service port (`port`) or the
container port (`targetPort`), `path`, `interval` and `scrapeTimeout`, with the labels
the Prometheus Operator gives targets: `job` (the Service name, or the value of its
`jobLabel` label), `namespace`, `service`, `pod`, `container`, `endpoint`.
`file_sd_job` is the scrape config for that file (Prometheus re-reads it when it changes,
within its service discovery's 5 s update cycle).

`SERVICE_MONITOR_CRD` is a minimal CRD for clusters (the emulator) without the
Prometheus Operator.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.support.kube.network import endpoints
from tests.support.kube.podspec import Obj, duration_s, matches, resolve_port

SERVICE_MONITOR_CRD: Obj = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "shortNames": ["smon"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def _namespaces(monitor: Obj) -> set[str] | None:
    """The namespaces a ServiceMonitor looks in; None for all."""
    selector = (monitor.get("spec") or {}).get("namespaceSelector") or {}
    if selector.get("any"):
        return None
    return set(selector.get("matchNames") or [monitor["metadata"]["namespace"]])


def _target_port(endpoint: Obj, service_port: Obj, pod: Obj, target: int) -> int | None:
    """The port an endpoint of a ServiceMonitor scrapes on this pod, if it applies."""
    if "port" in endpoint:
        return target if service_port.get("name") == endpoint["port"] else None
    if "targetPort" in endpoint:
        wanted = resolve_port(pod, endpoint["targetPort"])
        return target if wanted == target else None
    return None


def service_monitor_targets(
    monitors: Iterable[Obj], services: Sequence[Obj], pods: list[Obj]
) -> list[Obj]:
    """file_sd target groups for every endpoint of every ServiceMonitor."""
    groups = []
    for monitor in monitors:
        spec, namespaces = monitor.get("spec") or {}, _namespaces(monitor)
        for service in services:
            meta = service["metadata"]
            if (namespaces is not None and meta["namespace"] not in namespaces) or not matches(
                meta.get("labels") or {}, spec.get("selector")
            ):
                continue
            job = (meta.get("labels") or {}).get(spec.get("jobLabel", ""), meta["name"])
            for endpoint in spec.get("endpoints") or []:
                groups += _endpoint_groups(monitor, endpoint, service, job, pods)
    return sorted(groups, key=lambda g: json.dumps(g, sort_keys=True))


def _endpoint_groups(
    monitor: Obj, endpoint: Obj, service: Obj, job: str, pods: list[Obj]
) -> list[Obj]:
    interval_s = duration_s(endpoint.get("interval"), 1.0)
    timeout_s = min(duration_s(endpoint.get("scrapeTimeout"), interval_s), interval_s)
    groups = []
    for service_port, pod, target in endpoints(service, pods):
        port = _target_port(endpoint, service_port, pod, target)
        if port is None:
            continue
        container = next(
            (
                c["name"]
                for c in pod["spec"].get("containers") or []
                if any(p.get("containerPort") == port for p in c.get("ports") or [])
            ),
            "",
        )
        labels = {
            "job": job,
            "namespace": pod["metadata"]["namespace"],
            "service": service["metadata"]["name"],
            "pod": pod["metadata"]["name"],
            "container": container,
            "endpoint": str(endpoint.get("port") or endpoint.get("targetPort")),
            "__metrics_path__": endpoint.get("path") or "/metrics",
            "__scheme__": endpoint.get("scheme") or "http",
            "__scrape_interval__": f"{round(interval_s * 1000)}ms",
            "__scrape_timeout__": f"{round(timeout_s * 1000)}ms",
            "__meta_servicemonitor": f"{monitor['metadata']['namespace']}/"
            f"{monitor['metadata']['name']}",
        }
        groups.append({"targets": [f"{pod['status']['podIP']}:{port}"], "labels": labels})
    return groups


def write_targets(path: Path, groups: list[Obj]) -> bool:
    """Replace the targets file atomically (Prometheus watches it); False if unchanged."""
    text = json.dumps(groups, indent=1)
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{threading.get_ident()}")
    temporary.write_text(text)
    temporary.replace(path)
    return True


def file_sd_job(targets_file: Path) -> Obj:
    """The scrape config that reads the ServiceMonitors' targets from `targets_file`."""
    return {"job_name": "service-monitors", "file_sd_configs": [{"files": [str(targets_file)]}]}
