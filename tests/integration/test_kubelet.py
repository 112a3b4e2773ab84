"""The process kubelet (tests/support/kube/kubelet.py) runs what the emulator holds as a
node would: Deployments and Jobs become pods, pods become local processes in their own
namespaces, Services get addresses, names and a proxy, ServiceMonitors reach a real
Prometheus. These tests pin the behaviour the e2e story relies on."""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube import KubeEmulator
from tests.support.kube.kubelet import ProcessKubelet, unsupported_reason
from tests.support.kube.monitoring import SERVICE_MONITOR_CRD
from tests.support.kube.network import slice_table
from tests.support.net import free_port

NS = "default"
# A tiny web server bound to the pod's IP: `/` answers with the pod's name, `/metrics` in
# Prometheus' text format; SIGTERM ends it (as PID 1 it would otherwise ignore SIGTERM).
SERVER = """
import http.server, os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        name = os.environ["POD_NAME"]
        body = (f'tiny_requests{{from_pod="{name}"}} 1\\n' if self.path == "/metrics"
                else f"hello from {name} ({os.environ.get('GREETING', '')})").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], 8080), Handler).serve_forever()
"""
POD_ENV = [
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
]


@pytest.fixture
def node(kube: KubeEmulator, tmp_path: Path) -> Iterator[ProcessKubelet]:
    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    with ProcessKubelet(kube, tmp_path / "node") as kubelet:
        yield kubelet


def server(name: str, replicas: int = 1, **container: Any) -> dict[str, Any]:
    spec = {
        "name": "web",
        "image": "python:3.11",
        "command": ["python", "-c", SERVER],
        "args": ["$(POD_IP)"],
        "env": POD_ENV,
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        **container,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [spec]},
            },
        },
    }


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    }


def job(name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A Job running a Python script; `spec` adds Job spec fields."""
    container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", script]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            **spec,
        },
    }


def wait(
    kube: KubeEmulator,
    node: ProcessKubelet,
    resource: str,
    name: str,
    condition: Callable[[dict[str, Any]], bool],
    timeout_s: float = 20.0,
) -> dict[str, Any]:
    try:
        return kube.wait_for(resource, NS, name, condition, timeout_s=timeout_s)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n\nthe node's pods:\n{node.explain()}") from None


def ready_replicas(n: int) -> Callable[[dict[str, Any]], bool]:
    def check(deployment: dict[str, Any]) -> bool:
        status = deployment.get("status") or {}
        return bool(
            status.get("readyReplicas", 0) == n
            and status.get("replicas", 0) == n
            and status.get("observedGeneration") == deployment["metadata"]["generation"]
        )

    return check


def finished(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def terminated(kube: KubeEmulator, job_name: str) -> list[dict[str, Any]]:
    pods = kube.list("pods", NS, labels=f"job-name={job_name}")
    return [p["status"]["containerStatuses"][0]["state"]["terminated"] for p in pods]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def pods_gone(kube: KubeEmulator, selector: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while kube.list("pods", NS, labels=selector):
        assert time.monotonic() < deadline, f"pods {selector} still exist"
        time.sleep(0.05)


def marked_processes(marker: str) -> list[int]:
    """PIDs of processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


# -- tests --------------------------------------------------------------------------------


def test_service_names_resolve_in_pods_and_cluster_ips_proxy_from_the_test(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    kube.create(server("web", replicas=2))
    kube.create(service("web"))
    wait(kube, node, "deployments", "web", ready_replicas(2))
    deadline = time.monotonic() + 10
    while len(node.service_endpoints(NS, "web", "http")) < 2:
        assert time.monotonic() < deadline, node.explain_services(NS)
        time.sleep(0.05)
    address = node.service_address(NS, "web", "http")
    answers = collections.Counter(get(f"http://{address}/") for _ in range(40))
    pods = {p["metadata"]["name"] for p in kube.list("pods", NS, labels="app=web")}
    assert {a.split()[2] for a in answers} == pods, answers  # both endpoints serve

    # From inside a pod: short and qualified names resolve through the pod's /etc/hosts.
    script = (
        "import urllib.request\n"
        "names = ['web', 'web.default', 'web.default.svc.cluster.local']\n"
        "answers = [urllib.request.urlopen(f'http://{n}/').read().decode() for n in names]\n"
        "open('/dev/termination-log', 'w').write(' | '.join(answers))\n"
    )
    kube.create(job("ask", script))
    done = wait(kube, node, "jobs", "ask", finished)
    assert condition(done, "Complete")["status"] == "True", node.explain()
    (result,) = terminated(kube, "ask")
    assert result["exitCode"] == 0 and result["reason"] == "Completed"
    parts = result["message"].split(" | ")
    assert len(parts) == 3 and all(p.split()[2] in pods for p in parts), result
    assert done["status"]["succeeded"] == 1 and done["status"]["completionTime"]


def resolve_in_a_pod(
    kube: KubeEmulator, node: ProcessKubelet, job_name: str, *names: str
) -> list[str]:
    """What `getaddrinfo` answers for each name inside a pod: its addresses, sorted and
    comma-joined, or `unknown`."""
    script = (
        "import socket\n"
        "def ask(name):\n"
        "    try:\n"
        "        found = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)\n"
        "    except socket.gaierror:\n"
        "        return 'unknown'\n"
        "    return ','.join(sorted({a[4][0] for a in found}))\n"
        f"answers = [ask(n) for n in {list(names)!r}]\n"
        "open('/dev/termination-log', 'w').write(' | '.join(answers))\n"
    )
    kube.create(job(job_name, script))
    done = wait(kube, node, "jobs", job_name, finished)
    assert condition(done, "Complete")["status"] == "True", node.explain()
    (result,) = terminated(kube, job_name)
    return list(result["message"].split(" | "))


def test_a_headless_service_name_resolves_to_each_of_its_pods(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    """`clusterIP: None`: no cluster IP, no proxy; in a pod, `getaddrinfo` answers the
    name with every endpoint pod's IP: not-ready ones too with
    `publishNotReadyAddresses`, only ready ones without it."""
    never_ready = {"readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1}}
    kube.create(server("web", replicas=2, **never_ready))
    for name, everyone in (("all-web", True), ("ready-web", False)):
        headless = service("web")
        headless["metadata"]["name"] = name
        headless["spec"].update(clusterIP="None", publishNotReadyAddresses=everyone)
        kube.create(headless)

    def pod_ips() -> str:
        return ",".join(
            sorted(p["status"]["podIP"] for p in kube.list("pods", NS, labels="app=web"))
        )

    def running(n: int) -> Callable[[dict[str, Any]], bool]:
        def check(_: dict[str, Any]) -> bool:
            pods = kube.list("pods", NS, labels="app=web")
            return len(pods) == n and all((p.get("status") or {}).get("podIP") for p in pods)

        return check

    wait(kube, node, "deployments", "web", running(2))
    names = ("all-web", "all-web.default.svc.cluster.local", "ready-web")
    assert resolve_in_a_pod(kube, node, "ask", *names) == [pod_ips(), pod_ips(), "unknown"]
    assert kube.get("services", NS, "all-web")["spec"]["clusterIP"] == "None"
    services = node.explain_services(NS)
    assert "127.2." not in services  # no cluster IP, nothing for the proxy
    assert f"service {NS}/ready-web headless: http:80 -> no endpoints" in services
    assert f"service {NS}/all-web headless: http:80 -> {sorted(pod_ips().split(','))}" in services

    kube.kubectl("scale", "deployment/web", "--replicas=3")  # running pods' hosts follow
    wait(kube, node, "deployments", "web", running(3))
    (answer,) = resolve_in_a_pod(kube, node, "ask-again", "all-web")
    assert answer == pod_ips() and answer.count(",") == 2


def test_a_pre_stop_sleep_runs_before_sigterm(kube: KubeEmulator, node: ProcessKubelet) -> None:
    """A deleted pod leaves its Services' endpoints at once; its container gets SIGTERM
    only after the preStop `sleep`, within the grace period."""
    script = SERVER.replace(
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))",
        "import time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('SIGTERM', time.monotonic(),"
        " flush=True), sys.exit(0)))",
    )
    pause = {"lifecycle": {"preStop": {"sleep": {"seconds": 3}}}}
    deployment = server("web", command=["python", "-c", script], **pause)
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 10
    kube.create(deployment)
    kube.create(service("web"))
    wait(kube, node, "deployments", "web", ready_replicas(1))
    (pod,) = kube.list("pods", NS, labels="app=web")
    name, endpoint = pod["metadata"]["name"], f"{pod['status']['podIP']}:8080"
    deadline = time.monotonic() + 10
    while endpoint not in node.service_endpoints(NS, "web", "http"):
        assert time.monotonic() < deadline, node.explain_services(NS)
        time.sleep(0.05)
    deleted_at = time.monotonic()
    kube.delete("pods", NS, name)
    while endpoint in node.service_endpoints(NS, "web", "http"):
        assert time.monotonic() < deleted_at + 10, node.explain_services(NS)
        time.sleep(0.05)
    kube.wait_gone("pods", NS, name, timeout_s=20)
    (log,) = node.logs(NS, name)
    (line,) = [line for line in log.read_text().splitlines() if line.startswith("SIGTERM")]
    assert float(line.split()[1]) - deleted_at >= 3.0, line


def test_scaling_changes_processes_and_ready_replicas(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    kube.create(server("web", replicas=1))
    wait(kube, node, "deployments", "web", ready_replicas(1))
    (first,) = kube.list("pods", NS, labels="app=web")
    kube.kubectl("scale", "deployment/web", "--replicas=3")
    wait(kube, node, "deployments", "web", ready_replicas(3))
    assert len(node.pod_processes()) == 3
    ips = {p["status"]["podIP"] for p in kube.list("pods", NS, labels="app=web")}
    assert len(ips) == 3 and all(ip.startswith("127.1.") for ip in ips)

    kube.kubectl("scale", "deployment/web", "--replicas=1")
    wait(kube, node, "deployments", "web", ready_replicas(1))
    deadline = time.monotonic() + 20
    while len(kube.list("pods", NS, labels="app=web")) != 1 or len(node.pod_processes()) != 1:
        assert time.monotonic() < deadline, node.explain()
        time.sleep(0.05)
    (left,) = kube.list("pods", NS, labels="app=web")
    assert left["metadata"]["name"] == first["metadata"]["name"]  # the newest went first


def test_a_crashed_container_restarts_and_keeps_its_pod(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    # The first run crashes; the emptyDir outlives the container, so the second serves.
    crash_once = {
        "command": ["sh", "-c"],
        "args": [
            'if [ -e /scratch/crashed ]; then exec python -c "$0" "$POD_IP"; fi; '
            "touch /scratch/crashed; echo crashing; exit 3",
            SERVER,
        ],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    deployment = server("web", **crash_once)
    deployment["spec"]["template"]["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    kube.create(deployment)
    wait(kube, node, "deployments", "web", ready_replicas(1))
    (pod,) = kube.list("pods", NS, labels="app=web")
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 1 and status["ready"], status
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert "crashing" in node.logs(NS, "web")[0].read_text()


def test_failing_liveness_restarts_the_container(kube: KubeEmulator, node: ProcessKubelet) -> None:
    liveness = {
        "tcpSocket": {"port": 9999},
        "initialDelaySeconds": 1,  # SIGTERM before Python's handler is set would be ignored
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    kube.create(server("web", livenessProbe=liveness))

    def restarted(deployment: dict[str, Any]) -> bool:
        pods = kube.list("pods", NS, labels="app=web")
        statuses = [c for p in pods for c in (p.get("status") or {}).get("containerStatuses") or []]
        return any(c["restartCount"] >= 1 for c in statuses)

    wait(kube, node, "deployments", "web", restarted)
    assert "liveness probe failed" in node.explain()


def test_deleting_a_deployment_kills_every_process_of_its_pods(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    # Each pod leaves a grandchild behind: it dies with the pod's PID namespace.
    marker = f"{os.getpid()}.{time.monotonic_ns() % 1000}"
    leaky = {
        "command": ["sh", "-c"],
        "args": [f'(sleep {marker} &) ; exec python -c "$0" "$POD_IP"', SERVER],
    }
    kube.create(server("web", replicas=2, **leaky))
    wait(kube, node, "deployments", "web", ready_replicas(2))
    assert len(marked_processes(f"sleep\0{marker}")) == 2
    kube.kubectl("delete", "deployment", "web")  # waits for the garbage collector
    pods_gone(kube, "app=web")
    assert node.pod_processes() == []
    assert marked_processes(f"sleep\0{marker}") == []


def test_a_template_change_rolls_the_pods(kube: KubeEmulator, node: ProcessKubelet) -> None:
    kube.create(server("web", replicas=2))
    kube.create(service("web"))
    wait(kube, node, "deployments", "web", ready_replicas(2))
    old = {p["metadata"]["name"] for p in kube.list("pods", NS, labels="app=web")}
    env = [*POD_ENV, {"name": "GREETING", "value": "v2"}]
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "web", "env": env}]}}}}
    kube.patch("deployments", NS, "web", patch, patch_type="strategic")

    def rolled(deployment: dict[str, Any]) -> bool:
        pods = kube.list("pods", NS, labels="app=web")
        return ready_replicas(2)(deployment) and not old & {p["metadata"]["name"] for p in pods}

    done = wait(kube, node, "deployments", "web", rolled)
    assert done["status"]["updatedReplicas"] == 2
    assert condition(done, "Progressing")["reason"] == "NewReplicaSetAvailable"
    address = node.service_address(NS, "web", "http")
    deadline = time.monotonic() + 10
    while "(v2)" not in get(f"http://{address}/"):  # the proxy follows the endpoints
        assert time.monotonic() < deadline, node.explain()
        time.sleep(0.05)


def test_a_failing_job_retries_then_fails_with_its_termination_message(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    script = "open('/dev/termination-log', 'w').write('boom ' * 2000); raise SystemExit(4)"
    kube.create(job("fail", script, backoffLimit=1))
    done = wait(kube, node, "jobs", "fail", finished)
    assert condition(done, "Failed")["reason"] == "BackoffLimitExceeded"
    results = terminated(kube, "fail")
    assert len(results) == 2 and done["status"]["failed"] == 2
    for result in results:
        assert result["exitCode"] == 4 and result["reason"] == "Error"
        assert len(result["message"]) == 4096 and result["message"].startswith("boom boom")


def test_a_job_past_its_deadline_is_stopped_and_fails(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, lambda *_: exit(143)); time.sleep(60)"
    )
    slow = job("slow", script, activeDeadlineSeconds=1)
    # The script is its container's PID 1, which ignores a SIGTERM that comes before its
    # handler is installed (a slow interpreter start on a busy machine): the grace period
    # bounds the stop then, as it does in a cluster.
    slow["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 2
    kube.create(slow)
    done = wait(kube, node, "jobs", "slow", finished)
    assert condition(done, "Failed")["reason"] == "DeadlineExceeded"
    # The script sleeps 60 s, longer than both waits together: a pod that was not
    # stopped is still there when pods_gone gives up.
    pods_gone(kube, "job-name=slow")
    assert node.pod_processes() == []


def test_init_containers_run_in_order_and_a_failed_one_restarts_with_backoff(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    """Two init containers share an emptyDir with the container: `first` writes, `second`
    fails twice (a reason in its termination message) before it appends; only then does
    the container start, and it sees both."""
    second = (
        "n=$(cat /shared/tries 2>/dev/null || echo 0); echo $((n+1)) > /shared/tries; "
        'if [ "$n" -lt 2 ]; then echo "not yet: try $n" > /dev/termination-log; exit 3; fi; '
        "echo second >> /shared/order"
    )
    mount = [{"name": "shared", "mountPath": "/shared"}]
    init = [
        {"name": "first", "image": "busybox", "command": ["sh", "-c", "echo first > /shared/order"],
         "volumeMounts": mount},
        {"name": "second", "image": "busybox", "command": ["sh", "-c", second],
         "volumeMounts": mount},
    ]  # fmt: skip
    deployment = server("web", volumeMounts=mount, command=["sh", "-c"], args=[
        'cat /shared/order; exec python -c "$0" "$POD_IP"', SERVER,
    ])  # fmt: skip
    spec = deployment["spec"]["template"]["spec"]
    spec["initContainers"], spec["volumes"] = init, [{"name": "shared", "emptyDir": {}}]
    kube.create(deployment)

    def second_failed(pod: dict[str, Any]) -> bool:
        statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
        return len(statuses) == 2 and statuses[1]["restartCount"] >= 1

    deadline = time.monotonic() + 20
    while not [p for p in kube.list("pods", NS, labels="app=web") if second_failed(p)]:
        assert time.monotonic() < deadline, node.explain()
        time.sleep(0.05)
    (pod,) = kube.list("pods", NS, labels="app=web")
    assert pod["status"]["phase"] == "Pending"
    initialized = condition(pod, "Initialized")
    assert initialized["status"] == "False", initialized
    assert initialized["reason"] == "ContainersNotInitialized"
    assert "second" in initialized["message"] and "first" not in initialized["message"]
    (main,) = pod["status"]["containerStatuses"]
    assert main["state"] == {"waiting": {"reason": "PodInitializing"}}, main
    first, failing = pod["status"]["initContainerStatuses"]
    assert first["state"]["terminated"]["exitCode"] == 0
    assert failing["lastState"]["terminated"]["exitCode"] == 3
    assert failing["lastState"]["terminated"]["message"].startswith("not yet: try")

    wait(kube, node, "deployments", "web", ready_replicas(1))
    (pod,) = kube.list("pods", NS, labels="app=web")
    assert condition(pod, "Initialized")["status"] == "True"
    first, second_status = pod["status"]["initContainerStatuses"]
    assert first["restartCount"] == 0 and second_status["restartCount"] == 2
    assert second_status["state"]["terminated"]["reason"] == "Completed"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    (log,) = node.logs(NS, f"{pod['metadata']['name']}_web")
    assert "first\nsecond\n" in log.read_text()


def test_a_failed_init_container_fails_a_pod_that_never_restarts(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    """restartPolicy Never: the pod fails and its container never starts; the message is
    the log's tail (FallbackToLogsOnError, nothing in the file)."""
    spec = job("init-fails", "open('/tmp/ran', 'w')")
    fetch = {
        "name": "fetch",
        "image": "python:3.11",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "command": ["python", "-c", "import sys; sys.exit('no such model: s3://m/x.onnx')"],
    }
    spec["spec"]["template"]["spec"]["initContainers"] = [fetch]
    kube.create(spec)
    done = wait(kube, node, "jobs", "init-fails", finished)
    assert condition(done, "Failed")["reason"] == "BackoffLimitExceeded"
    (pod,) = kube.list("pods", NS, labels="job-name=init-fails")
    assert pod["status"]["phase"] == "Failed"
    (init,) = pod["status"]["initContainerStatuses"]
    ended = init["state"]["terminated"]
    assert ended["exitCode"] == 1 and ended["reason"] == "Error"
    assert "no such model: s3://m/x.onnx" in ended["message"]
    (main,) = pod["status"]["containerStatuses"]
    assert main["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert main["restartCount"] == 0


def test_volumes_env_and_mounts_are_the_pods_own(kube: KubeEmulator, tmp_path: Path) -> None:
    if (reason := unsupported_reason()) is not None:
        pytest.skip(reason)
    config_dir = f"/etc/kubelet-test-{os.getpid()}-{time.monotonic_ns()}"  # new on the host
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings"},
            "data": {"app.yaml": "level: 3\n", "other": "x", "greeting": "hi"},
        }
    )
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "token"},
            "data": {"value": "czNjcjN0"},  # s3cr3t
        }
    )
    host_dir = tmp_path / "shared"
    host_dir.mkdir()
    (host_dir / "model.txt").write_text("weights")
    script = (
        "import json, os, socket\n"
        "files = sorted(os.listdir(os.environ['CONFIG_DIR']))\n"
        "try:\n"
        "    open(os.environ['CONFIG_DIR'] + '/new', 'w')\n"
        "    writable = True\n"
        "except OSError:\n"
        "    writable = False\n"
        "open('/tmp/kubelet-test-private-tmp', 'w').write('mine')\n"
        "out = {'files': files, 'config': open(os.environ['CONFIG_DIR'] + '/config.yaml').read(),\n"
        "       'writable': writable, 'model': open('/models/model.txt').read(),\n"
        "       'hostname': socket.gethostname(), 'pid': os.getpid(),\n"
        "       'env': {k: os.environ.get(k) for k in ('GREETING', 'TOKEN', 'MESSAGE',\n"
        "               'KUBECONFIG', 'KUBERNETES_SERVICE_HOST', 'POD_NAMESPACE')},\n"
        "       'kubeconfig': os.path.exists(os.environ['KUBECONFIG'])}\n"
        "open('/var/log/result', 'w').write(json.dumps(out))\n"
    )
    spec = job("probe", script)
    pod_spec = spec["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    container["env"] = [
        {
            "name": "GREETING",
            "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}},
        },
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "value"}}},
        {"name": "MESSAGE", "value": "$(GREETING) $(TOKEN) $$(GREETING) $(UNSET)"},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "CONFIG_DIR", "value": config_dir},
    ]
    container["terminationMessagePath"] = "/var/log/result"
    container["volumeMounts"] = [
        {"name": "config", "mountPath": config_dir},
        {"name": "models", "mountPath": "/models", "readOnly": True},
    ]
    pod_spec["volumes"] = [
        {
            "name": "config",
            "configMap": {
                "name": "settings",
                "items": [{"key": "app.yaml", "path": "config.yaml"}],
            },
        },
        {"name": "models", "hostPath": {"path": str(host_dir)}},
    ]
    with ProcessKubelet(kube, tmp_path / "node") as node:
        kube.create(spec)
        wait(kube, node, "jobs", "probe", finished)
        assert list(Path(config_dir).iterdir()) == []  # the mount is the container's alone
    assert not Path(config_dir).exists()  # the mount point it made is gone with the node
    (result,) = terminated(kube, "probe")
    assert result["exitCode"] == 0, result
    out = json.loads(result["message"])
    assert out["files"] == ["config.yaml"] and out["config"] == "level: 3\n"
    assert out["writable"] is False and out["model"] == "weights"
    (pod,) = kube.list("pods", NS, labels="job-name=probe")
    assert out["hostname"] == pod["metadata"]["name"] and out["pid"] == 1
    assert out["env"] == {
        "GREETING": "hi",
        "TOKEN": "s3cr3t",
        "MESSAGE": "hi s3cr3t $(GREETING) $(UNSET)",
        "KUBECONFIG": "/var/run/secrets/kubernetes.io/serviceaccount/kubeconfig",
        "KUBERNETES_SERVICE_HOST": None,
        "POD_NAMESPACE": NS,
    }
    assert out["kubeconfig"] is True
    assert not Path("/tmp/kubelet-test-private-tmp").exists()  # /tmp is the container's own


def test_a_projected_volume_merges_its_sources(kube: KubeEmulator, node: ProcessKubelet) -> None:
    """configMap, secret and downwardAPI sources in one read-only folder, as the API
    server's service-account volume (`kube-api-access-*`) has them; a serviceAccountToken source
    needs the node agent's tokens, so on the emulator such a pod waits, saying why."""
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ca"},
                 "data": {"ca.crt": "CERT"}})  # fmt: skip
    kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "key"},
                 "data": {"k": "czNjcjN0"}})  # fmt: skip
    script = (
        "import os\n"
        "d = '/var/run/projected'\n"
        "out = ','.join(f'{n}={open(os.path.join(d, n)).read()}' for n in sorted(os.listdir(d)))\n"
        "try:\n"
        "    open(os.path.join(d, 'new'), 'w')\n"
        "except OSError:\n"
        "    out += ' read-only'\n"
        "open('/dev/termination-log', 'w').write(out)\n"
    )
    sources = [
        {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"secret": {"name": "key"}},
        {"downwardAPI": {"items": [
            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]  # fmt: skip
    for name, extra in (("projected", []), ("token", [{"serviceAccountToken": {"path": "t"}}])):
        spec = job(name, script)
        pod_spec = spec["spec"]["template"]["spec"]
        pod_spec["volumes"] = [{"name": "all", "projected": {"sources": sources + extra}}]
        pod_spec["containers"][0]["volumeMounts"] = [
            {"name": "all", "mountPath": "/var/run/projected"}
        ]
        kube.create(spec)
    wait(kube, node, "jobs", "projected", finished)
    (result,) = terminated(kube, "projected")
    assert result["message"] == f"ca.crt=CERT,k=s3cr3t,namespace={NS} read-only", result

    def waiting(pod: dict[str, Any]) -> bool:
        return "serviceAccountToken" in (pod.get("status") or {}).get("message", "")

    (pod,) = kube.list("pods", NS, labels="job-name=token")
    wait(kube, node, "pods", pod["metadata"]["name"], waiting)


def test_service_monitors_are_scraped_by_prometheus(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    kube.register_crd(copy.deepcopy(SERVICE_MONITOR_CRD))
    kube.create(server("web"))
    kube.create(service("web"))
    kube.create(
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "web"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "endpoints": [{"port": "http", "interval": "1s"}],
            },
        }
    )
    prometheus = node.start_prometheus(port=free_port())
    wait(kube, node, "deployments", "web", ready_replicas(1))
    (pod,) = kube.list("pods", NS, labels="app=web")
    deadline = time.monotonic() + 20
    while not (series := prometheus.query("tiny_requests")):
        assert time.monotonic() < deadline, json.dumps(prometheus.targets(), indent=1)
        time.sleep(0.2)
    (labels,) = [s["metric"] for s in series]
    assert labels["pod"] == labels["from_pod"] == pod["metadata"]["name"]
    assert (labels["namespace"], labels["service"], labels["job"]) == (NS, "web", "web")
    assert labels["endpoint"] == "http" and labels["container"] == "web"


def test_a_stopping_kubelet_leaves_the_mount_points_another_ones_containers_use(
    kube: KubeEmulator, node: ProcessKubelet, tmp_path: Path
) -> None:
    """Kubelets side by side (two tests' clusters): one that stops removes the mount
    points it created on the host only where no container mounts anything any more;
    removing one would detach the volume from the other kubelet's running container."""
    mount = Path(f"/run/sloline-kubelet-test-{uuid.uuid4().hex[:8]}/data")
    sleeper = {
        "name": "main",
        "image": "python:3.11",
        "command": [
            "python",
            "-c",
            "import signal, time; signal.signal(15, exit); time.sleep(600)",
        ],
        "volumeMounts": [{"name": "scratch", "mountPath": str(mount)}],
    }
    deployment = server("sleeper")
    template = deployment["spec"]["template"]["spec"]
    template["containers"], template["volumes"] = [sleeper], [{"name": "scratch", "emptyDir": {}}]
    try:
        with (
            KubeEmulator(tmp_path / "kube2") as first_kube,
            ProcessKubelet(first_kube, tmp_path / "first") as first,
        ):
            first_kube.create(copy.deepcopy(deployment))
            wait(first_kube, first, "deployments", "sleeper", ready_replicas(1))
            kube.create(copy.deepcopy(deployment))
            wait(kube, node, "deployments", "sleeper", ready_replicas(1))
            (launcher,) = node.pod_processes(NS)
            inside = Path(f"/proc/{launcher}/root{mount}")  # the container's view

            def mounted() -> bool:  # the emptyDir over the host's folder
                with contextlib.suppress(OSError):
                    return inside.stat().st_ino != mount.stat().st_ino
                return False

            deadline = time.monotonic() + 10
            while not mounted():
                assert time.monotonic() < deadline, node.explain()
                time.sleep(0.05)
        assert mount.is_dir()  # the first kubelet created it, and left it
        assert mounted()
    finally:
        for path in (mount, mount.parent):
            with contextlib.suppress(OSError):
                path.rmdir()


def test_pods_of_a_deployment_that_is_gone_are_collected(
    kube: KubeEmulator, node: ProcessKubelet
) -> None:
    # A pod made from a moment-old list, for a Deployment deleted meanwhile: the emulator's
    # garbage collector only acts on deletions, so the kubelet's controllers collect it.
    orphan = server("gone")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gone-1",
            "labels": {"app": "gone"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gone",
                 "uid": "00000000-dead", "controller": True}
            ],
        },
        "spec": orphan["spec"]["template"]["spec"],
    }  # fmt: skip
    kube.create(pod)
    kube.wait_gone("pods", NS, "gone-1")
    deadline = time.monotonic() + 10
    while node.pod_processes():
        assert time.monotonic() < deadline, node.explain()
        time.sleep(0.05)


def test_the_node_agents_proxy_table_comes_from_endpoint_slices() -> None:
    """kube-proxy on a real control plane: per Service port, the ready endpoints of its
    EndpointSlices' port of the same name (ready unset counts as ready)."""
    service = {
        "metadata": {"namespace": NS, "name": "web"},
        "spec": {
            "clusterIP": "127.3.0.9",
            "ports": [{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}],
        },
    }
    headless = {"metadata": {"namespace": NS, "name": "peers"}, "spec": {"clusterIP": "None"}}
    endpoints = [
        {"addresses": ["198.18.0.1"], "conditions": {"ready": True}},
        {"addresses": ["198.18.0.2"], "conditions": {"ready": False}},
        {"addresses": ["198.18.0.3"]},
    ]
    slices = [
        {
            "metadata": {"namespace": NS, "labels": {"kubernetes.io/service-name": "web"}},
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": endpoints,
        },
        {  # another namespace's Service of the same name
            "metadata": {"namespace": "other", "labels": {"kubernetes.io/service-name": "web"}},
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["198.18.0.4"]}],
        },
    ]
    assert slice_table([service, headless], slices) == {
        "127.3.0.9:80": ["198.18.0.1:8080", "198.18.0.3:8080"],
        "127.3.0.9:9090": [],
    }
