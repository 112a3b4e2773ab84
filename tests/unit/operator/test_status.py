"""Status: Kubernetes-style conditions whose lastTransitionTime moves only with their
status, the phase they imply, and Ready from the Deployments."""

from __future__ import annotations

from typing import Any

from sloline.operator.status import (
    addressable,
    endpoints,
    phase_of,
    plan_summary,
    readiness,
    set_condition,
    with_conditions,
    with_readiness,
)
from tests.unit.operator.helpers import make_plan, target

T0, T1, T2 = "2026-11-22T08:00:00Z", "2026-11-22T08:00:05Z", "2026-11-22T08:01:00Z"


def test_last_transition_time_changes_only_with_the_status() -> None:
    conditions = set_condition([], "Ready", "False", "Waiting", "a", generation=1, now=T0)
    again = set_condition(conditions, "Ready", "False", "Waiting", "b", generation=2, now=T1)
    assert again[0]["lastTransitionTime"] == T0
    assert (again[0]["message"], again[0]["observedGeneration"]) == ("b", 2)
    flipped = set_condition(again, "Ready", "True", "Ready", "c", generation=2, now=T2)
    assert flipped[0]["lastTransitionTime"] == T2
    assert set(flipped[0]) == {
        "type",
        "status",
        "reason",
        "message",
        "observedGeneration",
        "lastTransitionTime",
    }


def test_conditions_keep_their_order() -> None:
    status: dict[str, Any] = {}
    for type_ in ("Ready", "Planned", "Valid", "Profiled"):
        status = with_conditions(status, [(type_, "True", "R", "m")], generation=1, now=T0)
    assert [c["type"] for c in status["conditions"]] == ["Valid", "Profiled", "Planned", "Ready"]


def c(type_: str, status: str, reason: str = "R") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason}


def test_phase_follows_the_first_step_not_done() -> None:
    assert phase_of([]) == "Pending"
    assert phase_of([c("Valid", "True")]) == "Profiling"
    assert phase_of([c("Valid", "True"), c("Profiled", "True")]) == "Planning"
    done = [c("Valid", "True"), c("Profiled", "True"), c("Planned", "True")]
    assert phase_of(done) == "Deploying"
    assert phase_of([*done, c("Ready", "True")]) == "Ready"
    assert phase_of([c("Valid", "False", "InvalidSpec")]) == "Failed"
    assert phase_of([c("Valid", "True"), c("Profiled", "False", "ProfilingFailed")]) == "Failed"
    assert phase_of([*done[:2], c("Planned", "False", "Infeasible")]) == "Failed"
    # A spec change being re-profiled while the old plan serves.
    assert (
        phase_of([c("Valid", "True"), c("Profiled", "False", "Profiling"), c("Ready", "True")])
        == "Profiling"
    )


def deployment(name: str, component: str, replicas: int, ready: int | None) -> dict[str, Any]:
    labels = {"app.kubernetes.io/component": component}
    if component == "worker":
        labels["sloline.dev/stage"] = name
    status = {} if ready is None else {"readyReplicas": ready}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas},
        "status": status,
    }


def test_ready_when_router_and_every_stage_serve() -> None:
    assert readiness([])[0] == "False"
    waiting = readiness(
        [
            deployment("p-router", "router", 1, 1),
            deployment("a", "worker", 2, 1),
            deployment("b", "worker", 3, None),
        ]
    )
    assert waiting == ("False", "Waiting", "waiting for b (0/3 ready)")
    assert readiness([deployment("p-router", "router", 1, 1), deployment("a", "worker", 2, 1)]) == (
        "True",
        "Ready",
        "2 Deployments serving",
    )
    scaled_to_zero = deployment("z", "worker", 0, None)
    assert readiness([deployment("p-router", "router", 1, 1), scaled_to_zero])[0] == "True"


def test_readiness_keeps_the_reconciled_generation() -> None:
    status = with_conditions({}, [("Valid", "True", "Valid", "ok")], generation=4, now=T0)
    updated = with_readiness(status, [deployment("r", "router", 1, 1)], now=T1)
    ready = updated["conditions"][-1]
    assert (ready["type"], ready["status"], ready["observedGeneration"]) == ("Ready", "True", 4)


def test_plan_summary_and_endpoints() -> None:
    t = target()
    summary = plan_summary(make_plan(t))
    assert summary["stages"][0] == {"name": "s1", "hardware": "cpu-1", "maxBatch": 4, "replicas": 2}
    assert (summary["estimatedP99Ms"], summary["costPerHour"]) == (40.0, 0.3)
    assert endpoints("p-router", "ns") == {
        "http": "http://p-router.ns.svc:8000",
        "grpc": "p-router.ns.svc:8001",
    }
    assert endpoints("p-router", "ns", tls=True)["http"] == "https://p-router.ns.svc:8000"


def test_addressable_gives_url_and_address() -> None:
    fields = addressable("p-router", "ns")
    assert fields == {
        "endpoints": endpoints("p-router", "ns"),
        "url": "http://p-router.ns.svc:8000",
        "address": {"url": "http://p-router.ns.svc:8000"},
    }
    assert addressable("p-router", "ns", tls=True)["address"] == {
        "url": "https://p-router.ns.svc:8000"
    }
