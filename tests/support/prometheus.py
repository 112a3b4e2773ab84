"""A real Prometheus server (the Debian package) for tests: scrapes every second, stores
into the test's directory, listens on a loopback port, stops with the test (or, through
`setpriv --pdeathsig`, with the test process).

`make test` fetches the Debian package's binaries into `.tools/bin` when `prometheus` is
not on PATH (`scripts/fetch_prometheus.sh`, no root needed); without either, tests that
need it skip and say why.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[2] / ".tools" / "bin"


def find_tool(name: str) -> str | None:
    """`prometheus` or `promtool` on PATH, else in `.tools/bin`."""
    return shutil.which(name) or shutil.which(name, path=str(TOOLS))


def tool(name: str) -> str:
    """`find_tool(name)`, or skip the test saying how to get it."""
    binary = find_tool(name)
    if binary is None:
        pytest.skip(
            f"{name} is not installed (scripts/fetch_prometheus.sh, or apt-get install prometheus)"
        )
    return binary


class Prometheus:
    """Scrapes `targets` (host:port, `/metrics`) and any further `scrape_configs`."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        port: int,
        *,
        scrape_configs: Sequence[dict[str, Any]] = (),
        retention: str = "1h",
    ) -> None:
        binary = tool("prometheus")
        workdir.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "prometheus.log"
        self.config_path = workdir / "prometheus.yml"
        self._static = (
            [{"job_name": "sloline", "static_configs": [{"targets": list(targets)}]}]
            if targets
            else []
        )
        self._write_config(scrape_configs)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [  # noqa: S607 - setpriv from util-linux, on PATH
                    "setpriv", "--pdeathsig", "KILL", "--", binary,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--storage.tsdb.retention.time={retention}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=log,
            )  # fmt: skip

    def _write_config(self, scrape_configs: Sequence[dict[str, Any]]) -> None:
        self.scrape_configs = list(scrape_configs)  # besides the static targets
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [*self._static, *scrape_configs],
        }
        self.config_path.write_text(json.dumps(config, indent=1))

    def reload(self, scrape_configs: Sequence[dict[str, Any]], timeout_s: float = 30.0) -> None:
        """Scrape `scrape_configs` (besides the static targets) from now on: the config
        rewritten, SIGHUP, and wait for Prometheus to have loaded it (RuntimeError where
        it refused it: its log says why)."""
        before = self._reload_metrics()
        self._write_config(scrape_configs)
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = self._reload_metrics()
            if done["success_timestamp"] > before["success_timestamp"]:
                return
            if done["successful"] == 0.0:
                raise RuntimeError(f"prometheus refused its new config; see {self.log_path}")
            time.sleep(0.1)
        raise TimeoutError(f"prometheus did not reload its config; see {self.log_path}")

    def _reload_metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            text = r.read().decode()
        found = {}
        for name in ("successful", "success_timestamp"):
            metric = f"prometheus_config_last_reload_{name}"
            match = re.search(rf"^{metric}(?:_seconds)? (\S+)$", text, re.MULTILINE)
            found[name] = float(match.group(1)) if match else 0.0
        return found

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus did not become ready; see {self.log_path}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            result: list[dict[str, Any]] = json.load(r)["data"]["result"]
            return result

    def targets(self) -> list[dict[str, Any]]:
        """The active targets as Prometheus sees them (labels, health, lastError)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as r:
            active: list[dict[str, Any]] = json.load(r)["data"]["activeTargets"]
            return active

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Prometheus:
        self.wait_ready()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def write_targets(path: Path, groups: Sequence[dict[str, Any]]) -> bool:
    """Replace a file_sd targets file atomically (Prometheus watches it); False where it
    holds `groups` already."""
    text = json.dumps(list(groups), indent=1)
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{threading.get_ident()}")
    temporary.write_text(text)
    temporary.replace(path)
    return True


def _label_name(name: str) -> str:
    """A Kubernetes label's name as Prometheus' service discovery spells it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def endpointslice_targets(
    slices: Sequence[dict[str, Any]],
    services: Sequence[dict[str, Any]],
    pods: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """file_sd target groups with the labels Prometheus' Kubernetes service discovery
    (role `endpointslice`) gives each address and port of each EndpointSlice:
    `__meta_kubernetes_namespace`, `..._service_name`, `..._service_label_<name>` and
    `..._service_labelpresent_<name>`, `..._endpointslice_name`, `..._endpointslice_port_name`,
    `..._endpointslice_port_protocol`, `..._endpointslice_endpoint_conditions_ready`, and
    for a pod endpoint `..._pod_name` and, where one of its containers declares the port,
    `..._pod_container_name`, `..._pod_container_port_name` and `..._pod_container_port_number`.
    (Debian's Prometheus is built without Kubernetes discovery: this is that discovery,
    fed from the apiserver by the caller.)"""
    by_service = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services}
    by_pod = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    groups = []
    for item in slices:
        meta = item["metadata"]
        namespace = meta["namespace"]
        service_name = (meta.get("labels") or {}).get("kubernetes.io/service-name", "")
        service = by_service.get((namespace, service_name))
        if service is None:
            continue
        common = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_service_name": service_name,
            "__meta_kubernetes_endpointslice_name": meta["name"],
        }
        for key, value in ((service["metadata"].get("labels")) or {}).items():
            common[f"__meta_kubernetes_service_label_{_label_name(key)}"] = value
            common[f"__meta_kubernetes_service_labelpresent_{_label_name(key)}"] = "true"
        for endpoint in item.get("endpoints") or []:
            ref = endpoint.get("targetRef") or {}
            pod = by_pod.get((namespace, ref.get("name", ""))) if ref.get("kind") == "Pod" else None
            ready = (endpoint.get("conditions") or {}).get("ready", True)
            for port in item.get("ports") or []:
                number = port.get("port")
                labels = {
                    **common,
                    "__meta_kubernetes_endpointslice_port_name": port.get("name") or "",
                    "__meta_kubernetes_endpointslice_port_protocol": port.get("protocol", "TCP"),
                    "__meta_kubernetes_endpointslice_endpoint_conditions_ready": str(
                        bool(ready)
                    ).lower(),
                }
                if pod is not None:
                    labels["__meta_kubernetes_pod_name"] = pod["metadata"]["name"]
                    for container in pod["spec"].get("containers") or []:
                        for declared in container.get("ports") or []:
                            if declared.get("containerPort") == number:
                                labels["__meta_kubernetes_pod_container_name"] = container["name"]
                                labels["__meta_kubernetes_pod_container_port_name"] = (
                                    declared.get("name") or ""
                                )
                                labels["__meta_kubernetes_pod_container_port_number"] = str(number)
                groups += [
                    {"targets": [f"{address}:{number}"], "labels": labels}
                    for address in endpoint.get("addresses") or []
                ]
    return sorted(groups, key=lambda g: json.dumps(g, sort_keys=True))


def service_monitor_jobs(
    monitors: Sequence[dict[str, Any]], targets_file: str
) -> list[dict[str, Any]]:
    """What the Prometheus Operator makes of ServiceMonitors (`monitoring.coreos.com/v1`)
    for a Prometheus that selects them all: one scrape job per endpoint of each, over the
    EndpointSlices' targets in `targets_file` (`endpointslice_targets`), kept by the
    Prometheus Operator's relabelling — the Services matching `spec.selector.matchLabels`
    in the `namespaceSelector`'s namespaces (default the monitor's own), the Service port
    named `port` (or the container port `targetPort`) — with the labels it gives targets:
    `job` (the Service's name, or its `jobLabel` label), `namespace`, `service`, `pod`,
    `container`, `endpoint`. `path`, `interval`, `scrapeTimeout`, `scheme` and
    `honorLabels` as given. A selector with `matchExpressions` is refused (ValueError):
    none of ours has one."""
    jobs = []
    for monitor in sorted(
        monitors, key=lambda m: (m["metadata"]["namespace"], m["metadata"]["name"])
    ):
        meta, spec = monitor["metadata"], monitor.get("spec") or {}
        selector = spec.get("selector") or {}
        if selector.get("matchExpressions"):
            raise ValueError(f"ServiceMonitor {meta['namespace']}/{meta['name']}: matchExpressions")
        where = spec.get("namespaceSelector") or {}
        keep = []
        if not where.get("any"):
            names = where.get("matchNames") or [meta["namespace"]]
            keep.append(
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_namespace"],
                    "regex": "|".join(re.escape(n) for n in names),
                }
            )
        keep += [
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{_label_name(key)}",
                    f"__meta_kubernetes_service_labelpresent_{_label_name(key)}",
                ],
                "regex": f"({re.escape(str(value))});true",
            }
            for key, value in sorted((selector.get("matchLabels") or {}).items())
        ]
        job_label = spec.get("jobLabel")
        for index, endpoint in enumerate(spec.get("endpoints") or []):
            if "port" in endpoint:
                name = str(endpoint["port"])
                port_label = "__meta_kubernetes_endpointslice_port_name"
            else:
                name = str(endpoint["targetPort"])
                kind = "number" if name.isdigit() else "name"
                port_label = f"__meta_kubernetes_pod_container_port_{kind}"
            relabel = [
                *keep,
                {"action": "keep", "source_labels": [port_label], "regex": re.escape(name)},
                *(
                    {"source_labels": [f"__meta_kubernetes_{source}"], "target_label": target}
                    for source, target in (
                        ("namespace", "namespace"),
                        ("service_name", "service"),
                        ("pod_name", "pod"),
                        ("pod_container_name", "container"),
                        ("service_name", "job"),
                    )
                ),
                *(
                    [
                        {
                            "source_labels": [
                                f"__meta_kubernetes_service_label_{_label_name(job_label)}"
                            ],
                            "regex": "(.+)",
                            "target_label": "job",
                        }
                    ]
                    if job_label
                    else []
                ),
                {"target_label": "endpoint", "replacement": name},
            ]
            interval = endpoint.get("interval") or "30s"
            jobs.append(
                {
                    "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
                    "honor_labels": bool(endpoint.get("honorLabels")),
                    "scrape_interval": interval,
                    "scrape_timeout": endpoint.get("scrapeTimeout") or interval,
                    "metrics_path": endpoint.get("path") or "/metrics",
                    "scheme": endpoint.get("scheme") or "http",
                    "file_sd_configs": [{"files": [targets_file]}],
                    "relabel_configs": relabel,
                }
            )
    return jobs
