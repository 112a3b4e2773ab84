"""The real kube-apiserver's PodSecurity admission admits every pod the operator renders
into a namespace that enforces `restricted`: defaults, a GPU class, and a pipeline with
every pod-template field set (docs/kubernetes.md, "Shaping pods"); a pod the pipeline
opted out of the check for is refused, so the check is not vacuous.

Runs on the real control plane of docs/e2e.md ("Real control plane"; scripts/cluster.py
with its own record in a temp dir), skipped where its binaries are not built. Pods are
created with a server-side dry run (there is no node to run them); Deployments and Jobs
too, where PodSecurity only warns, so the test checks that no warning comes back.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sloline.operator.naming import Target
from sloline.operator.planning import profile_tasks
from sloline.operator.pods import render_profiling_job
from sloline.operator.render import render
from sloline.operator.settings import OperatorSettings, parse_settings
from tests.unit.operator.helpers import DIGITS, NOOP, gpu_settings, make_plan, pipeline_object
from tests.unit.operator.test_pod_shaping import SETTINGS, shaped

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = ROOT / ".tools" / "kube" / "v1.37.2" / "bin"
NAMESPACE = "team-a"  # the helpers' pipelines live here
KUBECTL = "kubectl"


def _kubectl_missing() -> str | None:
    binaries = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    absent = [n for n in binaries if not (BIN_DIR / n).is_file()]
    if absent:
        return f"no {', '.join(absent)} in {BIN_DIR.relative_to(ROOT)} (scripts/kube/build.sh)"
    if shutil.which(KUBECTL) is None:
        return "kubectl is not on PATH"
    return None


pytestmark = pytest.mark.skipif(_kubectl_missing() is not None, reason=str(_kubectl_missing()))


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {**os.environ, "SLOLINE_CLUSTER_STATE": str(tmp_path_factory.mktemp("cp") / "cp.json")}
    script = str(ROOT / "scripts" / "cluster.py")
    up = subprocess.run(
        [sys.executable, script, "up", "--no-node", "--timeout", "240"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        found = re.search(r"^KUBECONFIG=(.+)$", up.stdout, re.MULTILINE)
        assert found, up.stdout
        yield found.group(1)
    finally:
        subprocess.run([sys.executable, script, "down"], env=env, timeout=60, check=False)


def kubectl(
    config: str, *args: str, stdin: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", config, *args],
        input=json.dumps(stdin) if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def restricted(kubeconfig: str) -> str:
    """Namespace `team-a` enforcing (and warning about) Pod Security `restricted`, with
    the ServiceAccounts and PriorityClasses the shaped pipeline names."""
    labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")}
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}
    ]
    objects += [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": n, "namespace": NAMESPACE},
        }
        for n in ("ml-pods", "router")
    ]
    objects += [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": n},
            "value": 1000,
        }
        for n in ("ml-serving", "batch-low")
    ]
    for obj in objects:
        result = kubectl(kubeconfig, "create", "-f", "-", stdin=obj)
        assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 60
    while kubectl(kubeconfig, "-n", NAMESPACE, "get", "serviceaccount", "default").returncode:
        assert time.monotonic() < deadline, "the default ServiceAccount never appeared"
        time.sleep(0.5)
    return NAMESPACE


def workloads(doc: dict[str, Any], settings: OperatorSettings, hardware: str) -> list[Any]:
    t = Target.of(doc)
    objects = render(t, make_plan(t, hardware), settings, worker_token="t")  # noqa: S106
    objects += [
        render_profiling_job(t, settings, task.stage, task.hardware, task.key)
        for task in profile_tasks(t, settings)
    ]
    return [o for o in objects if o["kind"] in ("Deployment", "Job")]


CASES = {
    "defaults": lambda: workloads(pipeline_object(NOOP), OperatorSettings(), "cpu-1"),
    "gpu": lambda: workloads(pipeline_object(DIGITS), gpu_settings(), "gpu-l4"),
    "every-field": lambda: workloads(shaped(), parse_settings(copy.deepcopy(SETTINGS)), "cpu-1"),
    "openshift-uid": lambda: workloads(
        pipeline_object(NOOP), parse_settings({"pods": {}}), "cpu-1"
    ),
}


def as_pod(workload: dict[str, Any]) -> dict[str, Any]:
    template = workload["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": workload["metadata"]["name"],
            "namespace": workload["metadata"]["namespace"],
        },
        "spec": template["spec"],
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_apiserver_admits_every_rendered_pod(
    restricted: str, kubeconfig: str, case: str
) -> None:
    rendered = CASES[case]()
    assert {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in rendered} == {
        "router",
        "worker",
        "profiler",
    }
    for workload in rendered:
        for obj in (as_pod(workload), workload):
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            result = kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=obj)
            assert result.returncode == 0, (name, result.stderr)
            assert "PodSecurity" not in result.stderr, (name, result.stderr)


def test_the_apiserver_refuses_a_pod_opted_out_of_restricted(
    restricted: str, kubeconfig: str
) -> None:
    doc = pipeline_object(NOOP, annotations={"sloline.dev/allow-unrestricted-pods": "true"})
    doc["spec"]["routerPodTemplate"] = {
        "container": {"securityContext": {"allowPrivilegeEscalation": True}}
    }
    router = next(
        w for w in workloads(doc, OperatorSettings(), "cpu-1") if "router" in w["metadata"]["name"]
    )
    result = kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=as_pod(router))
    assert result.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in result.stderr, result.stderr
    assert "allowPrivilegeEscalation != false" in result.stderr, result.stderr


def test_the_apiserver_accepts_the_crd_and_a_pipeline_with_every_field(
    restricted: str, kubeconfig: str
) -> None:
    """The generated CRD (pod templates and exposure included) is structural for the real
    apiserver, within its CEL cost budget, and keeps every field of a shaped pipeline."""
    crd = ROOT / "helm" / "sloline" / "crds" / "predictionpipelines.sloline.dev.yaml"
    result = kubectl(kubeconfig, "apply", "--server-side", "-f", str(crd))
    assert result.returncode == 0, result.stderr
    result = kubectl(
        kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(crd)
    )
    assert result.returncode == 0, result.stderr
    doc = shaped()
    doc["spec"]["exposure"] = {
        "ingress": {"host": "noop.example.com", "tlsSecretName": "noop-tls"},
        "httpRoute": {"parentRefs": [{"name": "public"}]},
        "grpcRoute": {"parentRefs": [{"name": "public"}], "hostnames": ["noop.example.com"]},
    }
    doc["spec"]["podTemplate"]["container"]["resources"] = {"limits": {"cpu": 2, "memory": "3Gi"}}
    obj = {k: doc[k] for k in ("apiVersion", "kind", "spec")}
    obj["metadata"] = {"name": "noop", "namespace": NAMESPACE}
    result = kubectl(kubeconfig, "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=obj)
    assert result.returncode == 0, result.stderr
    stored = json.loads(result.stdout)["spec"]
    given = obj["spec"]
    for key in ("podTemplate", "routerPodTemplate", "profilingPodTemplate"):
        assert stored[key] == given[key], key
    assert stored["stages"][0]["podTemplate"] == given["stages"][0]["podTemplate"]
    assert stored["exposure"] == {  # the schema's default path filled in
        **given["exposure"],
        "ingress": {**given["exposure"]["ingress"], "path": "/"},
    }
