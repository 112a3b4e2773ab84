"""The Deployment and Job controllers of the process kubelet, as level-triggered syncs:
each call looks at the objects as they are and makes the pods and status they call for.

- Deployment: `spec.replicas` pods named `<deployment>-<pod-template-hash>-<random>`,
  owned by the Deployment (no ReplicaSets: the emulator's garbage collector deletes the
  pods with the Deployment). A template change rolls: RollingUpdate creates new pods up
  to `maxSurge` over the count and deletes old ones as new ones turn ready, keeping
  `replicas - maxUnavailable` ready; Recreate deletes every old pod first. Scaling down
  deletes not-ready pods first, then the newest. Status through `/status`:
  observedGeneration, replicas, updatedReplicas, readyReplicas, availableReplicas and the
  Available / Progressing conditions.
- Job: one pod at a time until one succeeds (`completions` 1), a new pod after a failed
  one with a backoff, until `backoffLimit` failures (container restarts count, as with
  restartPolicy OnFailure); `activeDeadlineSeconds` deletes the active pod and fails the
  Job. Status: startTime, active, succeeded, failed, ready, completionTime and the
  SuccessCriteriaMet / Complete or FailureTarget / Failed conditions.

Pods carry the finalizer `FINALIZER`: the emulator deletes objects at once, so the
finalizer stands in for graceful pod deletion — the kubelet removes it once the pod's
processes are gone, and only then does the Pod object disappear.
"""

from __future__ import annotations

import datetime
import itertools
import math
import random
import time
from collections.abc import Callable
from typing import Any

from tests.support.kube.kinds import ApiError
from tests.support.kube.network import pod_ready
from tests.support.kube.podspec import Obj, template_hash

FINALIZER = "kubelet.sloline.dev/graceful-deletion"
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def terminating(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def new_pod(owner: Obj, name: str, labels: dict[str, str], node: str) -> Obj:
    """A pod from the owner's template, owned by it (controller), on this node."""
    template = owner["spec"]["template"]
    meta = template.get("metadata") or {}
    owner_meta = owner["metadata"]
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner_meta["name"],
        "uid": owner_meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": owner_meta["namespace"],
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [reference],
            "finalizers": [FINALIZER],
        },
        "spec": {**template["spec"], "nodeName": node},
    }


def _suffix() -> str:
    return "".join(random.choices(NAME_CHARS, k=5))


def _scaled(value: Any, replicas: int, default: str, *, up: bool) -> int:
    """maxSurge (rounded up) or maxUnavailable (rounded down) as a pod count."""
    value = default if value is None else value
    if isinstance(value, str) and value.endswith("%"):
        exact = replicas * float(value[:-1]) / 100.0
        return math.ceil(exact) if up else math.floor(exact)
    return int(value)


def _condition(old: list[Obj], type_: str, ok: bool, reason: str, message: str) -> Obj:
    """A condition, keeping its transition time while its status stays the same."""
    status = "True" if ok else "False"
    previous = next((c for c in old if c.get("type") == type_), {})
    same = previous.get("status") == status and previous.get("reason") == reason
    stamp = previous.get("lastTransitionTime") if same else utc_now()
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp,
        "lastUpdateTime": stamp,
    }


class Controllers:
    """Deployment and Job controllers writing through `api` (the emulator's blocking API)."""

    def __init__(
        self, api: Any, node: str, log: Callable[[str], None], job_backoff_s: float = 1.0
    ) -> None:
        self.api, self.node, self.log = api, node, log
        self.job_backoff_s = job_backoff_s
        self._job_failures: dict[str, tuple[int, float]] = {}  # uid -> (failures, when)
        self._created: dict[tuple[str, str], int] = {}  # pods made here -> creation order
        self._checked: dict[str, bool] = {}  # owner uid -> live, within one sync
        self._sequence = itertools.count(1)

    def sync(self, deployments: list[Obj], jobs: list[Obj], pods: list[Obj]) -> None:
        self._checked.clear()
        for deployment in deployments:
            if not terminating(deployment):
                self._sync_deployment(deployment, pods)
        for job in jobs:
            if not terminating(job):
                self._sync_job(job, pods)
        self._collect_orphans(deployments + jobs, pods)

    def _live(self, owner: Obj) -> bool:
        """Whether the owner still exists and is not being deleted (the lists a sync works
        from may be a moment old: a pod made for a deleted owner would never go)."""
        meta = owner["metadata"]
        resource = {"Deployment": "deployments", "Job": "jobs"}[owner["kind"]]
        found = self.api.find(resource, meta["namespace"], meta["name"])
        return (
            found is not None
            and found["metadata"]["uid"] == meta["uid"]
            and not (terminating(found))
        )

    def _collect_orphans(self, owners: list[Obj], pods: list[Obj]) -> None:
        """The garbage collector's part the emulator lacks: pods whose Deployment or Job
        is gone (it was deleted while they were being created)."""
        listed = {o["metadata"]["uid"] for o in owners}
        for pod in pods:
            refs = [
                r
                for r in pod["metadata"].get("ownerReferences") or []
                if r.get("controller") and r.get("kind") in ("Deployment", "Job")
            ]
            if not refs or terminating(pod) or refs[0]["uid"] in listed:
                continue
            ref = refs[0]
            identity = {"namespace": pod["metadata"]["namespace"], "name": ref["name"]}
            owner = {"kind": ref["kind"], "metadata": {**identity, "uid": ref["uid"]}}
            if not self._live(owner):
                self._delete(pod, f"its {ref['kind']} {ref['name']} is gone")

    # -- writes ---------------------------------------------------------------------------

    def _create(self, pod: Obj) -> None:
        meta, owner = pod["metadata"], pod["metadata"]["ownerReferences"][0]
        key = owner["uid"]
        if key not in self._checked:  # once per sync: the owner is still there
            identity = {"namespace": meta["namespace"], "name": owner["name"], "uid": key}
            self._checked[key] = self._live({"kind": owner["kind"], "metadata": identity})
        if not self._checked[key]:
            return
        try:
            self.api.create(pod)
            self.log(f"{meta['namespace']}/{meta['name']}: created")
        except ApiError as exc:
            if exc.status != 409:
                raise

    def _delete(self, pod: Obj, why: str) -> None:
        meta = pod["metadata"]
        self.log(f"{meta['namespace']}/{meta['name']}: deleting ({why})")
        try:
            self.api.delete("pods", meta["namespace"], meta["name"])
        except ApiError as exc:
            if exc.status != 404:
                raise

    def _write_status(self, resource: str, obj: Obj, status: Obj) -> None:
        if status == (obj.get("status") or {}):
            return
        meta = obj["metadata"]
        replace = [{"op": "add", "path": "/status", "value": status}]
        try:
            self.api.patch(
                resource,
                meta["namespace"],
                meta["name"],
                replace,
                subresource="status",
                patch_type="json",
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    # -- Deployments ----------------------------------------------------------------------

    def _sync_deployment(self, deployment: Obj, pods: list[Obj]) -> None:
        meta, spec = deployment["metadata"], deployment["spec"]
        owned = [p for p in pods if owned_by(p, meta["uid"])]
        live = [p for p in owned if not terminating(p)]
        hash_ = template_hash(spec["template"])
        new = [
            p for p in live if (p["metadata"].get("labels") or {}).get("pod-template-hash") == hash_
        ]
        old = [p for p in live if p not in new]
        replicas = int(spec.get("replicas", 1))
        strategy = spec.get("strategy") or {}
        rolling = strategy.get("rollingUpdate") or {}
        surge = _scaled(rolling.get("maxSurge"), replicas, "25%", up=True)
        unavailable = _scaled(rolling.get("maxUnavailable"), replicas, "25%", up=False)
        if surge == 0 and unavailable == 0:
            surge = 1
        if strategy.get("type") == "Recreate":
            unavailable = 0
            for pod in old:
                self._delete(pod, "recreate: a new template")
            if not any(terminating(p) for p in owned) and not old:
                self._scale(deployment, new, replicas, hash_)
        elif old:
            self._roll(deployment, new, old, replicas, surge, unavailable, hash_)
        else:
            self._scale(deployment, new, replicas, hash_)
        status = self._deployment_status(deployment, live, new, old, unavailable)
        self._write_status("deployments", deployment, status)

    def _scale(self, deployment: Obj, pods: list[Obj], replicas: int, hash_: str) -> None:
        for _ in range(replicas - len(pods)):
            self._create_deployment_pod(deployment, hash_)
        for pod in _victims(sorted(pods, key=self._age), len(pods) - replicas):
            self._delete(pod, f"scaled down to {replicas}")

    def _create_deployment_pod(self, deployment: Obj, hash_: str) -> None:
        name = f"{deployment['metadata']['name']}-{hash_}-{_suffix()}"
        self._created[deployment["metadata"]["namespace"], name] = next(self._sequence)
        self._create(new_pod(deployment, name, {"pod-template-hash": hash_}, self.node))

    def _age(self, pod: Obj) -> tuple[str, int]:
        """Creation order: the timestamp (whole seconds), then the order this made them."""
        meta = pod["metadata"]
        return meta.get("creationTimestamp", ""), self._created.get(
            (meta["namespace"], meta["name"]), 0
        )

    def _roll(
        self,
        deployment: Obj,
        new: list[Obj],
        old: list[Obj],
        replicas: int,
        surge: int,
        unavailable: int,
        hash_: str,
    ) -> None:
        room = min(replicas + surge - len(new) - len(old), replicas - len(new))
        for _ in range(max(0, room)):
            self._create_deployment_pod(deployment, hash_)
        for pod in [p for p in old if not pod_ready(p)]:
            self._delete(pod, "rolling update: an old pod that is not ready")
        ready_old = [p for p in old if pod_ready(p)]
        ready = sum(map(pod_ready, new)) + len(ready_old)
        spare = ready - (replicas - unavailable)
        for pod in ready_old[: max(0, spare)]:
            self._delete(pod, "rolling update: replaced by a ready new pod")

    def _deployment_status(
        self, deployment: Obj, live: list[Obj], new: list[Obj], old: list[Obj], unavailable: int
    ) -> Obj:
        replicas = int(deployment["spec"].get("replicas", 1))
        ready = sum(map(pod_ready, live))
        conditions = (deployment.get("status") or {}).get("conditions") or []
        available = ready >= replicas - unavailable
        complete = not old and len(new) == replicas and all(map(pod_ready, new))
        status: Obj = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(live),
            "updatedReplicas": len(new),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, replicas - ready),
            "conditions": [
                _condition(
                    conditions,
                    "Available",
                    available,
                    f"MinimumReplicas{'A' if available else 'Una'}vailable",
                    f"Deployment {'has' if available else 'does not have'} minimum availability.",
                ),
                _condition(
                    conditions,
                    "Progressing",
                    True,
                    "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                    f"{len(new)} of {replicas} updated pod(s) exist, {ready} ready",
                ),
            ],
        }
        return {k: v for k, v in status.items() if v != 0}

    # -- Jobs -----------------------------------------------------------------------------

    def _sync_job(self, job: Obj, pods: list[Obj]) -> None:
        meta, old = job["metadata"], job.get("status") or {}
        if any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in old.get("conditions") or []
        ):
            return
        owned = [p for p in pods if owned_by(p, meta["uid"]) and not terminating(p)]
        active = [p for p in owned if phase(p) not in ("Succeeded", "Failed")]
        succeeded = sum(phase(p) == "Succeeded" for p in owned)
        restarts = sum(
            int(c.get("restartCount") or 0)
            for p in owned
            for c in (p.get("status") or {}).get("containerStatuses") or []
        )
        failed = sum(phase(p) == "Failed" for p in owned)
        status: Obj = {
            "startTime": old.get("startTime") or utc_now(),
            "active": len(active),
            "ready": sum(map(pod_ready, active)),
            "succeeded": succeeded,
            "failed": failed,
        }
        verdict = self._job_verdict(job, status, succeeded, failed + restarts)
        if verdict is not None:
            for pod in active:
                self._delete(pod, f"job {verdict[1]}")
            status["conditions"] = self._job_conditions(*verdict)
            status["active"] = 0
            if verdict[0]:
                status["completionTime"] = utc_now()
        elif not active and self._job_may_retry(meta["uid"], failed):
            labels = {
                "job-name": meta["name"],
                "batch.kubernetes.io/job-name": meta["name"],
                "controller-uid": meta["uid"],
                "batch.kubernetes.io/controller-uid": meta["uid"],
            }
            self._create(new_pod(job, f"{meta['name']}-{_suffix()}", labels, self.node))
        self._write_status("jobs", job, {k: v for k, v in status.items() if v != 0})

    @staticmethod
    def _job_verdict(
        job: Obj, status: Obj, succeeded: int, failures: int
    ) -> tuple[bool, str, str] | None:
        """(succeeded, reason, message) once the Job is finished, else None."""
        spec = job["spec"]
        if succeeded >= int(spec.get("completions", 1)):
            return True, "CompletionsReached", "Reached expected number of succeeded pods"
        if failures > int(spec.get("backoffLimit", 6)):
            return False, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        deadline = spec.get("activeDeadlineSeconds")
        started = datetime.datetime.fromisoformat(status["startTime"].replace("Z", "+00:00"))
        elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
        if deadline is not None and elapsed > float(deadline):
            return False, "DeadlineExceeded", "Job was active longer than specified deadline"
        return None

    @staticmethod
    def _job_conditions(succeeded: bool, reason: str, message: str) -> list[Obj]:
        types = ("SuccessCriteriaMet", "Complete") if succeeded else ("FailureTarget", "Failed")
        return [_condition([], t, True, reason, message) for t in types]

    def _job_may_retry(self, uid: str, failed: int) -> bool:
        """Whether a new pod may start: at once, or after the backoff after a failure."""
        if failed == 0:
            return True
        seen, when = self._job_failures.get(uid, (0, 0.0))
        if failed != seen:
            self._job_failures[uid] = (failed, time.monotonic())
            return False
        return time.monotonic() - when >= self.job_backoff_s * 2 ** (failed - 1)


def _victims(ranked: list[Obj], count: int) -> list[Obj]:
    """The pods to delete when scaling down by `count`: not-ready ones first, then newest."""
    if count <= 0:
        return []
    not_ready = [p for p in ranked if not pod_ready(p)]
    ready = [p for p in ranked if pod_ready(p)]
    order = not_ready[::-1] + ready[::-1]
    return order[:count]
