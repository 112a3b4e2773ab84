"""Idempotent apply and prune of rendered objects: the only writer of owned objects.

Create what is missing. For what exists, compare only the fields the operator renders
(`OWNED`): the live object may carry server defaults, controller annotations and
`spec.replicas` set by the tuner, none of which are drift. An object is patched when a
rendered field differs from the live one (quantities compare by value: the API server
stores `1000m` as `1`) or when the rendering itself changed since the last apply (the
`sloline.dev/applied` digest annotation, which catches a removed key such as a GPU
limit). The patch is a JSON patch that sets exactly the owned fields, so re-applying an
unchanged rendering sends no write at all.

Replicas: `spec.replicas` of a router or worker Deployment is set when it is created and
again only when the rendered count changes (the `sloline.dev/planned-replicas`
annotation records the count last deployed); in between the tuner owns it.

A rendered field the API server will not change in place (`IMMUTABLE`: a Service's
`clusterIP`, e.g. a Service turning headless) replaces the object: delete, then create.

`prune` deletes objects of a pipeline that the current rendering no longer contains (a
removed stage's Deployment, profiling Jobs that are done), selected by label and checked
against the owner's uid, so nothing created by anyone else is ever deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from sloline.operator.kube import ApiError, KubeApi, Resource, resource_of
from sloline.operator.naming import ANNOTATION_PLANNED_REPLICAS, digest

ANNOTATION_APPLIED: Final = "sloline.dev/applied"
# Fields the operator owns, per kind, besides metadata labels, annotations and owners.
OWNED: Final[Mapping[str, tuple[tuple[str, ...], ...]]] = {
    "ConfigMap": (("data",),),
    # The rendering carries the live token, so data changes only when the key went missing.
    "Secret": (("data",),),
    "NetworkPolicy": (("spec",),),
    "PodDisruptionBudget": (("spec",),),
    "Service": (
        ("spec", "type"),
        ("spec", "selector"),
        ("spec", "ports"),
        ("spec", "publishNotReadyAddresses"),
    ),
    "Deployment": (("spec", "strategy"), ("spec", "template")),
    "ServiceMonitor": (("spec",),),
    "Job": (("spec", "template"),),
    "Ingress": (("spec",),),
    "HTTPRoute": (("spec",),),
    "GRPCRoute": (("spec",),),
}
# Fields that cannot change once set: compared only where the rendering sets them.
IMMUTABLE: Final[Mapping[str, tuple[tuple[str, ...], ...]]] = {
    "Service": (("spec", "clusterIP"),),
}


@dataclass(slots=True)
class ApplyReport:
    """What one apply / prune did, by `Kind/name`."""

    created: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.patched or self.deleted)


def _ref(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _quantity(value: Any) -> Decimal | None:
    if not isinstance(value, str | int):
        return None
    try:
        from kubernetes.utils.quantity import parse_quantity

        parsed: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation):
        return None
    return parsed


def covers(live: Any, desired: Any) -> bool:
    """Whether `live` has every field of `desired` with the same value. Lists must match
    element by element; an empty rendered map or list matches an absent field (the API
    server omits empty collections); quantities compare by value."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(
            (v in ({}, []) and k not in live) or (k in live and covers(live[k], v))
            for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(covers(a, b) for a, b in zip(live, desired, strict=True))
        )
    if live == desired and type(live) is type(desired):
        return True
    if isinstance(desired, str) and isinstance(live, str | int):
        left, right = _quantity(live), _quantity(desired)
        return left is not None and left == right
    return False


def _get(obj: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = obj
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def with_applied_digest(desired: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` with the `sloline.dev/applied` annotation: a digest of the rendering."""
    meta = dict(desired["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), ANNOTATION_APPLIED: digest(desired)}
    return {**desired, "metadata": meta}


def _sets_replicas(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether apply owns `spec.replicas` now: only when the rendered count differs from
    the one last deployed (the tuner owns it between); always for a Deployment rendered
    without that annotation."""
    if desired["kind"] != "Deployment" or "replicas" not in desired.get("spec", {}):
        return False
    planned = desired["metadata"].get("annotations", {}).get(ANNOTATION_PLANNED_REPLICAS)
    if planned is None:
        return True
    deployed = (live["metadata"].get("annotations") or {}).get(ANNOTATION_PLANNED_REPLICAS)
    return bool(planned != deployed)


def must_replace(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether a field of `IMMUTABLE` that the rendering sets differs from the live one."""
    return any(
        _get(desired, path) is not None and _get(live, path) != _get(desired, path)
        for path in IMMUTABLE.get(desired["kind"], ())
    )


def patch_for(desired: Mapping[str, Any], live: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that sets the owned fields of `live` to `desired` (`desired` with its
    applied digest); empty when nothing differs."""
    meta, live_meta = desired["metadata"], live["metadata"]
    owned: list[tuple[str, ...]] = [("spec", "replicas")] if _sets_replicas(desired, live) else []
    owned += OWNED.get(desired["kind"], ())
    unchanged = (
        covers(live_meta.get("labels") or {}, meta.get("labels", {}))
        and covers(live_meta.get("annotations") or {}, meta.get("annotations", {}))
        and covers(live_meta.get("ownerReferences") or [], meta.get("ownerReferences", []))
        and all(covers(_get(live, p), _get(desired, p)) for p in owned)
    )
    if unchanged:
        return []
    ops: list[dict[str, Any]] = []
    for key in ("labels", "annotations"):
        wanted = meta.get(key, {})
        if not live_meta.get(key):
            ops.append({"op": "add", "path": _pointer("metadata", key), "value": wanted})
        else:
            ops += [
                {"op": "add", "path": _pointer("metadata", key, k), "value": v}
                for k, v in wanted.items()
            ]
    if "ownerReferences" in meta:
        owners = _pointer("metadata", "ownerReferences")
        ops.append({"op": "add", "path": owners, "value": meta["ownerReferences"]})
    for field_path in owned:
        value = _get(desired, field_path)
        if value is not None:
            ops.append({"op": "add", "path": _pointer(*field_path), "value": value})
        elif _get(live, field_path) is not None:
            ops.append({"op": "remove", "path": _pointer(*field_path)})
    return ops


def apply(api: KubeApi, desired: Iterable[Mapping[str, Any]]) -> ApplyReport:
    """Create or patch each object so its owned fields match the rendering."""
    report = ApplyReport()
    for obj in desired:
        wanted = with_applied_digest(obj)
        resource = resource_of(wanted)
        namespace, name = wanted["metadata"]["namespace"], wanted["metadata"]["name"]
        live = api.get(resource, namespace, name)
        if live is None:
            try:
                api.create(wanted)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                live = api.get(resource, namespace, name)  # created meanwhile: patch it
            else:
                report.created.append(_ref(wanted))
                continue
        if live is None:
            continue
        if must_replace(wanted, live):
            api.delete(resource, namespace, name)
            api.create(wanted)
            report.deleted.append(_ref(wanted))
            report.created.append(_ref(wanted))
            continue
        ops = patch_for(wanted, live)
        if ops:
            api.patch(resource, namespace, name, ops)
            report.patched.append(_ref(wanted))
        else:
            report.unchanged.append(_ref(wanted))
    return report


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(
        ref.get("uid") == owner_uid and ref.get("controller")
        for ref in obj.get("metadata", {}).get("ownerReferences") or []
    )


def prune(
    api: KubeApi,
    resources: Iterable[Resource],
    namespace: str,
    label_selector: str,
    owner_uid: str,
    keep: Iterable[str],
) -> ApplyReport:
    """Delete objects of `resources` matching `label_selector` and controlled by
    `owner_uid` whose `Kind/name` is not in `keep`."""
    report = ApplyReport()
    kept = set(keep)
    for resource in resources:
        for obj in api.list(resource, namespace, label_selector):
            name = obj["metadata"]["name"]
            gone = _ref(obj) not in kept and owned_by(obj, owner_uid)
            if gone and api.delete(resource, namespace, name):
                report.deleted.append(_ref(obj))
    return report
