"""`ProcessKubelet`: a one-node cluster made of local processes, in one of two modes
(docs/e2e.md):

- behind the Kubernetes API emulator (`ProcessKubelet(kube_emulator, workdir)`): the
  kubelet, the Deployment and Job controllers, kube-proxy, cluster DNS and the Prometheus
  Operator's ServiceMonitor discovery, for end-to-end tests of manifests as rendered
  (tests/e2e);
- the node agent of a real control plane (`ProcessKubelet(ClusterClient(node_kubeconfig),
  workdir, proxy_api=ClusterClient(kube_proxy_kubeconfig), pod_network=...,
  service_network=...)`, started by `scripts/cluster.py up` through `node.py`): it
  registers its Node (capacity, Ready, a Lease in kube-node-lease renewed every
  `LEASE_RENEW_S`), runs the pods the real scheduler binds to it, writes their status
  through `/status`, finishes their graceful deletion, gives them service-account tokens
  from the TokenRequest API (their projected volumes), serves Services from the
  EndpointSlices (kube-proxy, as `system:kube-proxy`) and hosts files, and container
  logs to the apiserver (`kubectl logs`). The real controllers do the rest.

    with KubeEmulator() as kube, ProcessKubelet(kube, tmp_path / "node") as node:
        kube.load(manifests)
        kube.wait_for("deployments", "default", "web", lambda d: ...readyReplicas...)
        ip = node.cluster_ip("default", "web")   # reachable from the test process

It runs in its own thread and event loop. Every `poll_s` (and at once when one of its
pods changes) it reads the emulator's resource version (as a node agent: at once on
every event of its watches of Pods bound to it, Services and EndpointSlices, and every
second);
when anything changed it lists Deployments, Jobs, Pods, Services and ServiceMonitors in
all namespaces (as a node agent: its own Pods and the Services) and brings the node in
line (level-triggered, like the real controllers):

- `controllers.py` (emulator only): Deployments and Jobs make Pod objects (and status);
- `runtime.py`: every Pod object runs on this node, each container's command as a local
  process tree in its own namespaces (`podexec.py`); its status goes back through
  `/status`, and a deleted pod's processes are stopped (SIGTERM, the grace period,
  SIGKILL) before its object goes (see `controllers.FINALIZER`);
- `network.py`: pod IPs, Service cluster IPs (written to `spec.clusterIP`), hosts files
  (per pod, bind-mounted at /etc/hosts, rewritten in place) and the kube-proxy process;
- `monitoring.py`: ServiceMonitors -> the scrape jobs and targets of `start_prometheus()`.

Logs: `<workdir>/logs/<ns>_<pod>_<container>.log` per container (stdout and stderr) and
`<workdir>/logs/kubelet.log` (what the kubelet did); `explain()` summarises pods for
assertion messages. Needs root, util-linux (`unshare`, `setpriv`, `nsenter`) and Linux
namespaces: `unsupported_reason()` says why not, for a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp.web

from tests.support.kube.client import ClusterClient
from tests.support.kube.controllers import FINALIZER, Controllers
from tests.support.kube.kinds import ApiError
from tests.support.kube.monitoring import endpoint_slices
from tests.support.kube.network import (
    AddressPool,
    ProxyProcess,
    dns_records,
    hosts_text,
    proxy_table,
    slice_table,
)
from tests.support.kube.podspec import Obj
from tests.support.kube.runtime import LAUNCH_NAMESPACES, Node, PodRuntime, tool, utc_now
from tests.support.prometheus import (
    Prometheus,
    endpointslice_targets,
    service_monitor_jobs,
    write_targets,
)

NODE_NAME = "local"
LEASE_RENEW_S = 10.0  # the real kubelet's: a quarter of the lease's 40 s
NODE_STATUS_S = 60.0


def micro_time() -> str:
    """Now as a Kubernetes MicroTime (a Lease's renewTime)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_capacity() -> dict[str, str]:
    """This machine's CPUs and memory, and the kubelet's default of 110 pods."""
    memory_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
    return {"cpu": str(os.cpu_count() or 1), "memory": f"{memory_kib}Ki", "pods": "110"}


@functools.cache
def unsupported_reason() -> str | None:
    """Why the process kubelet cannot run here (for `pytest.skip`), or None."""
    if not sys.platform.startswith("linux"):
        return "the process kubelet needs Linux namespaces"
    if os.geteuid() != 0:
        return "the process kubelet needs root (it bind-mounts in per-container namespaces)"
    for name in ("unshare", "setpriv", "nsenter", "mount"):
        if shutil.which(name) is None:
            return f"the process kubelet needs {name} (util-linux)"
    probe = subprocess.run(
        [*LAUNCH_NAMESPACES, "--", tool("mount"), "--bind", "/dev", "/dev"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"unshare cannot make mount and PID namespaces here: {probe.stderr.strip()}"
    return None


class LocalRoute:
    """A pod network outside 127.0.0.0/8 routed to `lo` (`ip route add local NET dev lo`,
    the way 127.0.0.0/8 is), so that pods bind and reach their addresses as loopback ones;
    added by a node agent while it runs, only where it is not routed already."""

    def __init__(self, network: str) -> None:
        self.network = network
        self.added = False

    def add(self) -> None:
        if ipaddress.ip_network(self.network).is_loopback:
            return
        shown = subprocess.run(
            [tool("ip"), "route", "show", "table", "local", self.network],
            capture_output=True,
            text=True,
            check=True,
        )
        if shown.stdout.strip():
            return
        subprocess.run(
            [tool("ip"), "route", "add", "local", self.network, "dev", "lo"],
            capture_output=True,
            text=True,
            check=True,
        )
        self.added = True

    def remove(self) -> None:
        if self.added:
            subprocess.run(
                [tool("ip"), "route", "del", "local", self.network, "dev", "lo"],
                capture_output=True,
                check=False,
            )
            self.added = False


def mount_points() -> set[str]:
    """Every mount point of every mount namespace on this machine (`/proc/*/mountinfo`,
    one process per namespace)."""
    found: set[str] = set()
    seen: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            namespace = os.readlink(entry / "ns" / "mnt")
            if namespace in seen:
                continue
            seen.add(namespace)
            for line in (entry / "mountinfo").read_text().splitlines():
                fields = line.split(" ")
                found.add(fields[4].replace("\\040", " "))
    return found


class ProcessKubelet:
    """The node (see the module docstring); a context manager, inside the emulator's.

    `api` is the `KubeEmulator` or, for a node agent, a `ClusterClient` whose kubeconfig
    is the node's (`system:node:<node_name>`), with `proxy_api` kube-proxy's
    (`system:kube-proxy`: the node may not read EndpointSlices); `service_network` is then
    the apiserver's service CIDR (in 127.0.0.0/8: kube-proxy listens on the cluster IPs
    it allocates), `pod_network` outside 127.0.0.0/8 (EndpointSlices refuse loopback
    addresses: the node routes it to `lo` while it runs, see `LocalRoute`) and `capacity`
    the Node's (default: this machine's CPUs and memory, 110 pods). With `serving_tls`
    (certificate, key, client CA) it serves the kubelet API's container logs (`kubectl
    logs`) on 127.0.0.1, to clients with a certificate of that CA (the apiserver's).
    `extra_env` is added to every container's environment (after the image's and before
    the pod's own). Its methods are thread-safe and blocking.
    """

    def __init__(
        self,
        api: Any,
        workdir: str | Path,
        *,
        node_name: str = NODE_NAME,
        capacity: Mapping[str, str] | None = None,
        proxy_api: ClusterClient | None = None,
        serving_tls: tuple[Path, Path, Path] | None = None,
        extra_env: Mapping[str, str] | None = None,
        poll_s: float = 0.1,
        restart_backoff_s: float = 0.5,
        job_backoff_s: float = 1.0,
        stop_grace_s: float = 10.0,
        pod_network: str = "127.1.0.0/16",
        service_network: str = "127.2.0.0/16",
    ) -> None:
        self.api = api
        self.agent = isinstance(api, ClusterClient)
        if self.agent and proxy_api is None:
            raise ValueError("a node agent needs kube-proxy's client (proxy_api)")
        self.proxy_api = proxy_api
        self._serving_tls = serving_tls
        self._serving_socket: socket.socket | None = None
        self.node_name = node_name
        self._capacity = dict(capacity or default_capacity())
        self.workdir = Path(workdir).resolve()
        self.log_dir = self.workdir / "logs"
        self.targets_file = self.workdir / "prometheus" / "targets.json"
        self.failures: list[BaseException] = []
        self._extra_env = dict(extra_env or {})
        self._poll_s, self._stop_grace_s = poll_s, stop_grace_s
        self._restart_backoff_s, self._job_backoff_s = restart_backoff_s, job_backoff_s
        self._pod_ips, self._service_ips = AddressPool(pod_network), AddressPool(service_network)
        self._route = LocalRoute(pod_network)
        self._cluster_ips: dict[str, str] = {}  # Service uid -> its cluster IP
        self._runtimes: dict[str, PodRuntime] = {}  # Pod uid -> runtime
        self._stopping_pods: dict[str, asyncio.Task[None]] = {}
        self._written: dict[str, Obj] = {}  # Pod uid -> the status last written
        self._dirty: set[str] = set()
        self._launched: list[PodRuntime] = []
        self._services: list[Obj] = []
        self._records: list[tuple[str, str, str]] = []  # what the hosts files say
        self._prometheus: list[Prometheus] = []  # started and ready
        self._prometheus_lock = threading.Lock()
        self._monitor_jobs: list[Obj] = []  # the ServiceMonitors' scrape jobs
        self._thread = threading.Thread(target=self._run, name="process-kubelet", daemon=True)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._log_file: Any = None
        self._watching = threading.Event()  # set: the node agent's watches stop
        self._renewed = self._reported = 0.0  # the Lease's and the Node status' last times

    # -- life cycle -----------------------------------------------------------------------

    def __enter__(self) -> Self:
        reason = unsupported_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log_file = (self.log_dir / "kubelet.log").open("a", buffering=1)
        if self.agent:
            self._extra_env = {**self._in_cluster_env(), **self._extra_env}
            if self._serving_tls is not None:
                self._serving_socket = socket.create_server(("127.0.0.1", 0))
        self._node = Node(
            name=self.node_name,
            workdir=self.workdir,
            kubeconfig=None
            if self.agent
            else json.loads(Path(self.api.kubeconfig_path).read_text()),
            config_maps=lambda ns, n: self._find("configmaps", ns, n),
            secrets=lambda ns, n: self._find("secrets", ns, n),
            log=self.log,
            extra_env=self._extra_env,
            restart_backoff_s=self._restart_backoff_s,
            tokens=self._token if self.agent else None,
        )
        self._controllers = (
            None
            if self.agent
            else Controllers(self.api, self.node_name, self.log, self._job_backoff_s)
        )
        self._proxy = ProxyProcess(self.log_dir / "kube-proxy.log")
        self._register_node()
        self._route.add()  # a no-op on the emulator's loopback pod network
        write_targets(self.targets_file, [])
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the process kubelet did not start")
        if self.agent and self.proxy_api is not None:
            self.api.watch("pods", self._wake_up, self._watching, fields=self._own_pods)
            for resource in ("services", "endpointslices"):
                self.proxy_api.watch(resource, self._wake_up, self._watching)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._watching.set()
        for prometheus in self._prometheus:
            prometheus.stop()
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self._stop_grace_s + 30)
        self._proxy.close()
        self._route.remove()
        if self._serving_socket is not None:
            self._serving_socket.close()
        self._remove_created_mount_points()
        if left := self.pod_processes():
            self.failures.append(RuntimeError(f"pod processes outlived the kubelet: {left}"))
        self._log_file.close()
        if exc is None and self.failures:
            raise AssertionError(
                f"the process kubelet failed {len(self.failures)} time(s); the first:\n"
                + "".join(traceback.format_exception(self.failures[0]))
                + f"\nlogs: {self.log_dir}"
            )

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake, self._stop = asyncio.Event(), asyncio.Event()
        runner = await self._serve_api()
        self._ready.set()
        seen, last_tick = "", 0.0
        while not self._stop.is_set():
            # A node agent's watches wake it (`_wake_up`); the emulator is polled.
            version = "" if self.agent else self.api.call(lambda s: s.resource_version)
            if version != seen or self._wake.is_set() or time.monotonic() - last_tick > 1.0:
                self._wake.clear()
                seen, last_tick = version, time.monotonic()
                try:
                    self._tick()
                except Exception as exc:  # a harness bug: reported when the kubelet stops
                    self.failures.append(exc)
                    self.log("tick failed:\n" + traceback.format_exc())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_s)
        await self._shutdown()
        if runner is not None:
            await runner.cleanup()

    async def _shutdown(self) -> None:
        for runtime in list(self._runtimes.values()):
            if runtime.uid not in self._stopping_pods:
                self._stopping_pods[runtime.uid] = asyncio.create_task(self._stop_pod(runtime))
        await asyncio.gather(*self._stopping_pods.values(), return_exceptions=True)

    # -- one pass -------------------------------------------------------------------------

    def _tick(self) -> None:
        if self.agent and self.proxy_api is not None:
            self._heartbeat()
            pods = self.api.list("pods", fields=self._own_pods)
            services = self.proxy_api.list("services")
            self._sync_pods(pods)
            table = slice_table(services, self.proxy_api.list("endpointslices"))
            # The `kubernetes` Service: the apiserver, which publishes no endpoints here.
            host, port = self.api.address
            table[f"{self._kubernetes_ip}:443"] = [f"{host}:{port}"]
            # One node: its own pods are all the pods a headless Service can list.
            self._sync_network(services, table, dns_records(services, pods))
            return
        assert self._controllers is not None
        deployments, jobs = self.api.list("deployments"), self.api.list("jobs")
        pods = self.api.list("pods")
        self._controllers.sync(deployments, jobs, pods)
        services = self._assign_cluster_ips(self.api.list("services"))
        self._sync_pods(pods)
        self._sync_network(services, proxy_table(services, pods), dns_records(services, pods))
        slices = endpoint_slices(services, pods)
        write_targets(self.targets_file, endpointslice_targets(slices, services, pods))
        jobs = service_monitor_jobs(self._list_if_served("servicemonitors"), str(self.targets_file))
        with self._prometheus_lock:
            self._monitor_jobs = jobs
            for prometheus in self._prometheus:
                running = prometheus.process.poll() is None  # the caller may stop it
                if running and prometheus.scrape_configs != jobs:
                    prometheus.reload(jobs)

    @property
    def _own_pods(self) -> str:
        return f"spec.nodeName={self.node_name}"

    def _wake_up(self) -> None:
        """A watch event (from a watch thread): tick at once."""
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the kubelet stopped
                self._loop.call_soon_threadsafe(self._wake.set)

    def _list_if_served(self, resource: str) -> list[Obj]:
        try:
            return list(self.api.list(resource))
        except LookupError:
            return []

    def _find(self, resource: str, namespace: str, name: str) -> Obj | None:
        found: Obj | None = self.api.find(resource, namespace, name)
        return found

    def _sync_pods(self, pods: list[Obj]) -> None:
        present = set()
        for pod in pods:
            meta = pod["metadata"]
            uid = meta["uid"]
            present.add(uid)
            runtime = self._runtimes.get(uid)
            if runtime is None:
                if meta.get("deletionTimestamp"):
                    self._release(pod)
                elif (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    self._start_pod(pod)
            elif meta.get("deletionTimestamp") and uid not in self._stopping_pods:
                self._stopping_pods[uid] = asyncio.create_task(self._stop_pod(runtime, pod))
            if uid in self._dirty and uid in self._runtimes:
                self._write_status(self._runtimes[uid])
        for uid, runtime in list(self._runtimes.items()):
            if uid not in present and uid not in self._stopping_pods:
                self._stopping_pods[uid] = asyncio.create_task(self._stop_pod(runtime))

    def _start_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        ip = self._pod_ips.allocate()
        runtime = PodRuntime(self._node, pod, ip, lambda: self._changed(meta["uid"]))
        self._runtimes[meta["uid"]] = runtime
        self._launched.append(runtime)
        self.log(f"{runtime.key}: starting on {ip}")
        runtime.start(hosts_text(meta["name"], ip, meta["namespace"], self._records))
        self._write_status(runtime)

    async def _stop_pod(self, runtime: PodRuntime, pod: Obj | None = None) -> None:
        """Stop the pod's processes, then let its object go (remove our finalizer)."""
        grace = None if pod is not None else min(runtime.grace_s, self._stop_grace_s)
        if self._stop is not None and self._stop.is_set():
            grace = min(runtime.grace_s, self._stop_grace_s)
        self.log(f"{runtime.key}: stopping")
        try:
            await runtime.stop(grace)
            self._write_status(runtime)
            identity = {"namespace": runtime.namespace, "name": runtime.name, "uid": runtime.uid}
            self._release(pod or {"metadata": identity})
            self.log(f"{runtime.key}: stopped")
        except Exception as exc:
            self.failures.append(exc)
            self.log(f"{runtime.key}: stopping failed:\n" + traceback.format_exc())
        finally:
            self._runtimes.pop(runtime.uid, None)
            self._stopping_pods.pop(runtime.uid, None)
            self._written.pop(runtime.uid, None)
            self._dirty.discard(runtime.uid)

    def _release(self, pod: Obj) -> None:
        """Let a deleted pod go, its processes stopped: a node agent deletes it for good
        (grace period 0, as the kubelet ends graceful deletion); on the emulator the
        kubelet removes its finalizer."""
        meta = pod["metadata"]
        if self.agent:
            options = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
            try:
                self.api.delete("pods", meta["namespace"], meta["name"], options)
            except ApiError as exc:
                if exc.status not in (404, 409):  # gone, or a new pod of the same name
                    raise
            return
        try:
            live = self.api.get("pods", meta["namespace"], meta["name"])
        except ApiError:
            return
        finalizers = live["metadata"].get("finalizers") or []
        if live["metadata"]["uid"] != meta["uid"] or FINALIZER not in finalizers:
            return
        keep = [f for f in finalizers if f != FINALIZER]
        with contextlib.suppress(ApiError):
            self.api.patch(
                "pods", meta["namespace"], meta["name"], {"metadata": {"finalizers": keep}}
            )

    def _changed(self, uid: str) -> None:
        self._dirty.add(uid)
        if self._wake is not None:
            self._wake.set()

    def _write_status(self, runtime: PodRuntime) -> None:
        self._dirty.discard(runtime.uid)
        status = runtime.status()
        if qos := (runtime.object.get("status") or {}).get("qosClass"):
            status["qosClass"] = qos  # set by the API server, immutable
        if self._written.get(runtime.uid) == status:
            return
        replace = [{"op": "add", "path": "/status", "value": status}]
        try:
            self.api.patch(
                "pods",
                runtime.namespace,
                runtime.name,
                replace,
                subresource="status",
                patch_type="json",
            )
            self._written[runtime.uid] = status
        except ApiError as exc:
            if exc.status != 404:
                raise

    # -- services -------------------------------------------------------------------------

    def _assign_cluster_ips(self, services: list[Obj]) -> list[Obj]:
        """Give every ClusterIP Service an address of ours, as the API server would."""
        out = []
        for service in services:
            meta, spec = service["metadata"], service.get("spec") or {}
            current = spec.get("clusterIP")
            if current == "None" or spec.get("type") == "ExternalName":
                out.append(service)
                continue
            ip = self._cluster_ips.get(meta["uid"])
            if ip is None:
                ip = self._cluster_ips[meta["uid"]] = self._service_ips.allocate()
            if current != ip:
                patch = {"spec": {"clusterIP": ip, "clusterIPs": [ip]}}
                self.log(f"{meta['namespace']}/{meta['name']}: service at {ip}")
                out.append(self.api.patch("services", meta["namespace"], meta["name"], patch))
            else:
                out.append(service)
        return out

    def _sync_network(
        self,
        services: list[Obj],
        table: dict[str, list[str]],
        records: list[tuple[str, str, str]],
    ) -> None:
        for error in self._proxy.update(table):
            self.log(f"kube-proxy: {error}")
        self._services = services
        if records != self._records:
            self._records = records
            for runtime in self._runtimes.values():
                runtime.update_hosts(
                    hosts_text(runtime.name, runtime.ip, runtime.namespace, records)
                )

    # -- the node, its host-side traces ---------------------------------------------------

    def _register_node(self) -> None:
        if self.agent:
            self._register_agent()
            return
        addresses = [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": socket.gethostname()},
        ]
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name},
            },
            "status": {
                "addresses": addresses,
                "conditions": [{**ready, "lastTransitionTime": utc_now()}],
            },
        }
        with contextlib.suppress(ApiError):
            self.api.create(node)

    # -- the node agent -------------------------------------------------------------------

    @functools.cached_property
    def _kubernetes_ip(self) -> str:
        ip: str = self.api.get("services", "default", "kubernetes")["spec"]["clusterIP"]
        return ip

    def _in_cluster_env(self) -> dict[str, str]:
        """What a kubelet gives every container for the in-cluster config: the
        `kubernetes` Service's address (which kube-proxy forwards to the apiserver)."""
        ip = self._kubernetes_ip
        return {
            "KUBERNETES_SERVICE_HOST": ip,
            "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_SERVICE_PORT_HTTPS": "443",
            "KUBERNETES_PORT": f"tcp://{ip}:443",
        }

    def _token(self, pod: Obj, source: Obj) -> str:
        """A projected volume's service-account token: the TokenRequest API's, bound to
        the pod (the node may ask only for its own pods' ServiceAccounts)."""
        meta = pod["metadata"]
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [source["audience"]] if source.get("audience") else [],
                "expirationSeconds": int(source.get("expirationSeconds", 3600)),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        answer = self.api.post("serviceaccounts", meta["namespace"], account, "token", request)
        token: str = answer["status"]["token"]
        return token

    def _node_conditions(self) -> list[Obj]:
        now = utc_now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "the process kubelet is posting ready status",
        }
        return [{**ready, "lastHeartbeatTime": now, "lastTransitionTime": now}]

    def _register_agent(self) -> None:
        """Create (or take over) this node's Node object and its Lease."""
        addresses = [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": self.node_name},
        ]
        labels = {
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                os.uname().machine, os.uname().machine
            ),
        }
        status = {
            "capacity": self._capacity,
            "allocatable": self._capacity,
            "addresses": addresses,
            "conditions": self._node_conditions(),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self._serving_port}},
            "nodeInfo": {
                "kubeletVersion": "process-kubelet",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "process://",
                "operatingSystem": "linux",
                "architecture": labels["kubernetes.io/arch"],
                "kernelVersion": os.uname().release,
                "osImage": "local processes",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": labels},
            "status": status,
        }
        try:
            created = self.api.create(node)
        except ApiError as exc:
            if exc.status != 409:
                raise
            created = self.api.patch(
                "nodes", None, self.node_name, {"status": status}, subresource="status"
            )
        self._reported = time.monotonic()
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.node_name,
            "uid": created["metadata"]["uid"],
        }
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.node_name,
                "namespace": "kube-node-lease",
                "ownerReferences": [owner],
            },
            "spec": {
                "holderIdentity": self.node_name,
                "leaseDurationSeconds": int(LEASE_RENEW_S * 4),
                "renewTime": micro_time(),
            },
        }
        try:
            self.api.create(lease)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._renew_lease()

    def _renew_lease(self) -> None:
        patch = {"spec": {"holderIdentity": self.node_name, "renewTime": micro_time()}}
        self.api.patch("leases", "kube-node-lease", self.node_name, patch)
        self._renewed = time.monotonic()

    def _heartbeat(self) -> None:
        """Renew the Lease every LEASE_RENEW_S, report Ready every NODE_STATUS_S."""
        now = time.monotonic()
        if now - self._renewed >= LEASE_RENEW_S:
            self._renew_lease()
        if now - self._reported >= NODE_STATUS_S:
            patch = {"status": {"conditions": self._node_conditions()}}
            self.api.patch(
                "nodes", None, self.node_name, patch, subresource="status", patch_type="strategic"
            )
            self._reported = now

    @property
    def _serving_port(self) -> int:
        return self._serving_socket.getsockname()[1] if self._serving_socket else 0

    async def _serve_api(self) -> aiohttp.web.AppRunner | None:
        """The kubelet API's `containerLogs` (what `kubectl logs` asks the apiserver, which
        asks the node), over TLS to clients with a certificate of the cluster's CA."""
        if self._serving_tls is None or self._serving_socket is None:
            return None
        cert, key, client_ca = self._serving_tls
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
        context.load_cert_chain(str(cert), str(key))
        context.verify_mode = ssl.CERT_REQUIRED
        app = aiohttp.web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._container_logs)
        runner = aiohttp.web.AppRunner(app, access_log=None)
        await runner.setup()
        await aiohttp.web.SockSite(runner, self._serving_socket, ssl_context=context).start()
        return runner

    async def _container_logs(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        """A container's output (the kubelet's own `[kubelet ...]` lines left out):
        `tailLines`, `limitBytes`; `follow` answers with what there is so far."""
        where = request.match_info
        runtime = next(
            (
                r
                for r in reversed(self._launched)
                if (r.namespace, r.name) == (where["namespace"], where["pod"])
            ),
            None,
        )
        container = (
            next((c for c in runtime.containers if c.name == where["container"]), None)
            if runtime
            else None
        )
        if container is None:
            what = f"{where['namespace']}/{where['pod']}/{where['container']}"
            return aiohttp.web.Response(status=404, text=f"no container {what} on this node")
        text = ""
        with contextlib.suppress(OSError):
            text = container.log_path.read_text(errors="replace")
        lines = [
            line for line in text.splitlines(keepends=True) if not line.startswith("[kubelet ")
        ]
        if tail := request.query.get("tailLines"):
            lines = lines[-int(tail) :] if int(tail) else []
        body = "".join(lines)
        if limit := request.query.get("limitBytes"):
            body = body.encode()[: int(limit)].decode(errors="ignore")
        return aiohttp.web.Response(text=body)

    def _remove_created_mount_points(self) -> None:
        """Remove the mount points the launchers had to create on the host (deepest first,
        only if they are still the same, empty file or folder, and no container mounts
        anything there: another kubelet's containers may use the same paths, and removing
        a mount point on the host detaches it from every container's mount namespace)."""
        record = self._node.created_record if hasattr(self, "_node") else None
        if record is None or not record.exists():
            return
        entries = [json.loads(line) for line in record.read_text().splitlines() if line]
        in_use = mount_points()
        for entry in sorted(entries, key=lambda e: -len(Path(e["path"]).parts)):
            path = Path(entry["path"])
            if any(p == entry["path"] or p.startswith(f"{entry['path']}/") for p in in_use):
                continue
            with contextlib.suppress(OSError):
                info = path.lstat()
                if (info.st_dev, info.st_ino) != (entry["dev"], entry["ino"]):
                    continue
                if path.is_dir():
                    path.rmdir()
                elif info.st_size == 0:
                    path.unlink()

    # -- the public API -------------------------------------------------------------------

    def log(self, message: str) -> None:
        """A line in `<workdir>/logs/kubelet.log`."""
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.write(f"{utc_now()} {message}\n")

    def cluster_ip(self, namespace: str, service: str) -> str:
        """The Service's cluster IP: reachable from the test process too."""
        ip: str = self.api.get("services", namespace, service)["spec"].get("clusterIP", "")
        if ip not in self._service_ips:
            raise LookupError(f"service {namespace}/{service} has no cluster IP of this node yet")
        return ip

    def service_address(self, namespace: str, service: str, port: str | int) -> str:
        """`clusterIP:port` of a Service port given by name or number."""
        spec = self.api.get("services", namespace, service)["spec"]
        for item in spec.get("ports") or []:
            if port in (item.get("name"), item["port"]):
                return f"{self.cluster_ip(namespace, service)}:{item['port']}"
        raise LookupError(f"service {namespace}/{service} has no port {port!r}")

    def service_endpoints(self, namespace: str, service: str, port: str | int) -> list[str]:
        """The endpoints kube-proxy forwards the Service port to now (readiness reaches
        the proxy a tick after it reaches the Deployment's status)."""
        return list(self._proxy.table.get(self.service_address(namespace, service, port), []))

    def pod_processes(self, namespace: str | None = None) -> list[int]:
        """Host PIDs of the running container launchers (of pods in `namespace`); each
        one's PID namespace holds all of that container's processes and dies with it."""
        pids = []
        for runtime in self._launched:
            if namespace not in (None, runtime.namespace):
                continue
            for container in runtime.containers:
                process = container.process
                if process is not None and process.returncode is None:
                    pids.append(process.pid)
        return pids

    def logs(self, namespace: str | None = None, prefix: str = "") -> list[Path]:
        """Container log files, for pods of `namespace` whose names start with `prefix`."""
        pattern = f"{namespace or '*'}_{prefix}*.log"
        return sorted(self.log_dir.glob(pattern))

    def explain(self, namespace: str | None = None, prefix: str = "", tail: int = 8) -> str:
        """What the pods (of `namespace`, named `prefix...`) are doing: phase, readiness,
        restarts, the latest probe or start problem, the log's last lines and its path."""
        lines = []
        for runtime in list(self._launched):
            if namespace not in (None, runtime.namespace) or not runtime.name.startswith(prefix):
                continue
            gone = " (stopped)" if runtime.finished else ""
            waiting = f", waiting: {runtime.pending}" if runtime.pending else ""
            lines.append(f"pod {runtime.key}{gone} {runtime.ip}: {runtime.phase()}{waiting}")
            for c in runtime.containers:
                state = next(iter(c.state), "?")
                lines.append(
                    f"  container {c.name}: {state}, ready={c.ready}, restarts={c.restart_count}"
                    + (f"\n    last run ended: {c.ended}" if c.ended else "")
                    + (f"\n    problem: {c.problem}" if c.problem and not c.ready else "")
                    + f"\n    log: {c.log_path}"
                )
                with contextlib.suppress(OSError):
                    text = c.log_path.read_text(errors="replace").splitlines()[-tail:]
                    lines += [f"    | {line}" for line in text]
        if not prefix:
            lines.append(self.explain_services(namespace))
        return "\n".join(lines) or f"no pods{f' in {namespace}' if namespace else ''}"

    def explain_services(self, namespace: str | None = None) -> str:
        """The Services (of `namespace`): cluster IP, and per port its endpoints; for a
        headless one, its ports and the addresses its name resolves to."""
        lines, table = [], self._proxy.table
        for service in self._services:
            meta, spec = service["metadata"], service.get("spec") or {}
            if namespace not in (None, meta["namespace"]):
                continue
            ip = spec.get("clusterIP", "")
            where = f"service {meta['namespace']}/{meta['name']}"
            if ip == "None":  # headless: what its name resolves to
                key = (meta["namespace"], meta["name"])
                found = [a for a, *service_key in self._records if tuple(service_key) == key]
                ports = ", ".join(
                    f"{p.get('name', '')}:{p['port']}" for p in spec.get("ports") or []
                )
                lines.append(
                    f"{where} headless: {ports or 'no ports'} -> {found or 'no endpoints'}"
                )
                continue
            ports = []
            for port in spec.get("ports") or []:
                backends = table.get(f"{ip}:{port['port']}") or "no endpoints"
                ports.append(f"{port.get('name', '')}:{port['port']} -> {backends}")
            lines.append(f"{where} {ip}: {', '.join(ports) or 'no ports'}")
        return "\n".join(lines)

    def start_prometheus(self, *, port: int) -> Prometheus:
        """A real Prometheus scraping what the ServiceMonitors select, reloaded as they
        change (started and ready; stopped with the kubelet, or by the caller)."""
        with self._prometheus_lock:
            jobs = self._monitor_jobs
        prometheus = Prometheus(self.workdir / "prometheus", (), port, scrape_configs=jobs)
        try:
            prometheus.wait_ready()
            with self._prometheus_lock:  # the jobs may have changed meanwhile
                if prometheus.scrape_configs != self._monitor_jobs:
                    prometheus.reload(self._monitor_jobs)
                self._prometheus.append(prometheus)
        except BaseException:
            prometheus.stop()
            raise
        return prometheus
