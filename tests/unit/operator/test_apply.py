"""Apply's comparison: only rendered fields count, quantities compare by value, a removed
key is noticed, router and worker replicas belong to the tuner between plans, and a
field that cannot change in place replaces its object."""

from __future__ import annotations

import copy
from typing import Any

from sloline.operator.apply import apply, covers, must_replace, patch_for, with_applied_digest
from sloline.operator.kube import KubeApi
from sloline.operator.pods import render_router, render_worker
from sloline.operator.render import render_router_network
from sloline.operator.settings import OperatorSettings
from sloline.operator.tuner import DeploymentActuator
from tests.support.kube import KubeEmulator
from tests.unit.operator.helpers import gpu_settings, target


def live_copy(desired: dict[str, Any]) -> dict[str, Any]:
    """What the API server would return: defaults filled in, bookkeeping added."""
    live = copy.deepcopy(desired)
    live["metadata"].update(uid="u", resourceVersion="7", generation=1)
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    pod = live["spec"]["template"]["spec"]
    pod.update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    pod["securityContext"] = {**pod.get("securityContext", {}), "fsGroupChangePolicy": "Always"}
    for container in pod["containers"]:
        container["terminationMessagePath"] = "/dev/termination-log"
        for quantities in container.get("resources", {}).values():
            for name, value in quantities.items():
                if value.endswith("000m"):  # the API server's canonical form: 1000m -> 1
                    quantities[name] = value[: -len("000m")]
    live["status"] = {"replicas": 2, "readyReplicas": 2}
    return live


def worker(replicas: int = 2, settings: OperatorSettings | None = None, hw: str = "cpu-1") -> dict:
    return with_applied_digest(
        render_worker(target(), settings or OperatorSettings(), "s1", hw, replicas)
    )


def test_covers_ignores_defaults_and_compares_quantities() -> None:
    assert covers({"cpu": "1", "extra": 1}, {"cpu": "1000m"})
    assert not covers({"cpu": "2"}, {"cpu": "1000m"})
    assert covers({}, {"annotations": {}})
    assert not covers({"ports": [1, 2]}, {"ports": [1]})
    assert not covers({"replicas": True}, {"replicas": 1})
    assert not covers({"name": "worker"}, {"name": "workers"})


def test_unchanged_rendering_needs_no_patch() -> None:
    desired = worker()
    assert patch_for(desired, live_copy(desired)) == []


def test_tuner_replicas_are_kept_until_the_plan_changes() -> None:
    desired = worker(replicas=2)
    live = live_copy(desired)
    live["spec"]["replicas"] = 7  # the tuner scaled up
    assert patch_for(desired, live) == []
    replanned = worker(replicas=3)
    ops = patch_for(replanned, live)
    assert {"op": "add", "path": "/spec/replicas", "value": 3} in ops
    assert {
        "op": "add",
        "path": "/metadata/annotations/sloline.dev~1planned-replicas",
        "value": "3",
    } in ops


def test_drift_in_a_rendered_field_is_repaired() -> None:
    desired = worker()
    live = live_copy(desired)
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:1"
    ops = patch_for(desired, live)
    assert [op["path"] for op in ops if op["path"].startswith("/spec")] == ["/spec/template"]


def test_a_removed_key_is_noticed_through_the_applied_digest() -> None:
    with_selector = gpu_settings()
    data = with_selector.model_dump(by_alias=True)
    data["catalog"]["classes"][1]["kubernetes"]["nodeSelector"] = {}
    without = type(with_selector).model_validate(data)
    live = live_copy(worker(settings=with_selector, hw="gpu-l4"))
    desired = worker(settings=without, hw="gpu-l4")
    # Every rendered field is still in the live object: only the digest tells that the
    # live nodeSelector must go.
    without_digest = copy.deepcopy(desired)
    without_digest["metadata"]["annotations"].pop("sloline.dev/applied")
    assert covers(live, without_digest)
    template = next(op for op in patch_for(desired, live) if op["path"] == "/spec/template")
    assert "nodeSelector" not in template["value"]["spec"]


def router(replicas: int) -> dict[str, Any]:
    return with_applied_digest(render_router(target(), OperatorSettings(), {}, replicas))


def test_router_replicas_are_kept_until_the_rendered_count_changes() -> None:
    desired = router(2)
    live = live_copy(desired)
    live["spec"]["replicas"] = 3  # scaled between plans
    assert patch_for(desired, live) == []
    ops = patch_for(router(4), live)
    assert {"op": "add", "path": "/spec/replicas", "value": 4} in ops
    # A router Deployment of an older operator (one replica, no annotation) is resized.
    del live["metadata"]["annotations"]["sloline.dev/planned-replicas"]
    live["spec"]["replicas"] = 1
    assert {"op": "add", "path": "/spec/replicas", "value": 2} in patch_for(desired, live)


def test_a_service_turning_headless_is_replaced(kube: KubeEmulator) -> None:
    """The workers' Service of an older operator had a cluster IP, which the API server
    will not change in place: apply deletes it and creates the headless one."""
    t = target()
    clients, workers = render_router_network(t)[:2]
    assert not must_replace(
        clients, {**clients, "spec": {**clients["spec"], "clusterIP": "10.0.0.9"}}
    )
    old = copy.deepcopy(workers)
    old["spec"].pop("clusterIP")
    old["spec"]["clusterIP"] = "10.0.0.7"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": t.namespace}})
    kube.create(old)
    api = KubeApi.connect(str(kube.kubeconfig_path))
    report = apply(api, [workers, clients])
    live = kube.get("services", t.namespace, workers["metadata"]["name"])
    assert live["spec"]["clusterIP"] == "None"
    assert live["spec"]["publishNotReadyAddresses"] is True
    assert report.deleted == ["Service/noop-router-workers"]
    assert report.created == ["Service/noop-router-workers", "Service/noop-router"]
    assert apply(api, [workers, clients]).changed is False


def test_the_client_service_of_an_older_operator_stops_publishing_unready_routers() -> None:
    clients = with_applied_digest(render_router_network(target())[0])
    live = copy.deepcopy(clients)
    live["spec"].update(publishNotReadyAddresses=True, clusterIP="10.0.0.5")
    ops = patch_for(clients, live)
    assert {"op": "remove", "path": "/spec/publishNotReadyAddresses"} in ops
    assert not must_replace(clients, live)  # its cluster IP stays


async def test_the_tuners_actuator_reads_and_scales_the_router_deployment(
    kube: KubeEmulator,
) -> None:
    t = target()
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": t.namespace}})
    kube.create(render_router(t, OperatorSettings(), {}, 2))
    actuator = DeploymentActuator(KubeApi.connect(str(kube.kubeconfig_path)), t.namespace, t.name)
    assert (await actuator.routers())[0] == 2
    await actuator.scale_routers(4)
    assert kube.get("deployments", t.namespace, "noop-router")["spec"]["replicas"] == 4
    assert (await actuator.routers())[0] == 4
