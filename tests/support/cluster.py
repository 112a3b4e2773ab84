"""The clusters an end-to-end test runs on (docs/e2e.md): the local stand-in or a real
cluster when `$KUBECONFIG` is set, and the local real control plane. All give the test the
same few verbs — real kubectl, the chart values that fit the cluster, an address of a
Service port reachable from the test process, diagnostics — so the story test runs
unchanged on each (`open_cluster(kind, ...)`, `CLUSTERS`).

- `EmulatedCluster`: the Kubernetes API emulator (tests/support/kube), the process kubelet
  running every pod as local processes, the ServiceMonitor CRD and a real Prometheus
  scraping what ServiceMonitors select. Service addresses are the cluster IPs the
  kubelet's proxy serves. The models are this repository's `examples/` (hostPath).
- `RealCluster`: kubectl with the ambient `$KUBECONFIG`; Service ports through
  `kubectl port-forward`; images, Prometheus and models from `SLOLINE_E2E_*` variables.
- `ControlPlaneCluster`: the real control plane of `scripts/cluster.py` (etcd,
  kube-apiserver, controller-manager, scheduler) with the process kubelet as its node
  agent, started for the test; the ServiceMonitor CRD, and a real Prometheus scraping
  what ServiceMonitors select among the EndpointSlices' targets, all watched through the
  apiserver (`ServiceMonitorScrapes`: its config rewritten as they change, as the
  Prometheus Operator does). Both namespaces
  enforce Pod Security `restricted`, so the models are files of the "image" (this
  checkout's `examples/`, no volume). Service addresses are the cluster IPs the node's
  proxy serves; objects are read straight from the apiserver (no kubectl process per
  poll).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pytest

from tests.support import control_plane
from tests.support.kube import KubeEmulator
from tests.support.kube.client import ClusterClient
from tests.support.kube.kinds import ApiError
from tests.support.kube.kubectl import kubectl_binary
from tests.support.kube.kubelet import ProcessKubelet, unsupported_reason
from tests.support.kube.monitoring import SERVICE_MONITOR_CRD
from tests.support.net import free_port
from tests.support.prometheus import (
    Prometheus,
    endpointslice_targets,
    service_monitor_jobs,
    tool,
    write_targets,
)

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


# The clusters the story runs on: the stand-in (or, with $KUBECONFIG, that cluster) and
# the local real control plane.
CLUSTERS = ("kubeconfig" if os.environ.get("KUBECONFIG") else "emulated", "control-plane")


class Cluster(Protocol):
    name: str
    leaves_processes: bool  # whether `leftover_processes` can tell
    shared: bool  # it outlives the test: what the test made must be removed
    # Labels of the namespaces the test creates (Pod Security where it is enforced).
    namespace_labels: dict[str, str]

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
    shared = False
    # The emulator has no Pod Security admission (and the models come from a hostPath).
    namespace_labels: ClassVar[dict[str, str]] = {}

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
        # The local Python environment stands for the images: its PYTHONPATH too.
        python_path = {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}
        self.node = self._stack.enter_context(
            ProcessKubelet(self.kube, self.workdir / "node", extra_env=python_path)
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
            # The emulator serves no admissionregistration.k8s.io and calls no webhooks
            # (tests/unit/operator/test_admission.py and test_admission_webhook.py cover it).
            "admission": {"webhook": {"enabled": False}},
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
    shared = True
    namespace_labels: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        self._kubeconfig: list[str] = []  # kubectl's --kubeconfig, where not the ambient one
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
            [kubectl_binary(), *self._kubeconfig, *args],
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


class ServiceMonitorScrapes:
    """What the Prometheus Operator and Prometheus' Kubernetes discovery do for one
    Prometheus (Debian's is built without that discovery): watches ServiceMonitors,
    EndpointSlices, Services and Pods in every namespace through the apiserver and, when
    they change, writes the EndpointSlices' targets with their discovery labels
    (`endpointslice_targets`, a file Prometheus watches) and reloads Prometheus with the
    ServiceMonitors' jobs (`service_monitor_jobs`) where those changed. `problem` holds the
    last failure to do so, for diagnostics."""

    WATCHED = ("servicemonitors", "endpointslices", "services", "pods")

    def __init__(self, client: ClusterClient, prometheus: Prometheus, workdir: Path) -> None:
        self.client, self.prometheus = client, prometheus
        self.targets_file = workdir / "endpointslices.json"
        write_targets(self.targets_file, [])
        self.problem = ""
        self._changed, self._stop = threading.Event(), threading.Event()
        self._changed.set()
        for resource in self.WATCHED:
            client.watch(resource, self._changed.set, self._stop)
        self._thread = threading.Thread(target=self._run, name="service-monitors", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._changed.wait(0.5):
                continue
            self._changed.clear()
            try:
                monitors, slices, services, pods = (self.client.list(r) for r in self.WATCHED)
                write_targets(self.targets_file, endpointslice_targets(slices, services, pods))
                jobs = service_monitor_jobs(monitors, str(self.targets_file))
                if jobs != self.prometheus.scrape_configs:
                    self.prometheus.reload(jobs)
                self.problem = ""
                self._stop.wait(0.5)  # changes come in bursts: one pass for each
            except (ApiError, OSError, RuntimeError, ValueError) as exc:
                self.problem = f"ServiceMonitors -> Prometheus: {exc}"
                self._changed.set()
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class ControlPlaneCluster(RealCluster):
    """The local real control plane (`scripts/cluster.py up`, its own temp dir) with the
    process kubelet as its node, for one test; see the module's docstring."""

    name = "control-plane"
    leaves_processes = True
    shared = False
    namespace_labels: ClassVar[dict[str, str]] = {
        "pod-security.kubernetes.io/enforce": "restricted"
    }

    def __init__(self, workdir: Path, prometheus_port: int) -> None:  # not RealCluster's
        self.workdir = workdir
        self._prometheus_port = prometheus_port
        self._kubeconfig = []
        self._forwards = {}
        self._stack = contextlib.ExitStack()
        self.client: ClusterClient
        self.prometheus: Prometheus
        self.node_dir: Path

    def __enter__(self) -> ControlPlaneCluster:
        if (reason := control_plane.node_missing()) is not None:
            pytest.skip(f"no local control plane: {reason}")
        tool("prometheus")  # skips, saying how to get it
        self.workdir.mkdir(parents=True, exist_ok=True)
        started = control_plane.running(self.workdir, node=True)
        kubeconfig = next(started)
        self._stack.callback(started.close)
        self._kubeconfig = ["--kubeconfig", kubeconfig]
        state = json.loads((self.workdir / "cp.json").read_text())
        self.node_dir = Path(state["dir"]) / "node"
        self.client = ClusterClient(kubeconfig)
        self._stack.callback(self.client.close)
        # The Prometheus Operator's API, so the operator renders ServiceMonitors.
        self.kubectl("apply", "-f", "-", input=json.dumps(SERVICE_MONITOR_CRD))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     f"crd/{SERVICE_MONITOR_CRD['metadata']['name']}")  # fmt: skip
        self.prometheus = Prometheus(self.workdir / "prometheus", (), self._prometheus_port)
        self._stack.callback(self.prometheus.stop)
        self.prometheus.wait_ready()
        self.monitors = ServiceMonitorScrapes(
            self.client, self.prometheus, self.workdir / "prometheus"
        )
        self._stack.callback(self.monitors.stop)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)

    def values(self) -> dict[str, Any]:
        examples = str(ROOT / "examples")
        # The operator's servers bind 0.0.0.0 where pods share the host's ports: free
        # ones, so that no other cluster on this machine holds them.
        ports = {"metrics": free_port(), "health": free_port()}
        return {
            "image": {
                "operator": image("sloline-operator:e2e"),
                "runtime": image("sloline-runtime:e2e"),
            },
            "operator": {"ports": ports},
            "admission": {"webhook": {"port": free_port()}},
            "settings": {
                "prometheusUrl": self.prometheus.url,
                # In the "image" (the local environment stands for it): `restricted`
                # admits no hostPath volume.
                "models": {"root": examples, "volume": {}},
            },
        }

    def address(self, namespace: str, service: str, port: str) -> str:
        """The Service's cluster IP and port (the node's kube-proxy listens there)."""
        spec = self.client.get("services", namespace, service)["spec"]
        number = next(p["port"] for p in spec["ports"] if p.get("name") == port)
        return f"{spec['clusterIP']}:{number}"

    def services(self, namespace: str) -> str:
        targets = [
            f"  {t['labels'].get('job')} {t['scrapeUrl']}: {t['health']} {t.get('lastError', '')}"
            for t in self.prometheus.targets()
        ]
        return "\n".join(
            [super().services(namespace), "Prometheus targets:", *targets, self.monitors.problem]
        )

    def objects(self, resource: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        return self.client.list(resource, namespace, labels=selector or None)

    def leftover_processes(self, namespace: str | None = None) -> list[int]:
        """One process per running container of the node's pods (in `namespace`): its
        launcher, whose command line names the container's folder under the node's."""
        prefix = f"{self.node_dir / 'pods'}/{namespace + '_' if namespace else ''}"
        containers: dict[str, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            for arg in argv:
                if arg.startswith(prefix) and "/containers/" in arg:
                    folder = arg.rsplit("/", maxsplit=1)[0]
                    containers[folder] = min(containers.get(folder, 1 << 30), int(entry.name))
        return sorted(containers.values())

    def query(self, promql: str) -> list[dict[str, Any]] | None:
        return self.prometheus.query(promql)


@contextlib.contextmanager
def open_cluster(kind: str, workdir: Path, prometheus_port: int) -> Iterator[Cluster]:
    """The cluster `kind` of `CLUSTERS`: `kubeconfig` (the one `$KUBECONFIG` points at),
    `emulated` (the local stand-in) or `control-plane` (the local real one)."""
    cluster: Cluster
    if kind == "control-plane":
        with ControlPlaneCluster(workdir, prometheus_port) as cluster:
            yield cluster
    elif kind == "kubeconfig":
        with RealCluster() as cluster:
            yield cluster
    else:
        with EmulatedCluster(workdir, prometheus_port) as cluster:
            yield cluster
