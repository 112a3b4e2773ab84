"""What the emulated API server serves: the registry of resources (the built-ins, and those
of the CRDs created through the API) and the API errors.

The registry is kmock's `ResourcesArray`, which kmock's discovery endpoints read, so a
resource registered here is at once discoverable by kubectl and kopf.
"""

from __future__ import annotations

import copy
import datetime
import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kmock

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
# Built-in resources served (their discovery data comes from kmock's bundled K3s snapshot).
BUILTINS = {
    "": {"namespaces", "nodes", "pods", "services", "configmaps", "secrets", "events",
         "serviceaccounts", "endpoints"},
    "apps": {"deployments", "replicasets", "statefulsets"},
    "networking.k8s.io": {"networkpolicies"},
    "policy": {"poddisruptionbudgets"},
    "batch": {"jobs"},
    "coordination.k8s.io": {"leases"},
    "events.k8s.io": {"events"},
    "apiextensions.k8s.io": {"customresourcedefinitions"},
    "rbac.authorization.k8s.io": {"roles", "rolebindings", "clusterroles", "clusterrolebindings"},
}  # fmt: skip
EMULATED_SUBRESOURCES = {"status", "scale"}
# Where the Scale of a built-in workload reads spec replicas, status replicas and the selector.
REPLICAS_SCALE = (("spec", "replicas"), ("status", "replicas"), ("spec", "selector"))
NAMESPACES = kmock.resource("", "v1", "namespaces")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


class ApiError(kmock.KubernetesError):
    """An API call failed as a Kubernetes API server fails it: `status` is the HTTP code,
    `reason` the Status reason (NotFound, AlreadyExists, Conflict, Invalid, ...)."""

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"


def bad_request(message: str, status: int = 400, reason: str = "BadRequest") -> ApiError:
    return ApiError(status=status, reason=reason, message=message, details={})


def no_such_resource() -> ApiError:
    return bad_request("the server could not find the requested resource", 404, "NotFound")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Kind:
    """What the store needs to know about one served resource."""

    resource: kmock.resource
    kind: str
    namespaced: bool
    subresources: frozenset[str]
    scale: tuple[tuple[str, ...], ...] | None  # see REPLICAS_SCALE
    custom: bool

    @property
    def api_version(self) -> str:
        group, version = self.resource.group, self.resource.version
        return f"{group}/{version}" if group else str(version)

    @property
    def title(self) -> str:
        """`deployments.apps`, `pods`: how the API server names a resource in messages."""
        group, plural = self.resource.group, self.resource.plural
        return f"{plural}.{group}" if group else str(plural)

    def error(self, status: int, reason: str, name: str, message: str) -> ApiError:
        details = {"name": name, "group": self.resource.group, "kind": self.resource.plural}
        return ApiError(status=status, reason=reason, message=message, details=details)

    def not_found(self, name: str) -> ApiError:
        return self.error(404, "NotFound", name, f'{self.title} "{name}" not found')


@functools.cache
def _bundled_builtins() -> dict[kmock.resource, kmock.ResourceInfo]:
    bundled = kmock.ResourcesArray()
    with warnings.catch_warnings():  # kmock 0.8 reads its bundle with a deprecated call
        warnings.simplefilter("ignore", DeprecationWarning)
        bundled.load_bundled()
    served = {}
    for resource in bundled:
        if resource.version == "v1" and resource.plural in BUILTINS.get(resource.group or "", ()):
            served[resource] = bundled[resource]
            served[resource].subresources &= EMULATED_SUBRESOURCES
    return served


class Registry:
    """The served resources: kmock's discovery data, Scale paths and the CRDs' resources."""

    def __init__(self, resources: kmock.ResourcesArray) -> None:
        self.resources = resources
        resources.update(copy.deepcopy(_bundled_builtins()))
        self.scale_paths = {
            r: REPLICAS_SCALE for r in resources if "scale" in resources[r].subresources
        }
        self.crds: dict[str, list[kmock.resource]] = {}  # CRD name -> the resources it serves

    def kind(self, resource: kmock.resource) -> Kind:
        if resource not in self.resources:
            raise no_such_resource()
        info = self.resources[resource]
        custom = any(resource in served for served in self.crds.values())
        namespaced, subresources = bool(info.namespaced), frozenset(info.subresources)
        scale = self.scale_paths.get(resource)
        return Kind(resource, info.kind or "", namespaced, subresources, scale, custom)

    def find(self, name: str) -> Kind:
        """Resolve what a test or kubectl would type: `deploy`, `Deployment`, `deployments`,
        `deployments.apps`, `apps/v1/deployments`; the core group wins ties, as in kubectl."""
        wanted = name.lower()
        for resource in sorted(self.resources, key=lambda r: (r.group != "", r.group or "")):
            info = self.resources[resource]
            names = {resource.plural, info.singular, (info.kind or "").lower(), *info.shortnames}
            qualified = {f"{n}.{resource.group}" for n in names}
            if wanted in names | qualified or kmock.resource(name) == resource:
                return self.kind(resource)
        raise LookupError(
            f'the emulator does not serve a resource type "{name}"; register its CRD first, '
            "or add it to BUILTINS in tests/support/kube/kinds.py"
        )

    def kind_of(self, body: Mapping[str, Any]) -> Kind:
        """The kind of an object, from its apiVersion and kind."""
        for resource in self.resources:
            kind = self.kind(resource)
            if (kind.api_version, kind.kind) == (body.get("apiVersion"), body.get("kind")):
                return kind
        raise bad_request(f"no kind {body.get('kind')!r} in {body.get('apiVersion')!r} is served")

    def register_crd(self, crd: Mapping[str, Any]) -> dict[str, Any]:
        """Serve the CRD's versions (replacing what it served before); return its status,
        established at once."""
        spec, name = crd.get("spec") or {}, crd["metadata"]["name"]
        names = spec.get("names") or {}
        if not {"group", "versions"} <= spec.keys() or not {"plural", "kind"} <= names.keys():
            raise bad_request(
                f"CRD {name} needs spec.group, spec.versions, spec.names.plural and "
                "spec.names.kind", 422, "Invalid")  # fmt: skip
        self.unregister_crd(name)
        served = self.crds[name] = []
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            resource = kmock.resource(spec["group"], version["name"], names["plural"])
            subresources = version.get("subresources") or {}
            self.resources[resource] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=ALL_VERBS,
                shortnames=names.get("shortNames", ()),
                categories=names.get("categories", ()),
                subresources=set(subresources) & EMULATED_SUBRESOURCES,
            )
            if scale := subresources.get("scale"):
                self.scale_paths[resource] = tuple(
                    tuple(scale.get(field, "").lstrip(".").split("."))
                    for field in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath")
                )
            served.append(resource)
        conditions = [
            {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now()}
            for t, r, m in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ]
        stored = [v["name"] for v in spec["versions"] if v.get("storage")]
        return {"acceptedNames": names, "conditions": conditions, "storedVersions": stored}

    def unregister_crd(self, name: str) -> None:
        for resource in self.crds.pop(name, []):
            del self.resources[resource]
            self.scale_paths.pop(resource, None)
