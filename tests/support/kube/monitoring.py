"""Prometheus for the process kubelet: what the Prometheus Operator makes of
ServiceMonitors, with a real Prometheus server (the Debian package).

The kubelet turns every ServiceMonitor (`monitoring.coreos.com/v1`) into file_sd target
groups (`service_monitor_targets`): the Services it selects (`spec.selector`,
`namespaceSelector`; default its own namespace), their endpoints (as the kube-proxy
sees them), and for each of its `endpoints` the named Service port (`port`) or the
container port (`targetPort`), `path`, `interval` and `scrapeTimeout`, with the labels
the Prometheus Operator gives targets: `job` (the Service name, or the value of its
`jobLabel` label), `namespace`, `service`, `pod`, `container`, `endpoint`.
`file_sd_jobs` are the scrape configs for that file (Prometheus re-reads it when it
changes, within its service discovery's 5 s update cycle) and for its sibling with the
endpoints that set `honorLabels` (a job with `honor_labels: true`, as the Prometheus
Operator makes one per endpoint).

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

_HONOR = "__honor_labels__"  # which file a target group goes to; not written

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
            _HONOR: "true" if endpoint.get("honorLabels") else "false",
        }
        groups.append({"targets": [f"{pod['status']['podIP']}:{port}"], "labels": labels})
    return groups


def _honoring(path: Path) -> Path:
    """The targets file of the endpoints with `honorLabels`, beside `path`."""
    return path.with_name(f"{path.stem}-honor-labels{path.suffix}")


def write_targets(path: Path, groups: list[Obj]) -> bool:
    """Replace the targets files atomically (Prometheus watches them): `path`, and beside
    it those of endpoints with `honorLabels`; False if neither changed."""
    changed = False
    for honor, file in (("false", path), ("true", _honoring(path))):
        mine = [
            {**g, "labels": {k: v for k, v in g["labels"].items() if k != _HONOR}}
            for g in groups
            if g["labels"].get(_HONOR, "false") == honor
        ]
        text = json.dumps(mine, indent=1)
        if file.exists() and file.read_text() == text:
            continue
        file.parent.mkdir(parents=True, exist_ok=True)
        temporary = file.with_name(f".{file.name}.{threading.get_ident()}")
        temporary.write_text(text)
        temporary.replace(file)
        changed = True
    return changed


def file_sd_jobs(targets_file: Path) -> list[Obj]:
    """The scrape configs that read the ServiceMonitors' targets from `targets_file` and
    its `honorLabels` sibling."""
    return [
        {"job_name": "service-monitors", "file_sd_configs": [{"files": [str(targets_file)]}]},
        {
            "job_name": "service-monitors-honor-labels",
            "honor_labels": True,
            "file_sd_configs": [{"files": [str(_honoring(targets_file))]}],
        },
    ]
