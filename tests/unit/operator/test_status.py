"""Status: Kubernetes-style conditions whose lastTransitionTime moves only with their
status, the phase they imply, Ready from the Deployments and ModelsReady from the pods'
storage initializers."""

from __future__ import annotations

from typing import Any

from sloline.operator.status import (
    addressable,
    condition,
    endpoints,
    models_readiness,
    phase_of,
    plan_summary,
    readiness,
    set_condition,
    with_conditions,
    with_models,
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
    for type_ in ("Ready", "ModelsReady", "Planned", "Valid", "Profiled"):
        status = with_conditions(status, [(type_, "True", "R", "m")], generation=1, now=T0)
    assert [c["type"] for c in status["conditions"]] == [
        "Valid",
        "Profiled",
        "Planned",
        "ModelsReady",
        "Ready",
    ]


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


URI = "https://models.example.com/digits/fast.onnx"
MISMATCH = (
    f"ChecksumMismatch: stage fast: checksum mismatch for {URI}: sha256 is {'a' * 64}, "
    f"the spec says {'b' * 64}"
)


def pod(name: str, stage: str, init: dict[str, Any] | None) -> dict[str, Any]:
    """A pod of stage `stage` with a storage initializer whose status is `init` (None:
    not reported yet), as the kubelet writes it."""
    statuses = [] if init is None else [{"name": "storage-initializer", **init}]
    return {
        "metadata": {"name": name, "labels": {"sloline.dev/stage": stage}},
        "spec": {"initContainers": [{"name": "storage-initializer"}], "containers": []},
        "status": {"initContainerStatuses": statuses},
    }


def models(pods: list[dict[str, Any]]) -> tuple[str, str, str]:
    found = models_readiness(pods)
    assert found is not None
    return found


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found = condition(status, type_)
    assert found is not None, type_
    return found


def ended(code: int, message: str = "") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Error", "message": message}}


def test_models_ready_from_the_storage_initializers() -> None:
    assert models_readiness([]) is None
    no_init = {"metadata": {"name": "r", "labels": {}}, "spec": {"containers": []}}
    assert models_readiness([no_init]) is None
    fetching = pod("a", "fast", {"state": {"running": {}}})
    assert models([fetching, pod("b", "fast", None)]) == (
        "Unknown",
        "Fetching",
        "2 pod(s) fetching their models from storage",
    )
    done = pod("c", "fast", {"state": ended(0)})
    assert models([done])[:2] == ("True", "Fetched")


def test_a_checksum_mismatch_names_the_stage_uri_and_both_digests() -> None:
    # restartPolicy Never (a profiling pod): the initializer's last state.
    failed = pod("a", "fast", {"state": ended(1, MISMATCH)})
    # restartPolicy Always (a worker): waiting to restart after the failed run.
    crashing = pod(
        "b",
        "accurate",
        {
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": ended(
                1, "FetchFailed: stage accurate: cannot fetch s3://m/a.onnx: HTTP 404 Not Found"
            ),
        },
    )
    value, reason, message = models([failed, crashing])
    assert (value, reason) == ("False", "ChecksumMismatch")
    assert message == (
        "stage accurate: cannot fetch s3://m/a.onnx: HTTP 404 Not Found; "
        f"stage fast: checksum mismatch for {URI}: sha256 is {'a' * 64}, the spec says {'b' * 64}"
    )
    assert models([crashing])[:2] == ("False", "FetchFailed")
    # Pods failing the same way (a worker and the profiling pods) say it once.
    same = pod("e", "preprocess", {"state": ended(1, MISMATCH)})
    assert models([failed, same])[2] == message.split("; ")[1]
    # A crash with the log's tail as its message, and one with no message at all.
    tail = pod("c", "fast", {"state": ended(137, "Traceback ...\nMemoryError\n")})
    assert models([tail])[1:] == ("FetchFailed", "pod c: MemoryError")
    bare = pod("d", "fast", {"state": ended(2)})
    assert models([bare])[2] == "pod d: the storage initializer exited with 2"


def test_a_failed_fetch_makes_the_pipeline_not_ready_and_a_mismatch_failed() -> None:
    failed = [pod("a", "fast", {"state": ended(1, MISMATCH)})]
    status = with_conditions({}, [("Planned", "True", "Planned", "ok")], generation=3, now=T0)
    status = with_models(status, failed, now=T1)
    fetched, ready = cond(status, "ModelsReady"), cond(status, "Ready")
    assert (fetched["status"], fetched["reason"]) == ("False", "ChecksumMismatch")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ChecksumMismatch",
        fetched["message"],
    )
    assert status["phase"] == "Failed"
    # Deployments not ready: Ready keeps the models' reason, not "Waiting".
    waiting = with_readiness(status, [deployment("fast", "worker", 1, 0)], now=T2)
    assert cond(waiting, "Ready")["reason"] == "ChecksumMismatch"
    # A pipeline that serves stays Ready even when a new pod cannot fetch.
    serving = with_readiness(status, [deployment("fast", "worker", 2, 1)], now=T2)
    assert cond(with_models(serving, failed, now=T2), "Ready")["status"] == "True"
    # Fixed: the new pods fetched; no pod fetching leaves the condition as it was.
    fixed = with_models(status, [pod("b", "fast", {"state": ended(0)})], now=T2)
    assert cond(fixed, "ModelsReady")["status"] == "True"
    assert (cond(fixed, "Ready")["status"], cond(fixed, "Ready")["reason"]) == ("False", "Waiting")
    assert fixed["phase"] != "Failed"
    assert with_models(fixed, [], now=T2) == fixed
