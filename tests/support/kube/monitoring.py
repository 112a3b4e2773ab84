"""ServiceMonitors on the emulator: what the process kubelet gives the real Prometheus
of `start_prometheus()`.

The emulator publishes no EndpointSlices, so `endpoint_slices` makes them from the
Services' endpoints (as the kube-proxy sees them); the kubelet writes their targets with
the labels of Prometheus' Kubernetes discovery (`endpointslice_targets`) and loads the
ServiceMonitors' jobs, the Prometheus Operator's relabelling (`service_monitor_jobs`),
into Prometheus as they change — the same two steps as on the real control plane
(tests/support/prometheus.py, tests/support/cluster.py).

`SERVICE_MONITOR_CRD` is a minimal CRD for clusters without the Prometheus Operator.
"""

from __future__ import annotations

from collections.abc import Iterable

from tests.support.kube.network import endpoints
from tests.support.kube.podspec import Obj

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


def endpoint_slices(services: Iterable[Obj], pods: list[Obj]) -> list[Obj]:
    """The EndpointSlices the EndpointSlice controller would publish for the emulator's
    Services (which it has none of): one per Service and endpoint pod, with the pod's
    address, the Service's port names and the pod's port numbers (`endpoints`)."""
    slices: dict[tuple[str, str, str], Obj] = {}
    for service in services:
        meta = service["metadata"]
        for port, pod, target in endpoints(service, pods):
            name = pod["metadata"]["name"]
            found = slices.setdefault(
                (meta["namespace"], meta["name"], name),
                {
                    "metadata": {
                        "namespace": meta["namespace"],
                        "name": f"{meta['name']}-{name}",
                        "labels": {"kubernetes.io/service-name": meta["name"]},
                    },
                    "endpoints": [
                        {
                            "addresses": [pod["status"]["podIP"]],
                            "targetRef": {"kind": "Pod", "name": name},
                        }
                    ],
                    "ports": [],
                },
            )
            found["ports"].append({"name": port.get("name", ""), "port": target, "protocol": "TCP"})
    return [slices[key] for key in sorted(slices)]
