"""The real control plane with the process kubelet as its node (docs/e2e.md, "The
real-cluster tier"): `scripts/cluster.py up` (etcd, kube-apiserver, controller-manager,
scheduler, and the node agent), then what a user does with kubectl and helm.

- the Node registers Ready with capacity and keeps its Lease renewed;
- in a namespace enforcing Pod Security `restricted`, a Deployment of `python -m
  http.server` is scheduled (the real scheduler), made into pods (the real Deployment and
  ReplicaSet controllers), run and probed (the node), published in EndpointSlices (the
  real EndpointSlice controller) and reachable through its Service's cluster IP and,
  from another pod, by its Service name; `kubectl logs` shows its output;
- pods reach the apiserver with the in-cluster config and their own ServiceAccount's
  token (TokenRequest), so RBAC holds: the `default` account is refused, a bound one is
  not;
- the story's Prometheus (tests/support/cluster.py) scrapes what ServiceMonitors select
  among the EndpointSlices' targets;
- deleting the Deployment stops its processes (graceful deletion finished by the node);
- `helm install` of the chart: the operator runs with its own ServiceAccount; the example
  pipelines are accepted in a restricted namespace and reconciled, and `kubectl get
  predictionpipelines` shows the printer columns; digits-cascade (its models from this
  checkout) is profiled, planned and served (an inference through the router's Service)
  without a single refusal from RBAC, and deleting it removes all its objects.

Skipped where the control plane's binaries are not built (scripts/kube/build.sh) or the
process kubelet cannot run (root, util-linux, iproute2).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import yaml

from tests.support import control_plane
from tests.support.cluster import CATALOG, ServiceMonitorScrapes
from tests.support.kube.client import ClusterClient
from tests.support.kube.kubectl import kubectl_binary
from tests.support.kube.monitoring import SERVICE_MONITOR_CRD
from tests.support.load import KeepAliveLoad, OpenLoopLoad
from tests.support.prometheus import Prometheus
from tests.support.serve import build_example

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "bin" / "helm"
NS = "web"
EXAMPLE = ROOT / "manifests" / "examples" / "digits-cascade.yaml"
T = TypeVar("T")


pytestmark = [
    pytest.mark.skipif(
        control_plane.node_missing() is not None, reason=str(control_plane.node_missing())
    ),
    pytest.mark.slow,
    pytest.mark.timeout(600),
]

RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@dataclass
class Cluster:
    kubeconfig: str
    dir: Path
    kubectl_path: str

    def kubectl(
        self, *args: str, stdin: Any = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        text = stdin if stdin is None or isinstance(stdin, str) else yaml.safe_dump_all(stdin)
        result = subprocess.run(
            [self.kubectl_path, "--kubeconfig", self.kubeconfig, *args],
            input=text,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)

    def node_log(self, pattern: str = "kubelet.log") -> str:
        """The node agent's log (or a container's), for failure messages."""
        return "\n".join(
            p.read_text(errors="replace")[-3000:]
            for p in (self.dir / "node" / "logs").glob(pattern)
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("cp")
    started = control_plane.running(state_dir, node=True)
    try:
        kubeconfig = next(started)
        run = Path(json.loads((state_dir / "cp.json").read_text())["dir"])
        cluster = Cluster(kubeconfig, run, kubectl_binary())
        yield cluster
        log = (run / "node" / "logs" / "kubelet.log").read_text(errors="replace")
        failed = [line for line in log.splitlines() if line.endswith("failed:")]
        assert not failed, cluster.node_log()  # the node agent met no error
    finally:
        started.close()


def wait_for(
    what: str, check: Callable[[], T | None], timeout_s: float, why: Callable[[], str]
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s\n{why()}")
        time.sleep(0.5)


def http_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return int(response.status)


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- the control plane and its node --------------------------------------------------------


def test_kubectl_reports_the_real_server_version(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == control_plane.KUBE_VERSION


def test_the_node_is_ready_with_capacity_and_renews_its_lease(cluster: Cluster) -> None:
    node = cluster.get("node", "local")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    capacity = node["status"]["allocatable"]
    assert int(capacity["cpu"]) == os.cpu_count()
    assert capacity["pods"] == "110"
    assert capacity["memory"].endswith("Ki") and int(capacity["memory"][:-2]) > 0
    assert not node["spec"].get("taints"), node["spec"]  # schedulable: nothing not-ready
    first = cluster.get("lease", "-n", "kube-node-lease", "local")["spec"]
    assert first["holderIdentity"] == "local"

    def renewed() -> bool:
        spec = cluster.get("lease", "-n", "kube-node-lease", "local")["spec"]
        return parse_time(spec["renewTime"]) > parse_time(first["renewTime"])

    wait_for("the Lease renewed", renewed, 20, cluster.node_log)


# -- a Deployment behind a Service, in a restricted namespace -------------------------------


def web_objects() -> list[dict[str, Any]]:
    labels = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn")}
    container = {
        "name": "web",
        "image": "python:3.11-slim",  # not pulled: the node runs the command
        "command": ["python", "-m", "http.server", "8080", "--bind", "$(POD_IP)"],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": RESTRICTED_CONTAINER,
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": labels}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": NS},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "securityContext": RESTRICTED_POD,
                        "containers": [container],
                        # http.server as PID 1 has no SIGTERM handler: it would wait 30 s.
                        "terminationGracePeriodSeconds": 1,
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": NS, "labels": {"app": "web"}},
            "spec": {
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
            },
        },
    ]


def one_shot_pod(name: str, script: str, account: str = "default") -> dict[str, Any]:
    """A pod that runs a Python script once; its termination message is the result."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": account,
            "securityContext": RESTRICTED_POD,
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11-slim",
                    "command": ["python", "-c", script],
                    "securityContext": RESTRICTED_CONTAINER,
                }
            ],
        },
    }


def finished_message(cluster: Cluster, name: str) -> str:
    """Wait for a one-shot pod to end; its termination message."""

    def ended() -> dict[str, Any] | None:
        pod = cluster.get("pod", "-n", NS, name)
        if pod["status"].get("phase") not in ("Succeeded", "Failed"):
            return None
        return pod

    pod = wait_for(f"pod {name} ran", ended, 60, cluster.node_log)
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert pod["status"]["phase"] == "Succeeded", (terminated, cluster.node_log(f"{NS}_{name}_*"))
    return str(terminated.get("message", ""))


@pytest.fixture(scope="module")
def web(cluster: Cluster) -> Cluster:
    cluster.kubectl("apply", "-f", "-", stdin=web_objects())

    def available() -> bool:
        status = cluster.get("deployment", "-n", NS, "web").get("status") or {}
        return status.get("availableReplicas") == 2

    wait_for("Deployment web available", available, 60, cluster.node_log)
    return cluster


def test_a_deployment_runs_ready_and_serves_through_its_service(web: Cluster) -> None:
    pods = web.get("pods", "-n", NS, "-l", "app=web")["items"]
    assert len(pods) == 2
    assert {p["spec"]["nodeName"] for p in pods} == {"local"}  # bound by the real scheduler
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet" for p in pods)
    ips = sorted(p["status"]["podIP"] for p in pods)

    def sliced() -> list[str] | None:
        slices = web.get("endpointslices", "-n", NS, "-l", "kubernetes.io/service-name=web")
        ready = sorted(
            address
            for item in slices["items"]
            for endpoint in item.get("endpoints") or []
            if endpoint["conditions"].get("ready")
            for address in endpoint["addresses"]
        )
        return ready if ready == ips else None

    wait_for("the EndpointSlice lists both pods", sliced, 30, web.node_log)
    cluster_ip = web.get("service", "-n", NS, "web")["spec"]["clusterIP"]

    def answers() -> bool:
        try:
            return http_status(f"http://{cluster_ip}/") == 200
        except OSError:
            return False

    wait_for("the Service answers", answers, 30, lambda: web.node_log("kube-proxy.log"))
    script = (
        "import urllib.request\n"
        "r = urllib.request.urlopen('http://web.web.svc.cluster.local/', timeout=5)\n"
        "s = urllib.request.urlopen('http://web/', timeout=5)\n"
        "open('/dev/termination-log', 'w').write(f'{r.status} {s.status}')\n"
    )
    web.kubectl("apply", "-f", "-", stdin=[one_shot_pod("fetch", script)])
    assert finished_message(web, "fetch") == "200 200"
    # kubectl logs: the apiserver asks the node's kubelet API for the container's output.
    logs = web.kubectl("logs", "-n", NS, pods[0]["metadata"]["name"]).stdout
    assert logs.startswith(f"Serving HTTP on {pods[0]['status']['podIP']} port 8080"), logs


SA_SCRIPT = """
import kubernetes as k
k.config.load_incluster_config()
try:
    out = f"listed {len(k.client.CoreV1Api().list_namespaced_pod('web').items)} pods"
except k.client.ApiException as e:
    out = f"{e.status} {e.body}"
open("/dev/termination-log", "w").write(out[:4000])
"""


def test_pods_reach_the_apiserver_as_their_own_service_account(web: Cluster) -> None:
    rbac: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": NS}],
        },
    ]
    web.kubectl("apply", "-n", NS, "-f", "-", stdin=rbac)
    web.kubectl(
        "apply",
        "-f",
        "-",
        stdin=[
            one_shot_pod("as-default", SA_SCRIPT),
            one_shot_pod("as-reader", SA_SCRIPT, account="reader"),
        ],
    )
    refused = finished_message(web, "as-default")
    assert refused.startswith("403 "), refused
    assert 'User \\"system:serviceaccount:web:default\\" cannot list' in refused, refused
    assert re.fullmatch(r"listed \d+ pods", finished_message(web, "as-reader"))
    pod = web.get("pod", "-n", NS, "as-reader")
    sources = next(v for v in pod["spec"]["volumes"] if "projected" in v)["projected"]["sources"]
    assert any("serviceAccountToken" in s for s in sources)  # the apiserver's, not ours


def test_prometheus_scrapes_what_service_monitors_select(web: Cluster, tmp_path: Path) -> None:
    """The story's Prometheus on this control plane (tests/support/cluster.py): the
    ServiceMonitors' jobs over the EndpointSlices' targets, from the apiserver, loaded
    into a running Prometheus; the selector, the namespace and the port pick the targets."""
    web.kubectl("apply", "-f", "-", stdin=json.dumps(SERVICE_MONITOR_CRD))
    web.kubectl("wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com")
    endpoint = {"path": "/", "interval": "1s"}
    monitors = [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"matchLabels": labels}, "endpoints": [{**endpoint, **port}]},
        }
        for name, labels, port in (
            ("web", {"app": "web"}, {"port": "http"}),
            ("by-target-port", {"app": "web"}, {"targetPort": 8080}),
            ("other-port", {"app": "web"}, {"port": "metrics"}),  # no such port
            ("other-service", {"app": "nope"}, {"port": "http"}),  # no such Service
        )
    ]
    # Another namespace's ServiceMonitor selects this namespace's Service only with a
    # namespaceSelector naming it.
    elsewhere = {**monitors[0], "metadata": {"name": "elsewhere", "namespace": "default"}}
    web.kubectl("apply", "-f", "-", stdin=[*monitors, elsewhere])
    pods = {p["metadata"]["name"]: p for p in web.get("pods", "-n", NS, "-l", "app=web")["items"]}
    client = ClusterClient(web.kubeconfig)
    with Prometheus(tmp_path, (), free_port()) as prometheus:
        scrapes = ServiceMonitorScrapes(client, prometheus, tmp_path)
        try:

            def discovered() -> list[dict[str, Any]] | None:
                found = prometheus.targets()
                return found if len(found) >= 2 * len(pods) else None

            targets = wait_for(
                "Prometheus has the targets", discovered, 30, lambda: scrapes.problem
            )
        finally:
            scrapes.stop()
            client.close()
    seen = sorted((t["scrapePool"], t["labels"]["pod"], t["scrapeUrl"]) for t in targets)
    assert seen == sorted(
        (f"serviceMonitor/{NS}/{monitor}/0", name, f"http://{pod['status']['podIP']}:8080/")
        for monitor in ("web", "by-target-port")
        for name, pod in pods.items()
    )
    for target in targets:
        labels = target["labels"]
        assert (labels["job"], labels["namespace"], labels["service"]) == ("web", NS, "web")
        assert labels["container"] == "web"
        assert labels["endpoint"] in ("http", "8080")
    web.kubectl("delete", "servicemonitors", "-n", NS, "--all")
    web.kubectl("delete", "servicemonitor", "-n", "default", "elsewhere")


def test_deleting_the_deployment_stops_its_processes(web: Cluster) -> None:
    pods = web.get("pods", "-n", NS, "-l", "app=web")["items"]
    addresses = [(p["status"]["podIP"], 8080) for p in pods]
    for address in addresses:
        socket.create_connection(address, timeout=5).close()
    web.kubectl("delete", "deployment", "-n", NS, "web", "--wait=false")

    def gone() -> bool:
        return not web.get("pods", "-n", NS, "-l", "app=web")["items"]

    wait_for("the pods gone", gone, 180, web.node_log)
    for address in addresses:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=5).close()


# -- the chart ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def chart(cluster: Cluster) -> Cluster:
    """The chart installed (release `sloline` in `sloline-system`, restricted), with the
    examples' models from this checkout (hostPath) and small profiling."""
    if not HELM.exists():
        pytest.skip("helm is not installed (make .tools/bin/helm)")
    build_example("digits-cascade")
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": labels}}
        for n in ("sloline-system", "ml")
    ]
    # Its models come from a hostPath, which `restricted` forbids.
    namespaces.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "serve"}})
    cluster.kubectl("apply", "-f", "-", stdin=namespaces)
    examples = str(ROOT / "examples")
    values = {
        # The operator's servers bind 0.0.0.0 where pods share the host's ports (docs/e2e.md,
        # "Not emulated"): free ones, so that no other cluster on this machine holds them.
        "operator": {"ports": {"metrics": free_port(), "health": free_port()}},
        "admission": {"webhook": {"port": free_port()}},
        "settings": {
            "catalog": CATALOG,
            "profiling": {"cap": 4, "repeats": 3, "budgetS": 0.2, "pollS": 0.5},
            "models": {
                "root": examples,
                "volume": {"hostPath": {"path": examples, "type": "Directory"}},
            },
        },
    }
    subprocess.run(
        [str(HELM), "install", "sloline-crds", str(ROOT / "helm" / "sloline-crds"),
         "--kubeconfig", cluster.kubeconfig, "--wait", "--timeout", "60s"],
        capture_output=True, text=True, check=True, timeout=90,
    )  # fmt: skip
    subprocess.run(
        [str(HELM), "install", "sloline", str(ROOT / "helm" / "sloline"),
         "--namespace", "sloline-system", "--kubeconfig", cluster.kubeconfig,
         "--wait", "--timeout", "120s", "-f", "-"],
        input=yaml.safe_dump(values), capture_output=True, text=True, check=True, timeout=180,
    )  # fmt: skip
    return cluster


def operator_log(cluster: Cluster) -> str:
    return cluster.node_log("sloline-system_sloline-operator-*_operator.log")


def test_helm_installs_the_operator_which_takes_the_examples(chart: Cluster) -> None:
    operator = chart.get("pods", "-n", "sloline-system")["items"]
    assert [p["spec"]["serviceAccountName"] for p in operator] == ["sloline-operator"]
    assert operator[0]["status"]["phase"] == "Running"
    for example in sorted((ROOT / "manifests" / "examples").glob("*.yaml")):
        chart.kubectl("apply", "-n", "ml", "-f", str(example))

    def phases() -> dict[str, str] | None:
        items = chart.get("predictionpipelines", "-n", "ml")["items"]
        found = {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}
        return found if len(found) == 2 and all(found.values()) else None

    found = wait_for("both pipelines have a phase", phases, 60, lambda: operator_log(chart))
    table = chart.kubectl("get", "predictionpipelines", "-n", "ml").stdout.splitlines()
    columns = ["NAME", "READY", "URL", "PHASE", "SLO", "EST-P99", "COST/H", "ATTAINMENT", "AGE"]
    assert table[0].split() == columns
    for row in table[1:]:
        name, *rest = row.split()
        assert found[name] in rest, table
    jobs = chart.get("jobs", "-n", "ml")["items"]
    assert jobs
    assert all(j["metadata"]["ownerReferences"][0]["kind"] == "PredictionPipeline" for j in jobs)
    chart.kubectl("delete", "namespace", "ml", "--wait=false")


def replacement_ready(pods: list[dict[str, Any]], gone: dict[str, Any]) -> bool:
    """Another pod than `gone` among `pods` is Ready."""
    return any(
        p["metadata"]["uid"] != gone["metadata"]["uid"]
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
        for p in pods
    )


def infer(router_ip: str) -> None:
    """One digits-cascade inference through the router Service's cluster IP."""
    request = {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]
    }
    answer = urllib.request.urlopen(
        urllib.request.Request(
            f"http://{router_ip}:8000/v2/models/digits-cascade/infer",
            data=json.dumps(request).encode(),
            headers={"Content-Type": "application/json"},
        ),
        timeout=30,
    )
    outputs = {o["name"]: o for o in json.loads(answer.read())["outputs"]}
    assert outputs["probabilities"]["shape"] == [1, 10]
    assert 0 <= int(outputs["label"]["data"][0]) <= 9


def test_the_operator_serves_a_pipeline_and_deleting_it_removes_everything(
    chart: Cluster,
) -> None:
    """Served; the operator restarted mid-way and a spec change after it; a worker pod
    evicted; deleted with everything it owns."""
    chart.kubectl("apply", "-n", "serve", "-f", str(EXAMPLE))

    def ready() -> bool:
        item = chart.get("predictionpipeline", "-n", "serve", "digits-cascade")
        return (item.get("status") or {}).get("phase") == "Ready"

    def why() -> str:
        return chart.kubectl("get", "slp,deploy,jobs,pods", "-n", "serve", check=False).stdout + (
            operator_log(chart)
        )

    wait_for("digits-cascade Ready", ready, 420, why)
    router = chart.get("service", "-n", "serve", "digits-cascade-router")["spec"]["clusterIP"]
    infer(router)

    # The operator restarts mid-way: a new operator pod takes over, the pipeline keeps
    # serving, and a spec change made after the restart is planned and deployed.
    selector = "app.kubernetes.io/component=operator"
    (old,) = chart.get("pods", "-n", "sloline-system", "-l", selector)["items"]
    chart.kubectl("delete", "pod", "-n", "sloline-system", old["metadata"]["name"])

    def new_operator_ready() -> bool:
        pods = chart.get("pods", "-n", "sloline-system", "-l", selector)["items"]
        return replacement_ready(pods, old)

    wait_for("a new operator pod Ready", new_operator_ready, 180, why)
    infer(router)
    chart.kubectl(
        "patch", "predictionpipeline", "-n", "serve", "digits-cascade", "--type", "merge",
        "-p", json.dumps({"spec": {"slo": {"latencyMs": 60}}}),
    )  # fmt: skip

    def replanned() -> bool:
        item = chart.get("predictionpipeline", "-n", "serve", "digits-cascade")
        status = item.get("status") or {}
        planned = next((c for c in status.get("conditions") or [] if c["type"] == "Planned"), {})
        return (
            planned.get("status") == "True"
            and planned.get("observedGeneration") == item["metadata"]["generation"]
            and status.get("phase") == "Ready"
        )

    wait_for("the SLO change planned by the new operator", replanned, 300, why)
    infer(router)

    # A drain-style eviction (the Eviction API, as `kubectl drain` uses) of a worker pod:
    # its Deployment replaces it on the node and the pipeline answers again.
    fast = "sloline.dev/pipeline=digits-cascade,sloline.dev/stage=fast"
    (worker,) = chart.get("pods", "-n", "serve", "-l", fast)["items"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": worker["metadata"]["name"], "namespace": "serve"},
    }
    path = f"/api/v1/namespaces/serve/pods/{worker['metadata']['name']}/eviction"
    chart.kubectl("create", "--raw", path, "-f", "-", stdin=json.dumps(eviction))

    def replaced() -> bool:
        pods = chart.get(
            "pods",
            "-n",
            "serve",
            "-l",
            "sloline.dev/pipeline=digits-cascade,sloline.dev/stage=fast",
        )["items"]
        return ready() and any(
            p["metadata"]["uid"] != worker["metadata"]["uid"]
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions") or []
            )
            for p in pods
        )

    wait_for("the evicted worker replaced and the pipeline Ready", replaced, 240, why)
    infer(router)
    log = operator_log(chart)
    assert "Forbidden" not in log and " 403" not in log, log  # the chart's RBAC suffices
    chart.kubectl("delete", "predictionpipeline", "-n", "serve", "digits-cascade")

    def left() -> list[str]:
        items = chart.get("deploy,svc,configmap,secret,jobs,pods", "-n", "serve")["items"]
        names = [f"{o['kind']}/{o['metadata']['name']}" for o in items]
        return [n for n in names if n != "ConfigMap/kube-root-ca.crt"]

    def still_there() -> str:
        return f"left: {left()}\n{why()}"

    wait_for(
        "the pipeline's objects gone (garbage collection)", lambda: not left(), 240, still_there
    )


# -- routers: a rolling restart under load ----------------------------------------------------

ROLLING_NS = "rolling"
ROUTERS = "sloline.dev/pipeline=digits-cascade,app.kubernetes.io/component=router"
# The request's own deadline (`timeout_ms`, as the gRPC load sends too) is generous: this
# test is about the restart, not about a 2-core machine keeping the 50 ms SLO.
PIXELS = json.dumps(
    {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [3.0] * 64}],
        "parameters": {"timeout_ms": 30_000},
    }
).encode()


def valid_digit(body: bytes) -> bool:
    outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
    return 0 <= int(outputs["label"]["data"][0]) <= 9


def test_a_rolling_restart_of_three_routers_under_load_fails_no_request(chart: Cluster) -> None:
    """digits-cascade with 3 routers; keep-alive HTTP clients and an open-loop gRPC client,
    neither retrying, send steady load through the router Service while `kubectl rollout
    restart` replaces every router: no request fails."""
    ns = ROLLING_NS
    chart.kubectl("create", "namespace", ns)
    chart.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))

    def why() -> str:
        return chart.kubectl("get", "slp,deploy,pods,endpointslices", "-n", ns, check=False).stdout

    def ready() -> bool:
        item = chart.get("predictionpipeline", "-n", ns, "digits-cascade")
        return (item.get("status") or {}).get("phase") == "Ready"

    wait_for("digits-cascade Ready", ready, 420, lambda: why() + operator_log(chart))
    # Three routers: `spec.replicas` of the router Deployment is the tuner's between plans
    # (none runs here: no Prometheus), as `kubectl scale` sets it.
    chart.kubectl("scale", "deployment", "-n", ns, "digits-cascade-router", "--replicas", "3")

    def three_ready_routers() -> list[str] | None:
        pods = chart.get("pods", "-n", ns, "-l", ROUTERS)["items"]
        ready = [
            p["metadata"]["uid"]
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        ]
        return ready if len(ready) == len(pods) == 3 else None

    old = set(wait_for("three routers ready", three_ready_routers, 120, why))
    service = chart.get("service", "-n", ns, "digits-cascade-router")["spec"]["clusterIP"]
    infer(service)
    rows = np.full((4, 64), 3.0, dtype=np.float32)
    with (
        KeepAliveLoad(
            (service, 8000), "/v2/models/digits-cascade/infer", PIXELS, valid_digit
        ) as http_load,
        OpenLoopLoad(f"{service}:8001", "digits-cascade", "pixels", rows, max_retries=0) as grpc,
    ):
        grpc.rate_rps = 10
        time.sleep(3)
        before = (http_load.ok, len(grpc.sent))
        chart.kubectl("rollout", "restart", "deployment", "-n", ns, "digits-cascade-router")
        chart.kubectl(
            "rollout", "status", "deployment", "-n", ns, "digits-cascade-router",
            "--timeout", "180s",
        )  # fmt: skip

        def old_ones_gone() -> bool:
            pods = chart.get("pods", "-n", ns, "-l", ROUTERS)["items"]
            return not old & {p["metadata"]["uid"] for p in pods}

        wait_for("the old routers gone", old_ones_gone, 60, why)
        new = set(wait_for("three new routers ready", three_ready_routers, 60, why))
        time.sleep(2)
    sent = grpc.sent
    grpc_failed = [s.error for s in sent if s.latency_s is None]
    report = (
        f"rolling restart of 3 routers: HTTP {http_load.ok} ok / {len(http_load.failures)} "
        f"failed ({http_load.closes} answers with Connection: close), gRPC "
        f"{len(sent) - len(grpc_failed)} ok / {len(grpc_failed)} failed"
    )
    print(report)
    kinds = Counter(f[:100] for f in [*http_load.failures, *grpc_failed])
    failed = f"{report}\n{kinds.most_common(5)}\n{chart.node_log(f'{ns}_*router*')}"
    assert not new & old and len(new) == 3  # every router replaced
    assert not http_load.failures and not grpc_failed, failed
    assert http_load.ok > before[0] and len(sent) > before[1]  # load ran across the rollout
    chart.kubectl("delete", "namespace", ns, "--wait=false")
