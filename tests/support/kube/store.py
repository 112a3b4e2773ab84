"""The state of the emulated API server and the semantics of its verbs, without HTTP.

Objects live in a `kmock.ObjectsArray` (so tests can read their whole history); every change
gets the next value of one global resourceVersion and goes to an append-only event log that
watches read from, so a watch from any resourceVersion gets exactly the later events.
Create, replace, patch and delete keep uid, generation (bumped when anything but metadata
and status changes), creationTimestamp and deletionTimestamp the way the API server does,
isolate the status subresource, honour finalizers, and collect the garbage of owners.

All methods run on the emulator's event loop thread; nothing here awaits except `watch`.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import kmock

from tests.support.kube import patches
from tests.support.kube.kinds import (
    CRDS,
    NAMESPACES,
    ApiError,
    Kind,
    Registry,
    bad_request,
    no_such_resource,
    now,
)
from tests.support.kube.selectors import Predicate

# Server-owned metadata: whatever a client sends for these is replaced with the stored value.
SYSTEM_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp",
                   "deletionTimestamp", "deletionGracePeriodSeconds", "generation")  # fmt: skip

Key = tuple[kmock.resource, str | None, str]


@dataclass(frozen=True)
class Event:
    """One change in the log: the object after it, and before it for modifications."""

    rv: int
    resource: kmock.resource
    type: str
    object: dict[str, Any]
    old: dict[str, Any] | None = None


def _spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What generation tracks: everything but metadata and status (spec, data, rules...)."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _get_path(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


class Store:
    """Objects, the resources they belong to (`kinds`) and the event log."""

    def __init__(self, resources: kmock.ResourcesArray) -> None:
        self.kinds = Registry(resources)
        self.objects = kmock.ObjectsArray()
        self.events: list[Event] = []
        self.closed = False
        # Mutating admission: `fn(kind, obj)` may edit what a client creates or updates
        # (tests use it to post-process what an operator writes).
        self.admission: list[Callable[[str, dict[str, Any]], None]] = []
        self._rv = 0
        self._changed = asyncio.Event()

    # -- reads --------------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def live(self, resource: kmock.resource | None = None) -> Iterator[tuple[Key, dict[str, Any]]]:
        """The existing objects (of one resource), ordered by namespace and name."""
        for key, obj in sorted(self.objects.items(), key=lambda i: (i[0][1] or "", i[0][2])):
            if not obj.deleted and resource in (None, key[0]):
                yield key, obj.raw

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
        key = (kind.resource, namespace if kind.namespaced else None, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kind.not_found(name)
        return self.objects[key].raw

    def list(self, kind: Kind, namespace: str | None, match: Predicate) -> list[dict[str, Any]]:
        return [
            obj
            for _, obj in self.live(kind.resource)
            if namespace in (None, obj["metadata"].get("namespace")) and match(obj)
        ]

    # -- writes -------------------------------------------------------------------------------

    def create(self, kind: Kind, namespace: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        for field, expected in (("kind", kind.kind), ("apiVersion", kind.api_version)):
            if obj.setdefault(field, expected) != expected:
                raise bad_request(f"{field} {obj[field]!r} does not match {expected!r} of the URL")
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            meta["name"] = meta["generateName"] + suffix
        name = meta.get("name") or ""
        if not name:
            raise kind.error(422, "Invalid", name, "metadata.name or generateName is required")
        namespace = self._namespace_of(kind, namespace, meta)
        key = (kind.resource, namespace, name)
        if key in self.objects and not self.objects[key].deleted:
            raise kind.error(409, "AlreadyExists", name, f'{kind.title} "{name}" already exists')
        if "status" in kind.subresources:
            obj.pop("status", None)
        for field in SYSTEM_METADATA[4:]:
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        if kind.scale and not kind.custom:  # API defaulting of the built-in workloads
            obj.setdefault("spec", {}).setdefault("replicas", 1)
        self._admit(kind, obj, None)
        self._prepare(kind, obj)
        meta["resourceVersion"] = self._next_rv()
        if key in self.objects:
            self.objects[key].history.append(obj)
        else:
            self.objects[key] = obj
        self._publish(kind, "ADDED", obj)
        return obj

    def replace(
        self, kind: Kind, namespace: str | None, name: str, body: Any, subresource: str | None
    ) -> dict[str, Any]:
        self._check_subresource(kind, subresource)
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        if body.get("metadata", {}).get("name", name) != name:
            raise bad_request("the name of the object does not match the name in the URL")
        return self._update(kind, self.get(kind, namespace, name), body, subresource)

    def patch(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        body: Any,
        content_type: str,
        subresource: str | None,
    ) -> dict[str, Any]:
        self._check_subresource(kind, subresource)
        apply = content_type.startswith("application/apply-patch")
        if apply and (kind.resource, namespace if kind.namespaced else None, name) not in (
            self.live_keys()
        ):  # server-side apply creates what does not exist
            metadata = {**body.get("metadata", {}), "name": name}
            return self.create(kind, namespace, {**body, "metadata": metadata})
        current = (
            self.scale(kind, namespace, name)
            if subresource == "scale"
            else self.get(kind, namespace, name)
        )
        try:
            if content_type.startswith("application/json-patch"):
                patched = patches.json_patch(current, body)
            elif content_type.startswith("application/merge-patch") or (apply and kind.custom):
                patched = patches.merge_patch(current, body)
            elif content_type.startswith("application/strategic-merge-patch") or apply:
                if kind.custom:
                    raise bad_request(
                        "strategic merge patch is not supported for custom resources; use a "
                        "merge patch or a JSON patch",
                        415,
                        "UnsupportedMediaType",
                    )
                patched = patches.strategic_merge_patch(current, body)
            else:
                raise bad_request(
                    f"unsupported patch type {content_type!r}", 415, "UnsupportedMediaType"
                )
        except (patches.PatchError, TypeError, AttributeError) as e:
            raise kind.error(422, "Invalid", name, f"the patch cannot be applied: {e}") from e
        if subresource == "scale":
            return self.rescale(kind, namespace, name, patched)
        return self._update(kind, self.get(kind, namespace, name), patched, subresource)

    def delete(
        self, kind: Kind, namespace: str | None, name: str, options: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        obj = self.get(kind, namespace, name)
        meta, options = obj["metadata"], options or {}
        for field, value in (options.get("preconditions") or {}).items():
            if value is not None and meta.get(field) != value:
                raise kind.error(409, "Conflict", name, f"precondition failed: {field} != {value}")
        if not meta.get("finalizers"):
            orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents")
            return self._remove(kind, obj, orphan=bool(orphan))
        if meta.get("deletionTimestamp"):
            return obj
        marked = copy.deepcopy(obj)
        marked["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=0)
        return self._store(kind, marked, old=obj)

    # -- the scale subresource ----------------------------------------------------------------

    def scale(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
        if kind.scale is None:
            raise no_such_resource()
        obj = self.get(kind, namespace, name)
        spec_path, status_path, selector_path = kind.scale
        selector = _get_path(obj, selector_path)
        if isinstance(selector, Mapping):  # a LabelSelector of a built-in kind
            selector = ",".join(f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items())
        meta = {k: obj["metadata"][k] for k in SYSTEM_METADATA[:5] if k in obj["metadata"]}
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": meta,
            "spec": {"replicas": _get_path(obj, spec_path) or 0},
            "status": {"replicas": _get_path(obj, status_path) or 0, "selector": selector or ""},
        }

    def rescale(self, kind: Kind, namespace: str | None, name: str, scale: Any) -> dict[str, Any]:
        obj = copy.deepcopy(self.get(kind, namespace, name))
        expected = _get_path(scale, ("metadata", "resourceVersion")) or ""
        if expected and expected != obj["metadata"]["resourceVersion"]:
            raise self._conflict(kind, name)
        replicas = _get_path(scale, ("spec", "replicas"))
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise kind.error(422, "Invalid", name, f"spec.replicas must be >= 0, not {replicas!r}")
        assert kind.scale is not None  # self.get() found the object and Scale was readable
        *parents, last = kind.scale[0]
        target = obj
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = replicas
        self._update(kind, self.get(kind, namespace, name), obj, None)
        return self.scale(kind, namespace, name)

    # -- watching -----------------------------------------------------------------------------

    async def watch(
        self,
        kind: Kind,
        namespace: str | None,
        match: Predicate,
        *,
        since: int | None,
        bookmark: bool,
        timeout_s: float,
    ) -> AsyncIterator[dict[str, Any]]:
        """Events of one resource, as a watch request gets them: from `since` on exactly,
        or (without it) the current objects as ADDED first, then live changes."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        if since is None:
            for obj in self.list(kind, namespace, match):
                yield {"type": "ADDED", "object": obj}
            cursor = len(self.events)
            if bookmark:  # the end of the initial events of a `sendInitialEvents` watch
                meta = {
                    "resourceVersion": self.resource_version,
                    "annotations": {"k8s.io/initial-events-end": "true"},
                }
                yield {
                    "type": "BOOKMARK",
                    "object": {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta},
                }
        else:
            cursor = bisect.bisect_right(self.events, since, key=lambda e: e.rv)
        while not self.closed:
            while cursor < len(self.events):
                event = self._as_seen(self.events[cursor], kind, namespace, match)
                cursor += 1
                if event is not None:
                    yield event
            changed = self._changed  # taken with no await since the last look at the log
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(changed.wait(), max(remaining, 0))
            except TimeoutError:
                return

    def close(self) -> None:
        """End all watches (the server is stopping)."""
        self.closed = True
        self._changed.set()

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _check_subresource(kind: Kind, subresource: str | None) -> None:
        if subresource is not None and subresource not in kind.subresources:
            raise no_such_resource()

    def live_keys(self) -> set[Key]:
        return {key for key, _ in self.live()}

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _conflict(self, kind: Kind, name: str) -> ApiError:
        return kind.error(
            409,
            "Conflict",
            name,
            (
                f'Operation cannot be fulfilled on {kind.title} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again"
            ),
        )

    def _namespace_of(self, kind: Kind, namespace: str | None, meta: dict[str, Any]) -> str | None:
        """The namespace a new object goes to (set in its metadata); it must exist."""
        if not kind.namespaced:
            meta.pop("namespace", None)
            return None
        namespace = namespace or meta.get("namespace")
        if meta.setdefault("namespace", namespace) != namespace or not namespace:
            raise bad_request("the namespace of the object does not match the request's")
        self.get(self.kinds.kind(NAMESPACES), None, namespace)  # 404 where it does not exist
        return namespace

    def _update(
        self, kind: Kind, old: dict[str, Any], body: Mapping[str, Any], subresource: str | None
    ) -> dict[str, Any]:
        name = old["metadata"]["name"]
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected not in (None, "", old["metadata"]["resourceVersion"]):
            raise self._conflict(kind, name)
        new = copy.deepcopy(dict(body))
        if subresource == "status":  # a status write changes the status only
            status = new.get("status")
            new = {k: copy.deepcopy(v) for k, v in old.items() if k != "status"}
            if status is not None:
                new["status"] = status
        elif "status" in kind.subresources:  # and a main-resource write everything else
            new.pop("status", None)
            if "status" in old:
                new["status"] = old["status"]
        new.update(apiVersion=kind.api_version, kind=kind.kind)
        self._admit(kind, new, subresource)
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        for field in SYSTEM_METADATA:
            meta.pop(field, None)
            if field in old_meta:
                meta[field] = old_meta[field]
        if old_meta.get("deletionTimestamp") and set(meta.get("finalizers") or ()) - set(
            old_meta.get("finalizers") or ()
        ):
            raise kind.error(
                422,
                "Invalid",
                name,
                "metadata.finalizers: Forbidden: no new "
                "finalizers can be added if the object is being deleted",
            )
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        if _spec(new) != _spec(old):
            meta["generation"] = old_meta.get("generation", 0) + 1
        self._prepare(kind, new)
        if new == old:  # a no-op write changes nothing, not even the resourceVersion
            return old
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(kind, new)
        return self._store(kind, new, old)

    def _admit(self, kind: Kind, obj: dict[str, Any], subresource: str | None) -> None:
        if subresource is None:  # status and scale writes are not admitted again
            for admit in self.admission:
                admit(kind.kind, obj)

    def _store(self, kind: Kind, obj: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = self._next_rv()
        key = (kind.resource, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        self.objects[key].history.append(obj)
        self._publish(kind, "MODIFIED", obj, old)
        return obj

    def _remove(self, kind: Kind, obj: dict[str, Any], *, orphan: bool = False) -> dict[str, Any]:
        meta = obj["metadata"]
        gone = {**obj, "metadata": {**meta, "resourceVersion": self._next_rv()}}
        self.objects[kind.resource, meta.get("namespace"), meta["name"]].delete()
        self._publish(kind, "DELETED", gone)
        if kind.resource == NAMESPACES:  # the namespace controller's job, done at once
            for res, namespace, name in self.live_keys():
                if namespace == meta["name"]:
                    self._delete_if_live(res, namespace, name)
        if kind.resource == CRDS:
            for resource in self.kinds.crds.get(meta["name"], []):
                for _, custom in list(self.live(resource)):
                    self._remove(self.kinds.kind(resource), custom)
            self.kinds.unregister_crd(meta["name"])
        if not orphan:  # the garbage collector: dependents whose owners are all gone
            alive = {o["metadata"]["uid"] for _, o in self.live()}
            for key, dependent in list(self.live()):
                refs = dependent["metadata"].get("ownerReferences", [])
                owners = {ref.get("uid") for ref in refs}
                if meta["uid"] in owners and not owners & alive:
                    self._delete_if_live(*key)
        return gone

    def _delete_if_live(self, resource: kmock.resource, namespace: str | None, name: str) -> None:
        # Cascades may have removed it already, or may mark it deleted (finalizers).
        if (resource, namespace, name) in self.live_keys():
            self.delete(self.kinds.kind(resource), namespace, name)

    def _publish(
        self, kind: Kind, type_: str, obj: dict[str, Any], old: dict[str, Any] | None = None
    ) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.events.append(Event(rv, kind.resource, type_, obj, old))
        self._changed.set()
        self._changed = asyncio.Event()

    @staticmethod
    def _as_seen(
        event: Event, kind: Kind, namespace: str | None, match: Callable[[Any], bool]
    ) -> dict[str, Any] | None:
        """The event as a watch with these filters sees it: an object that starts or stops
        matching a selector is ADDED or DELETED for that watch, as in Kubernetes."""
        if event.resource != kind.resource or namespace not in (
            None,
            event.object["metadata"].get("namespace"),
        ):
            return None
        after, before = match(event.object), event.old is not None and match(event.old)
        if event.type == "MODIFIED" and after != before:
            return {"type": "ADDED" if after else "DELETED", "object": event.object}
        return {"type": event.type, "object": event.object} if after else None

    def _prepare(self, kind: Kind, obj: dict[str, Any]) -> None:
        """What controllers do at once here: namespaces are Active, CRDs are established."""
        if kind.resource == NAMESPACES:
            obj.setdefault("status", {"phase": "Active"})
        elif kind.resource == CRDS:  # (conditions kept: a re-apply is no transition)
            status = self.kinds.register_crd(obj)
            conditions = obj.get("status", {}).get("conditions") or status["conditions"]
            obj["status"] = {**status, "conditions": conditions}
