"""Pod shaping: the `podTemplate` overrides of a pipeline's pods, how they merge over the
operator's pods, and the Pod Security Standard `restricted` check the merged pods pass.

A `PodTemplate` names fields of a Kubernetes PodSpec (and of its one container, under
`container`) by their Kubernetes names; Kubernetes objects inside it (tolerations,
affinity, volumes, env entries ...) are kept as given, for the API server to check. The
merge (`apply_templates`) is field by field: maps merge key by key with the override
winning, lists merge by name (env, volumes, imagePullSecrets) or path (volumeMounts) or
append (tolerations), scalars replace. What the operator itself relies on cannot be
overridden: its labels and `sloline.dev/` annotations, its environment variables, volumes
and mount paths. A merged pod must still pass `restricted`
(`restricted_violations`) unless the pipeline opts out with the annotation
`sloline.dev/allow-unrestricted-pods: "true"`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from sloline.spec.models import ContainerTemplate, PipelineSpec, PodTemplate

ANNOTATION_ALLOW_UNRESTRICTED: Final = "sloline.dev/allow-unrestricted-pods"
# Labels every pod of the operator carries and its selectors read.
PROTECTED_LABELS: Final = frozenset(
    {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
        "app.kubernetes.io/managed-by",
    }
)
PROTECTED_PREFIX: Final = "sloline.dev/"

# Pod Security `restricted`, pod and container level; the operator's pods start from these.
RESTRICTED_POD_SECURITY: Final[Mapping[str, Any]] = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER_SECURITY: Final[Mapping[str, Any]] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}

_Objects = list[dict[str, Any]]


Problems = list[tuple[str, str]]


def apply_templates(
    pod: Mapping[str, Any], layers: Sequence[tuple[str, PodTemplate]]
) -> tuple[dict[str, Any], Problems]:
    """`pod` (a PodTemplateSpec: metadata and a spec with one container) with each
    `(path, template)` of `layers` merged over it in turn, and the problems: `pod`'s own
    env, volumes and mount paths are the operator's, like its labels, and a template entry
    that would override one is left out and reported with its path."""
    out = copy.deepcopy(dict(pod))
    problems: Problems = []
    meta, spec = out.setdefault("metadata", {}), out["spec"]
    container = spec["containers"][0]
    owned = {
        "volumes": frozenset(v["name"] for v in spec.get("volumes", [])),
        "env": frozenset(e["name"] for e in container.get("env", [])),
        "volumeMounts": frozenset(m["mountPath"] for m in container.get("volumeMounts", [])),
    }
    for where, template in layers:
        problems += _merge_labels(meta, "labels", template.labels, where, PROTECTED_LABELS)
        problems += _merge_labels(meta, "annotations", template.annotations, where, frozenset())
        for key, value in (
            ("serviceAccountName", template.service_account_name),
            ("priorityClassName", template.priority_class_name),
        ):
            if value is not None:
                spec[key] = value
        _merge_map(spec, "nodeSelector", template.node_selector)
        _merge_map(spec, "affinity", template.affinity)
        _merge_map(spec, "securityContext", template.security_context)
        spec["imagePullSecrets"] = _by_key(
            spec.get("imagePullSecrets", []),
            template.image_pull_secrets,
            ("name", frozenset()),
            f"{where}.imagePullSecrets",
            problems,
        )
        if template.tolerations:
            tolerations = [*spec.get("tolerations", []), *copy.deepcopy(template.tolerations)]
            spec["tolerations"] = tolerations
        spec["volumes"] = _by_key(
            spec.get("volumes", []),
            template.volumes,
            ("name", owned["volumes"]),
            f"{where}.volumes",
            problems,
        )
        if template.container is not None:
            problems += _merge_container(container, template.container, owned, where)
    for key in ("imagePullSecrets", "volumes", "nodeSelector", "affinity"):
        if not spec.get(key):
            spec.pop(key, None)
    return out, problems


def _merge_container(
    container: dict[str, Any],
    template: ContainerTemplate,
    owned: Mapping[str, frozenset[str]],
    where: str,
) -> Problems:
    problems: Problems = []
    _merge_map(container, "securityContext", template.security_context)
    resources = container.setdefault("resources", {})
    for kind, values in template.resources.items():
        resources[kind] = {**resources.get(kind, {}), **{k: str(v) for k, v in values.items()}}
    if not resources:
        container.pop("resources")
    container["env"] = _by_key(
        container.get("env", []),
        template.env,
        ("name", owned["env"]),
        f"{where}.container.env",
        problems,
    )
    container["volumeMounts"] = _by_key(
        container.get("volumeMounts", []),
        template.volume_mounts,
        ("mountPath", owned["volumeMounts"]),
        f"{where}.container.volumeMounts",
        problems,
    )
    return problems


def _merge_map(target: dict[str, Any], key: str, values: Mapping[str, Any]) -> None:
    if values:
        target[key] = {**target.get(key, {}), **copy.deepcopy(dict(values))}


def _merge_labels(
    meta: dict[str, Any],
    key: str,
    values: Mapping[str, str],
    where: str,
    protected: frozenset[str],
) -> Problems:
    """Merge `values` into `meta[key]`; the protected names are left out and returned."""
    refused = {n for n in values if n in protected or n.startswith(PROTECTED_PREFIX)}
    allowed = {n: v for n, v in values.items() if n not in refused}
    if allowed:
        meta[key] = {**meta.get(key, {}), **allowed}
    return [(f"{where}.{key}", f"{n!r} is set by the operator") for n in sorted(refused)]


def _by_key(
    base: _Objects,
    extra: _Objects,
    keyed: tuple[str, frozenset[str]],
    where: str,
    problems: Problems,
) -> _Objects:
    """`base` with each entry of `extra` replacing the one with the same `keyed[0]`, or
    appended; an entry without one, or with one of `keyed[1]` (the operator's), is left
    out and added to `problems`."""
    key, owned = keyed
    out = {str(item[key]): item for item in base}
    for i, item in enumerate(extra):
        value = item.get(key)
        if not isinstance(value, str) or not value:
            problems.append((f"{where}[{i}]", f"needs a {key}"))
            continue
        if value in owned:
            problems.append((f"{where}[{i}].{key}", f"{value!r} is the operator's"))
            continue
        out[value] = copy.deepcopy(item)
    return list(out.values())


# --- Pod Security `restricted` ---------------------------------------------------------------

# Baseline lets a container add these capabilities; restricted narrows it to NET_BIND_SERVICE.
RESTRICTED_CAPABILITIES: Final = frozenset({"NET_BIND_SERVICE"})
RESTRICTED_VOLUMES: Final = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS: Final = frozenset(
    {
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
)
SELINUX_TYPES: Final = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
SECCOMP_OK: Final = frozenset({"RuntimeDefault", "Localhost"})


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:  # noqa: C901, PLR0912
    """What keeps a pod spec out of the Pod Security Standard `restricted` profile
    (baseline's controls plus restricted's), empty when it passes."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    # --- baseline
    out += [f"{f} must be false" for f in ("hostNetwork", "hostPID", "hostIPC") if pod.get(f)]
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds:
            out.append(f"volume {volume['name']}: hostPath is forbidden")
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: type {sorted(kinds)} is not allowed")
    out += [
        f"sysctl {s.get('name')} is not safe"
        for s in psc.get("sysctls") or []
        if s.get("name") not in SAFE_SYSCTLS
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
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            out.append(f"{name}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in SECCOMP_OK:
            out.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
    return out


def skeleton_pod() -> dict[str, Any]:
    """A pod with the operator's `restricted` defaults and nothing else: what `sloline
    validate` merges a template over to check it without the operator's settings."""
    return {
        "metadata": {},
        "spec": {
            "securityContext": dict(copy.deepcopy(RESTRICTED_POD_SECURITY)),
            "containers": [
                {
                    "name": "sloline",
                    "securityContext": copy.deepcopy(dict(RESTRICTED_CONTAINER_SECURITY)),
                }
            ],
        },
    }


def template_issues(spec: PipelineSpec, annotations: Mapping[str, str]) -> list[tuple[str, str]]:
    """(path, reason) of every pod template of `spec` that overrides what the operator
    relies on, or that breaks Pod Security `restricted` merged over the operator's
    defaults (unless `annotations` allow it). The operator checks the pods it renders
    again, with its settings' `pods` under the templates."""
    templates = [
        ("spec.podTemplate", spec.pod_template),
        ("spec.routerPodTemplate", spec.router_pod_template),
        ("spec.profilingPodTemplate", spec.profiling_pod_template),
        *((f"spec.stages[{i}].podTemplate", s.pod_template) for i, s in enumerate(spec.stages)),
    ]
    allowed = annotations.get(ANNOTATION_ALLOW_UNRESTRICTED) == "true"
    issues = []
    for path, template in templates:
        if template is None:
            continue
        pod, found = apply_templates(skeleton_pod(), [(path, template)])
        issues += found
        problems = restricted_violations(pod["spec"])
        if problems and not allowed:
            issues.append(
                (
                    path,
                    f"breaks Pod Security restricted: {'; '.join(problems)} (annotation "
                    f'{ANNOTATION_ALLOW_UNRESTRICTED}: "true" allows it)',
                )
            )
    return issues
