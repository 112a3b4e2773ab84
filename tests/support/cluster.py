"""The cluster an end-to-end test runs on (docs/e2e.md): the local stand-in by default, a
real cluster when `$KUBECONFIG` is set. Both give the test the same few verbs — real
kubectl, the chart values that fit the cluster, an address of a Service port reachable
from the test process, diagnostics — so the story test runs unchanged on either.

- `EmulatedCluster`: the Kubernetes API emulator (tests/support/kube), the process kubelet
  running every pod as local processes, the ServiceMonitor CRD and a real Prometheus
  scraping what ServiceMonitors select. Service addresses are the cluster IPs the
  kubelet's proxy serves. The models are this repository's `examples/` (hostPath).
- `RealCluster`: kubectl with the ambient `$KUBECONFIG`; Service ports through
  `kubectl port-forward`; images, Prometheus and models from `SLOLINE_E2E_*` variables.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.support.kube import KubeEmulator
from tests.support.kube.kubectl import kubectl_binary
from tests.support.kube.kubelet import ProcessKubelet, unsupported_reason
from tests.support.kube.monitoring import SERVICE_MONITOR_CRD
from tests.support.prometheus import Prometheus

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "bin" / "helm"
# The catalog the story plans with: one CPU class, small requests (kind nodes are small).
CATALOG = {
    "classes": [
        {
            "name": "cpu-1",
            "accelerator": "cpu",
            "costPerHour": 0.05,
            "embedded": {"threads": 1},
            "kubernetes": {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}},
        }
    ]
}


class Cluster(Protocol):
    name: str
    leaves_processes: bool  # whether `leftover_processes` can tell

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]: ...

    def values(self) -> dict[str, Any]:
        """Chart values for this cluster: images, Prometheus, models (merged over the
        story's own)."""
        ...

    def address(self, namespace: str, service: str, port: str) -> str:
        """`host:port` of a Service port, reachable from the test process."""
        ...

    def explain(self, namespace: str | None = None, prefix: str = "") -> str:
        """What the pods (named `prefix...`) are doing, with their logs."""
        ...

    def services(self, namespace: str) -> str:
        """The Services with their addresses, ports and endpoints."""
        ...

    def objects(self, resource: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """The objects of a resource in a namespace, optionally by label selector."""
        ...

    def leftover_processes(self, namespace: str | None = None) -> list[int]:
        """Processes of pods (in `namespace`) still running, where the cluster can tell."""
        ...

    def query(self, promql: str) -> list[dict[str, Any]] | None:
        """The result of a PromQL query, where the test can reach Prometheus (else None)."""
        ...


def image(reference: str) -> dict[str, str]:
    """Chart image values (`repository`, `tag`) of `repo[:tag]`."""
    name = reference.rsplit("/", maxsplit=1)[-1]
    repository, tag = reference.rsplit(":", maxsplit=1) if ":" in name else (reference, "")
    return {"repository": repository, "tag": tag}


class EmulatedCluster:
    name = "emulated"
    leaves_processes = True

    def __init__(self, workdir: Path, prometheus_port: int) -> None:
        self.workdir = workdir
        self._prometheus_port = prometheus_port
        self._stack = contextlib.ExitStack()
        self.kube: KubeEmulator
        self.node: ProcessKubelet
        self.prometheus: Prometheus

    def __enter__(self) -> EmulatedCluster:
        if (reason := unsupported_reason()) is not None:
            pytest.skip(f"no local stand-in cluster: {reason}")
        self.kube = self._stack.enter_context(KubeEmulator(self.workdir / "kube"))
        # The images carry the code under test: a checkout run with PYTHONPATH (a git
        # worktree beside the editable install) hands it to the containers too.
        code = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
        self.node = self._stack.enter_context(
            ProcessKubelet(self.kube, self.workdir / "node", extra_env=code)
        )
        # The Prometheus Operator's API, so the operator renders ServiceMonitors.
        self.kube.register_crd(copy.deepcopy(SERVICE_MONITOR_CRD))
        self.prometheus = self.node.start_prometheus(port=self._prometheus_port)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.kube.kubectl(*args, input=input, check=check)

    def values(self) -> dict[str, Any]:
        examples = str(ROOT / "examples")
        return {
            "image": {
                "operator": image("sloline-operator:e2e"),
                "runtime": image("sloline-runtime:e2e"),
            },
            # Pods share the host's network namespace here, one loopback address each:
            # the operator's servers bind 0.0.0.0, so its default metrics port 8080 would
            # take 8080 on every pod address, where workers serve their health port.
            "operator": {"ports": {"metrics": 8090, "health": 8091}},
            "settings": {
                "prometheusUrl": self.prometheus.url,
                "models": {
                    "root": examples,
                    "volume": {"hostPath": {"path": examples, "type": "Directory"}},
                },
            },
        }

    def address(self, namespace: str, service: str, port: str) -> str:
        return self.node.service_address(namespace, service, port)

    def explain(self, namespace: str | None = None, prefix: str = "") -> str:
        return self.node.explain(namespace, prefix)

    def services(self, namespace: str) -> str:
        return self.node.explain_services(namespace)

    def objects(self, resource: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.kube.list(resource, namespace, labels=selector or None)
        return found

    def leftover_processes(self, namespace: str | None = None) -> list[int]:
        return self.node.pod_processes(namespace)

    def query(self, promql: str) -> list[dict[str, Any]] | None:
        return self.prometheus.query(promql)


class RealCluster:
    """The cluster `$KUBECONFIG` points at (see docs/e2e.md for kind)."""

    name = "real"
    leaves_processes = False

    def __init__(self) -> None:
        self._forwards: dict[tuple[str, str, str], tuple[subprocess.Popen[str], str]] = {}
        prometheus = os.environ.get("SLOLINE_E2E_PROMETHEUS_URL", "")
        if not prometheus:
            pytest.skip(
                "a real cluster needs SLOLINE_E2E_PROMETHEUS_URL: the in-cluster URL of a "
                "Prometheus that scrapes ServiceMonitors (docs/e2e.md)"
            )
        self.prometheus_url = prometheus
        self.suffix = uuid.uuid4().hex[:6]

    def __enter__(self) -> RealCluster:
        return self

    def __exit__(self, *_: object) -> None:
        for process, _ in self._forwards.values():
            process.terminate()
            process.wait(10)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [kubectl_binary(), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def values(self) -> dict[str, Any]:
        env = os.environ.get
        models = {
            "root": env("SLOLINE_E2E_MODELS_ROOT", "/models"),
            "volume": json.loads(env("SLOLINE_E2E_MODELS_VOLUME", "{}")),
        }
        return {
            "image": {
                "operator": image(env("SLOLINE_E2E_OPERATOR_IMAGE", "sloline-operator:e2e")),
                "runtime": image(env("SLOLINE_E2E_RUNTIME_IMAGE", "sloline-runtime:e2e")),
            },
            "settings": {"prometheusUrl": self.prometheus_url, "models": models},
        }

    def address(self, namespace: str, service: str, port: str) -> str:
        """A `kubectl port-forward` to the Service's port (kept for the session)."""
        key = (namespace, service, port)
        if key not in self._forwards:
            process = subprocess.Popen(
                [
                    kubectl_binary(),
                    "port-forward",
                    "-n",
                    namespace,
                    f"service/{service}",
                    f":{port}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert process.stdout is not None
            line = process.stdout.readline()
            found = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
            if found is None:
                process.kill()
                raise RuntimeError(f"kubectl port-forward to {service}:{port} failed: {line}")
            self._forwards[key] = (process, f"127.0.0.1:{found.group(1)}")
        return self._forwards[key][1]

    def explain(self, namespace: str | None = None, prefix: str = "") -> str:
        where = ["-n", namespace] if namespace else ["-A"]
        listed = self.kubectl("get", "pods", *where, "-o", "json", check=False).stdout
        lines = []
        for pod in json.loads(listed or '{"items": []}')["items"][:12]:
            meta = pod["metadata"]
            if not meta["name"].startswith(prefix):
                continue
            lines.append(
                f"pod {meta['namespace']}/{meta['name']}: {json.dumps(pod.get('status'))[:1500]}"
            )
            logs = self.kubectl("logs", "-n", meta["namespace"], meta["name"], "--all-containers",
                                "--tail=8", check=False)  # fmt: skip
            lines += [f"    | {line}" for line in (logs.stdout or logs.stderr).splitlines()]
        return "\n".join(lines)

    def services(self, namespace: str) -> str:
        return self.kubectl("get", "services,endpoints", "-n", namespace, "-o", "wide",
                            check=False).stdout  # fmt: skip

    def objects(self, resource: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        where = ["-l", selector] if selector else []
        listed = self.kubectl("get", resource, "-n", namespace, *where, "-o", "json").stdout
        items: list[dict[str, Any]] = json.loads(listed)["items"]
        return items

    def leftover_processes(self, namespace: str | None = None) -> list[int]:  # noqa: ARG002
        return []  # pods' processes are the nodes' business

    def query(self, promql: str) -> list[dict[str, Any]] | None:  # noqa: ARG002
        return None  # the in-cluster Prometheus is not reachable from here


@contextlib.contextmanager
def open_cluster(workdir: Path, prometheus_port: int) -> Iterator[Cluster]:
    """A real cluster when `$KUBECONFIG` is set, else the local stand-in."""
    cluster: Cluster
    if os.environ.get("KUBECONFIG"):
        with RealCluster() as cluster:
            yield cluster
    else:
        with EmulatedCluster(workdir, prometheus_port) as cluster:
            yield cluster
