"""Every pod the operator renders passes the Pod Security Standard `restricted` profile
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), checked by
`restricted_violations`, written from the profile's rules (baseline's controls plus
restricted's; the operator refuses pod templates it flags), and the hardening beyond it:
a read-only root filesystem and no service-account token."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from sloline.operator.naming import Target
from sloline.operator.planning import profile_tasks
from sloline.operator.pods import render_profiling_job
from sloline.operator.render import render
from sloline.operator.settings import OperatorSettings
from sloline.spec.shaping import restricted_violations
from tests.unit.operator.helpers import DIGITS, NOOP, gpu_settings, make_plan, pipeline_object


def hardening_violations(pod: dict[str, Any]) -> list[str]:
    """Beyond PSA: read-only root filesystems, a writable /tmp, no API token."""
    out = []
    if pod.get("automountServiceAccountToken") is not False:
        out.append("automountServiceAccountToken must be false")
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for c in pod["containers"]:
        if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
            out.append(f"{c['name']}: readOnlyRootFilesystem must be true")
        tmp = [m for m in c.get("volumeMounts") or [] if m["mountPath"] == "/tmp"]
        if not tmp or "emptyDir" not in volumes[tmp[0]["name"]] or tmp[0].get("readOnly"):
            out.append(f"{c['name']}: needs a writable emptyDir at /tmp")
    return out


FRONT_DOOR = {
    "sloline.dev/tls-secret": "tls",
    "sloline.dev/client-ca-secret": "ca",
    "sloline.dev/auth-secret": "tokens",
}


def rendered_pods(
    settings: OperatorSettings, path: Any, hardware: str, annotations: dict[str, str] | None = None
) -> list[Any]:
    t = Target.of(pipeline_object(path, annotations=annotations or {}))
    objects = render(t, make_plan(t, hardware), settings, worker_token="t", service_monitor=True)  # noqa: S106
    objects += [
        render_profiling_job(t, settings, task.stage, task.hardware, task.key)
        for task in profile_tasks(t, settings)
    ]
    return [o for o in objects if o["kind"] in ("Deployment", "Job")]


CASES = {
    "noop-defaults": (OperatorSettings, NOOP, "cpu-1", None),
    "digits-gpu": (gpu_settings, DIGITS, "gpu-l4", None),
    "noop-front-door-secrets": (OperatorSettings, NOOP, "cpu-1", FRONT_DOOR),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_pod_passes_psa_restricted(case: str) -> None:
    make_settings, path, hardware, annotations = CASES[case]
    workloads = rendered_pods(make_settings(), path, hardware, annotations)
    components = {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in workloads}
    assert components == {"router", "worker", "profiler"}
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        name = f"{workload['kind']}/{workload['metadata']['name']}"
        assert restricted_violations(pod) == [], name
        assert hardening_violations(pod) == [], name
        assert pod["securityContext"]["runAsUser"] == 10001  # docker/Dockerfile.runtime's USER


def test_the_checker_catches_each_kind_of_violation() -> None:
    """The checker is not vacuous: each broken rule of a passing pod is reported."""
    (router, *_) = rendered_pods(OperatorSettings(), NOOP, "cpu-1")
    good = router["spec"]["template"]["spec"]
    breakages: dict[str, Callable[[dict[str, Any]], object]] = {
        "runAsNonRoot": lambda p: p["securityContext"].pop("runAsNonRoot"),
        "allowPrivilegeEscalation": lambda p: p["containers"][0]["securityContext"].pop(
            "allowPrivilegeEscalation"
        ),
        "drop ALL": lambda p: p["containers"][0]["securityContext"].pop("capabilities"),
        "seccompProfile": lambda p: p["securityContext"].pop("seccompProfile"),
        "hostPath": lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "privileged": lambda p: p["containers"][0]["securityContext"].update(privileged=True),
        "hostNetwork": lambda p: p.update(hostNetwork=True),
        "NET_BIND_SERVICE": lambda p: p["containers"][0]["securityContext"]["capabilities"].update(
            add=["SYS_ADMIN"]
        ),
        "hostPort": lambda p: p["containers"][0]["ports"][0].update(hostPort=80),
        "runAsUser must not be 0": lambda p: p["securityContext"].update(runAsUser=0),
    }
    for expected, breakage in breakages.items():
        pod = copy.deepcopy(good)
        breakage(pod)
        found = restricted_violations(pod)
        assert any(expected in v for v in found), (expected, found)
    pod = copy.deepcopy(good)
    pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    pod.pop("automountServiceAccountToken")
    assert len(hardening_violations(pod)) == 2
