"""The PredictionPipeline's status as pure functions: conditions, phase, plan summary,
endpoints, readiness (docs/kubernetes.md "Status").

Conditions follow the Kubernetes API conventions: `type`, `status` (`True`, `False`,
`Unknown`), a CamelCase `reason`, a human `message`, `observedGeneration` and
`lastTransitionTime`, which changes only when `status` does, so watchers can tell how long
a pipeline has been ready or failing. Time is an argument (`now`, RFC 3339).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

from sloline.operator.naming import (
    GRPC_PORT,
    HTTP_PORT,
    LABEL_COMPONENT,
    LABEL_STAGE,
    STORAGE_INITIALIZER,
)
from sloline.planner.plan import Plan
from sloline.spec.storage import CHECKSUM_MISMATCH, FETCH_FAILED, read_termination_message

ConditionStatus = Literal["True", "False", "Unknown"]
CONDITION_TYPES: Final = ("Valid", "Profiled", "Planned", "ModelsReady", "Ready")
# The phase the conditions imply, first match wins (Failed: the reason says what failed).
INTERNAL_ERROR: Final = "InternalError"  # reconcile raised something unforeseen (logged)
FAILED_REASONS: Final = frozenset(
    {
        "InvalidSpec",
        "ProfilingFailed",
        "Infeasible",
        "PlanFailed",
        CHECKSUM_MISMATCH,
        INTERNAL_ERROR,
    }
)


def utc_now() -> str:
    """The current time as Kubernetes writes it (RFC 3339, seconds, Z)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """`conditions` with `type_` set; its `lastTransitionTime` moves only if the status
    changes. Conditions keep the order of `CONDITION_TYPES`."""
    by_type = {c["type"]: dict(c) for c in conditions}
    old = by_type.get(type_)
    changed = old is None or old.get("status") != status
    by_type[type_] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now if changed or old is None else old["lastTransitionTime"],
    }
    known = [by_type.pop(t) for t in CONDITION_TYPES if t in by_type]
    return known + [by_type[t] for t in sorted(by_type)]


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    for item in status.get("conditions") or []:
        if item.get("type") == type_:
            return dict(item)
    return None


def phase_of(conditions: Sequence[Mapping[str, Any]]) -> str:
    """Failed if any condition failed for good; else the first step not yet done."""
    by_type = {c["type"]: c for c in conditions}
    if any(c.get("reason") in FAILED_REASONS for c in conditions):
        return "Failed"
    for type_, phase in (("Valid", "Pending"), ("Profiled", "Profiling"), ("Planned", "Planning")):
        if by_type.get(type_, {}).get("status") != "True":
            return phase
    return "Ready" if by_type.get("Ready", {}).get("status") == "True" else "Deploying"


def with_conditions(
    status: Mapping[str, Any],
    updates: Iterable[tuple[str, ConditionStatus, str, str]],
    *,
    generation: int,
    now: str,
) -> dict[str, Any]:
    """`status` with the given `(type, status, reason, message)` conditions set, the phase
    recomputed and `observedGeneration` = `generation`."""
    conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
    for type_, value, reason, message in updates:
        conditions = set_condition(
            conditions, type_, value, reason, message, generation=generation, now=now
        )
    return {
        **status,
        "conditions": conditions,
        "phase": phase_of(conditions),
        "observedGeneration": generation,
    }


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The plan as the status shows it (the full plan is `plan.json` in `<p>-config`)."""
    return {
        "stages": [
            {
                "name": s.name,
                "hardware": s.hardware,
                "maxBatch": s.max_batch,
                "replicas": s.replicas,
            }
            for s in plan.stages
        ],
        "estimatedP99Ms": round(plan.p99_s * 1000.0, 3),
        "costPerHour": round(plan.cost_per_hour, 6),
    }


def endpoints(service: str, namespace: str, *, tls: bool = False) -> dict[str, str]:
    host = f"{service}.{namespace}.svc"
    scheme = "https" if tls else "http"
    return {"http": f"{scheme}://{host}:{HTTP_PORT}", "grpc": f"{host}:{GRPC_PORT}"}


def addressable(service: str, namespace: str, *, tls: bool = False) -> dict[str, Any]:
    """The status fields a Knative/KServe client reads: `endpoints`, `url` (the HTTP
    front door, the URL printer column) and `address` (`{url}`, the addressable shape)."""
    found = endpoints(service, namespace, tls=tls)
    return {"endpoints": found, "url": found["http"], "address": {"url": found["http"]}}


def readiness(deployments: Iterable[Mapping[str, Any]]) -> tuple[ConditionStatus, str, str]:
    """The Ready condition from the pipeline's Deployments: ready when the router and
    every stage with replicas have at least one ready pod (the pipeline can serve)."""
    waiting = []
    seen = 0
    for deployment in sorted(deployments, key=lambda d: d["metadata"]["name"]):
        labels = deployment["metadata"].get("labels") or {}
        if labels.get(LABEL_COMPONENT) not in ("router", "worker"):
            continue
        seen += 1
        desired = int((deployment.get("spec") or {}).get("replicas", 1) or 0)
        ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
        if desired > 0 and ready < 1:
            what = labels.get(LABEL_STAGE) or labels.get(LABEL_COMPONENT, "?")
            waiting.append(f"{what} ({ready}/{desired} ready)")
    if seen == 0:
        return "False", "NotDeployed", "no router or worker Deployment exists yet"
    if waiting:
        return "False", "Waiting", "waiting for " + ", ".join(waiting)
    return "True", "Ready", f"{seen} Deployments serving"


def with_readiness(
    status: Mapping[str, Any], deployments: Iterable[Mapping[str, Any]], *, now: str
) -> dict[str, Any]:
    """`status` with the Ready condition from `deployments`; while they are not ready and
    `ModelsReady` is False, Ready gives its reason and message (what keeps the pods from
    starting). The generation stays the one last reconciled: readiness says nothing
    about a spec not yet handled."""
    generation = int(status.get("observedGeneration") or 0)
    value, reason, message = readiness(deployments)
    models = condition(status, "ModelsReady")
    if value == "False" and models is not None and models.get("status") == "False":
        reason, message = str(models["reason"]), str(models["message"])
    return with_conditions(
        status, [("Ready", value, reason, message)], generation=generation, now=now
    )


def _storage_failure(status: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, detail) of a storage initializer's failed run: it ended non-zero, or it
    is being restarted (CrashLoopBackOff, or running again) after a run that did."""
    ended = (status.get("state") or {}).get("terminated")
    if ended is None:
        ended = (status.get("lastState") or {}).get("terminated")
    if ended is None or int(ended.get("exitCode", 0)) == 0:
        return None
    reason, detail = read_termination_message(str(ended.get("message") or ""))
    return reason, detail or f"the storage initializer exited with {ended.get('exitCode')}"


def models_readiness(
    pods: Iterable[Mapping[str, Any]],
) -> tuple[ConditionStatus, str, str] | None:
    """The ModelsReady condition from the storage initializers of the pipeline's pods
    (workers and profiling Jobs of pipelines with a `storageUri`): False with the reason
    of a failed fetch (`ChecksumMismatch`, `FetchFailed`) and what the initializers'
    termination messages say (the stage, the URI, both digests); Unknown while fetching;
    True once every such pod fetched. None when no pod has a storage initializer."""
    failures: dict[str, str] = {}  # what failed -> its reason
    fetching = fetched = 0
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        spec_names = [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
        if STORAGE_INITIALIZER not in spec_names or pod["metadata"].get("deletionTimestamp"):
            continue
        status = (pod.get("status") or {}).get("initContainerStatuses") or []
        found: Mapping[str, Any] = next(
            (s for s in status if s.get("name") == STORAGE_INITIALIZER), {}
        )
        failure = _storage_failure(found)
        if failure is not None:
            reason, detail = failure
            if not detail.startswith("stage "):  # a crash's log tail: say whose it is
                detail = f"pod {pod['metadata']['name']}: {detail}"
            failures.setdefault(detail, reason)
        elif ((found.get("state") or {}).get("terminated") or {}).get("exitCode") == 0:
            fetched += 1
        else:
            fetching += 1
    if failures:
        reasons = set(failures.values())
        reason = CHECKSUM_MISMATCH if CHECKSUM_MISMATCH in reasons else min(reasons)
        return "False", reason, "; ".join(sorted(failures))
    if fetching:
        return "Unknown", "Fetching", f"{fetching} pod(s) fetching their models from storage"
    if fetched:
        return "True", "Fetched", f"{fetched} pod(s) fetched their models from storage"
    return None


def with_models(
    status: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], *, now: str
) -> dict[str, Any]:
    """`status` with the ModelsReady condition from `pods` (unchanged when none of them
    fetches a model: the condition stays as the last pods left it). A failed fetch also
    makes Ready False with its reason, unless the pipeline serves (Ready True); once the
    pods fetch again, Ready waits for them instead (the Deployments decide the rest)."""
    found = models_readiness(pods)
    if found is None:
        return dict(status)
    generation = int(status.get("observedGeneration") or 0)
    updates: list[tuple[str, ConditionStatus, str, str]] = [("ModelsReady", *found)]
    ready = condition(status, "Ready") or {}
    if found[0] == "False" and ready.get("status") != "True":
        updates.append(("Ready", *found))
    elif found[0] != "False" and ready.get("reason") in (CHECKSUM_MISMATCH, FETCH_FAILED):
        updates.append(("Ready", "False", "Waiting", f"waiting for the pods: {found[2]}"))
    return with_conditions(status, updates, generation=generation, now=now)
