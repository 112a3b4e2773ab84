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

from sloline.operator.naming import GRPC_PORT, HTTP_PORT, LABEL_COMPONENT, LABEL_STAGE
from sloline.planner.plan import Plan

ConditionStatus = Literal["True", "False", "Unknown"]
CONDITION_TYPES: Final = ("Valid", "Profiled", "Planned", "Ready")
# The phase the conditions imply, first match wins (Failed: the reason says what failed).
INTERNAL_ERROR: Final = "InternalError"  # reconcile raised something unforeseen (logged)
FAILED_REASONS: Final = frozenset(
    {"InvalidSpec", "ProfilingFailed", "Infeasible", "PlanFailed", INTERNAL_ERROR}
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
    """`status` with the Ready condition from `deployments`. The generation stays the
    one last reconciled: readiness says nothing about a spec not yet handled."""
    generation = int(status.get("observedGeneration") or 0)
    value, reason, message = readiness(deployments)
    return with_conditions(
        status, [("Ready", value, reason, message)], generation=generation, now=now
    )
