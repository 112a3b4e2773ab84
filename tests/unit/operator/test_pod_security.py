"""Every pod the operator renders passes the Pod Security Standard `restricted` profile
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), checked by a
checker written from the profile's rules (baseline's controls plus restricted's), and the
hardening beyond it: a read-only root filesystem and no service-account token."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sloline.operator.naming import Target
from sloline.operator.planning import profile_tasks
from sloline.operator.pods import render_profiling_job
from sloline.operator.render import render
from sloline.operator.settings import OperatorSettings
from tests.unit.operator.helpers import DIGITS, NOOP, gpu_settings, make_plan, pipeline_object

# Baseline: capabilities a container may add; restricted narrows it to NET_BIND_SERVICE.
RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SECCOMP_OK = {"RuntimeDefault", "Localhost"}


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def psa_restricted_violations(pod: dict[str, Any]) -> list[str]:  # noqa: C901, PLR0912
    """What keeps a pod spec out of Pod Security `restricted` (empty: it passes)."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    # --- baseline
    out += [f"{f} must be false" for f in ("hostNetwork", "hostPID", "hostIPC") if pod.get(f)]
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds:
            out.append(f"volume {volume['name']}: hostPath is forbidden")
        if not kinds <= RESTRICTED_VOLUMES:  # restricted: volume types
            out.append(f"volume {volume['name']}: type {sorted(kinds)} is not allowed")
    out += [
        f"sysctl {s['name']} is not safe"
        for s in psc.get("sysctls") or []
        if s["name"] not in SAFE_SYSCTLS
    ]
    if (psc.get("seLinuxOptions") or {}).get("type", "") not in SELINUX_TYPES:
        out.append("pod seLinuxOptions.type is not allowed")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("pod seccompProfile must not be Unconfined")
    if (psc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        out.append("pod appArmorProfile must not be Unconfined")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser must not be 0")
    for c in _containers(pod):
        name, sc = c["name"], c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        out += [
            f"{name}: hostPort {p['hostPort']}" for p in c.get("ports") or [] if p.get("hostPort")
        ]
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount must be Default")
        if (sc.get("seLinuxOptions") or {}).get("type", "") not in SELINUX_TYPES:
            out.append(f"{name}: seLinuxOptions.type is not allowed")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"{name}: appArmorProfile must not be Unconfined")
        # --- restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add") or []) - RESTRICTED_CAPABILITIES:
            out.append(f"{name}: may add only NET_BIND_SERVICE")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{name}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in SECCOMP_OK:
            out.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
    return out


def hardening_violations(pod: dict[str, Any]) -> list[str]:
    """Beyond PSA: read-only root filesystems, a writable /tmp, no API token."""
    out = []
    if pod.get("automountServiceAccountToken") is not False:
        out.append("automountServiceAccountToken must be false")
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for c in _containers(pod):
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
        assert psa_restricted_violations(pod) == [], name
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
        found = psa_restricted_violations(pod)
        assert any(expected in v for v in found), (expected, found)
    pod = copy.deepcopy(good)
    pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    pod.pop("automountServiceAccountToken")
    assert len(hardening_violations(pod)) == 2
