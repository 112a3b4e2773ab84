"""The process kubelet's cluster network: pod and Service addresses, Service endpoints,
name resolution (hosts files) and the kube-proxy child process (`proxy.py`).

Pods share the host's network namespace, each with its own loopback address (the pod IP,
`127.1.x.y` by default): servers that bind `$(POD_IP)`, as sloline's do, can all use the
same port numbers. A server that binds 0.0.0.0 takes its port on every pod address, which
no real cluster does: two such pods, or one beside pods using the port on their own
address, conflict. Services get a cluster IP (`127.2.x.y`) on which the proxy listens;
a headless Service (`clusterIP: None`) gets none, and its name resolves to its pods.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.support.kube.podspec import Obj, resolve_port


def tool(name: str) -> str:
    return shutil.which(name) or name


PROXY = Path(__file__).with_name("proxy.py")
HOSTS_HEADER = """# Kubernetes-managed hosts file (the process kubelet).
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
"""
# Every pod's /etc/host.conf: glibc answers a name from every hosts line that has it
# (with `multi off` only from the first), as DNS answers every A record.
HOST_CONF = "multi on\n"


class AddressPool:
    """Addresses in a /16 of 127.0.0.0/8, handed out in order and not reused while the
    pool lasts, so a stale connection never reaches a newer pod."""

    def __init__(self, network: str) -> None:
        self.network = ipaddress.ip_network(network)
        self._next = 1

    def allocate(self) -> str:
        if self._next >= self.network.num_addresses - 1:
            raise RuntimeError(f"the address pool {self.network} is exhausted")
        address = str(self.network[self._next])
        self._next += 1
        return address

    def __contains__(self, address: object) -> bool:
        try:
            return ipaddress.ip_address(str(address)) in self.network
        except ValueError:
            return False


def pod_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def endpoint_pods(service: Obj, pods: Iterable[Obj]) -> list[Obj]:
    """The pods behind a Service: of its namespace, matching its selector, with an IP,
    ready (or not, with `publishNotReadyAddresses`) and not terminating."""
    spec, meta = service.get("spec") or {}, service["metadata"]
    selector = spec.get("selector")
    if not selector:
        return []
    out = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if (
            pod["metadata"].get("namespace") == meta["namespace"]
            and all(labels.get(k) == v for k, v in selector.items())
            and not pod["metadata"].get("deletionTimestamp")
            and (pod.get("status") or {}).get("podIP")
            and (spec.get("publishNotReadyAddresses") or pod_ready(pod))
        ):
            out.append(pod)
    return out


def endpoints(service: Obj, pods: Iterable[Obj]) -> list[tuple[Obj, Obj, int]]:
    """(service port, pod, target port) for every endpoint of the Service: its
    `endpoint_pods` that have the port."""
    out = []
    for pod in endpoint_pods(service, pods):
        for port in (service.get("spec") or {}).get("ports") or []:
            target = resolve_port(pod, port.get("targetPort", port["port"]))
            if target is not None:
                out.append((port, pod, target))
    return out


def proxy_table(services: Iterable[Obj], pods: list[Obj]) -> dict[str, list[str]]:
    """`clusterIP:port` -> the `podIP:targetPort` endpoints, for every Service with a
    cluster IP."""
    table: dict[str, list[str]] = {}
    for service in services:
        cluster_ip = (service.get("spec") or {}).get("clusterIP")
        if not cluster_ip or cluster_ip == "None":
            continue
        for port in service["spec"].get("ports") or []:
            table[f"{cluster_ip}:{port['port']}"] = []
        for port, pod, target in endpoints(service, pods):
            table[f"{cluster_ip}:{port['port']}"].append(f"{pod['status']['podIP']}:{target}")
    return {k: sorted(v) for k, v in sorted(table.items())}


def dns_records(services: Iterable[Obj], pods: Iterable[Obj]) -> list[tuple[str, str, str]]:
    """(address, namespace, Service name) for what cluster DNS answers: a Service's
    cluster IP, or for a headless Service (`clusterIP: None`) the IP of each of its
    `endpoint_pods`, one record per pod."""
    pods = list(pods)
    records = []
    for service in sorted(
        services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])
    ):
        meta, spec = service["metadata"], service.get("spec") or {}
        cluster_ip = spec.get("clusterIP")
        if cluster_ip == "None":
            ips = sorted({p["status"]["podIP"] for p in endpoint_pods(service, pods)})
        else:
            ips = [cluster_ip] if cluster_ip else []
        records += [(ip, meta["namespace"], meta["name"]) for ip in ips]
    return records


def hosts_text(
    pod_name: str, pod_ip: str, namespace: str, records: Iterable[tuple[str, str, str]]
) -> str:
    """The pod's /etc/hosts: itself, and every DNS record (`dns_records`) under the names
    cluster DNS gives its Service (the short name only within the pod's namespace, as the
    `<ns>.svc.cluster.local` search domain would resolve it). A name on several lines
    resolves to all of them (`multi on`, `HOST_CONF`), as a headless Service's does."""
    lines = [HOSTS_HEADER.rstrip("\n"), f"{pod_ip}\t{pod_name}"]
    for ip, ns, name in records:
        names = [f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
        lines.append("\t".join([ip, *([name] if ns == namespace else []), *names]))
    return "\n".join(lines) + "\n"


class ProxyProcess:
    """The kube-proxy child process: `update(table)` replaces its table and waits until
    it listens accordingly."""

    def __init__(self, log_path: Path, python: str = sys.executable) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self._process = subprocess.Popen(
            [tool("setpriv"), "--pdeathsig", "KILL", "--", python, "-I", str(PROXY)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        self.table: dict[str, list[str]] = {}

    def update(self, table: dict[str, list[str]]) -> list[str]:
        """Send the table; the addresses that could not listen, with the reason."""
        if table == self.table:
            return []
        assert self._process.stdin is not None and self._process.stdout is not None
        if self._process.poll() is not None:
            raise RuntimeError(f"the kube-proxy process exited; see {self.log_path}")
        self._process.stdin.write((json.dumps(table) + "\n").encode())
        self._process.stdin.flush()
        answer: dict[str, Any] = json.loads(self._process.stdout.readline() or "{}")
        self.table = table
        errors: list[str] = answer.get("errors", ["no answer from the kube-proxy process"])
        return errors

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._log.close()


def slice_table(services: Iterable[Obj], slices: Iterable[Obj]) -> dict[str, list[str]]:
    """`clusterIP:port` -> `address:port` endpoints from the EndpointSlices of a real
    control plane (the node agent's kube-proxy): per Service port, the ready endpoints
    of its slices' port of the same name."""
    by_service: dict[tuple[str, str], list[Obj]] = {}
    for item in slices:
        meta = item["metadata"]
        owner = (meta.get("labels") or {}).get("kubernetes.io/service-name")
        if owner:
            by_service.setdefault((meta["namespace"], owner), []).append(item)
    table: dict[str, list[str]] = {}
    for service in services:
        meta, spec = service["metadata"], service.get("spec") or {}
        cluster_ip = spec.get("clusterIP")
        if not cluster_ip or cluster_ip == "None":
            continue
        for port in spec.get("ports") or []:
            backends = table.setdefault(f"{cluster_ip}:{port['port']}", [])
            for item in by_service.get((meta["namespace"], meta["name"]), []):
                numbers = [
                    p.get("port")
                    for p in item.get("ports") or []
                    if (p.get("name") or "") == (port.get("name") or "")
                ]
                for number in numbers:
                    backends.extend(
                        f"{address}:{number}"
                        for endpoint in item.get("endpoints") or []
                        if (endpoint.get("conditions") or {}).get("ready") is not False
                        for address in endpoint.get("addresses") or []
                    )
    return {k: sorted(v) for k, v in sorted(table.items())}
