"""The Kubernetes API emulator (tests/support/kube) behaves as the API server does for what
the operator, its tests and kubectl rely on: over real HTTP on 127.0.0.1, with the real
kubectl binary, and with a kopf operator running under KopfRunner."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
import yaml

from tests.support.kube import ApiError, KubeEmulator
from tests.support.kube.patches import json_patch, strategic_merge_patch

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "helm" / "sloline-crds" / "files" / "predictionpipelines.sloline.dev.yaml"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
PIPELINES = "/apis/sloline.dev/v1alpha1/namespaces/default/predictionpipelines"


def configmap(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {}, **meta},
        "data": {"k": "v"},
    }


def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }


def pipeline(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "sloline.dev/v1alpha1",
        "kind": "PredictionPipeline",
        "metadata": {"name": name},
        "spec": {"slo": {"latencyMs": 50}},
    }


@pytest.fixture
def http(kube: KubeEmulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=kube.url, timeout=10) as client:
        yield client


def api(
    http: httpx.Client,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    **params: str,
) -> httpx.Response:
    return http.request(
        method,
        path,
        params=params,
        content=None if body is None else json.dumps(body),
        headers={"Content-Type": content_type},
    )


def ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body


def names(objects: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


@contextlib.contextmanager
def watching(http: httpx.Client, path: str, **params: str) -> Iterator[Iterator[dict[str, Any]]]:
    """The events of a watch request; reading fails if none arrives within 5 s."""
    with http.stream("GET", path, params={"watch": "true", **params}, timeout=5) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("application/json")
        yield (json.loads(line) for line in response.iter_lines() if line)


def seen(event: dict[str, Any]) -> tuple[str, str]:
    return event["type"], event["object"]["metadata"]["name"]


# -- object bookkeeping ---------------------------------------------------------------------


def test_create_sets_identity_and_a_global_resource_version(http: httpx.Client) -> None:
    first = ok(api(http, "POST", CONFIGMAPS, configmap("a")), 201)
    second = ok(api(http, "POST", DEPLOYMENTS, deployment("web")), 201)
    meta = first["metadata"]
    assert {"uid", "creationTimestamp", "resourceVersion"} <= meta.keys()
    assert meta["generation"] == 1 and meta["namespace"] == "default"
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert second["metadata"]["uid"] != meta["uid"]
    assert (second["kind"], second["apiVersion"]) == ("Deployment", "apps/v1")
    assert second["spec"]["replicas"] == 1
    assert ok(api(http, "GET", f"{CONFIGMAPS}/a")) == first


def test_generation_counts_spec_changes_only(http: httpx.Client) -> None:
    created = ok(api(http, "POST", DEPLOYMENTS, deployment("web")), 201)
    merge = "application/merge-patch+json"
    labelled = ok(
        api(
            http,
            "PATCH",
            f"{DEPLOYMENTS}/web",
            {"metadata": {"labels": {"x": "1"}}},
            content_type=merge,
        )
    )
    status = ok(
        api(
            http,
            "PATCH",
            f"{DEPLOYMENTS}/web/status",
            {"status": {"replicas": 1}},
            content_type=merge,
        )
    )
    scaled = ok(
        api(http, "PATCH", f"{DEPLOYMENTS}/web", {"spec": {"replicas": 2}}, content_type=merge)
    )
    again = ok(
        api(http, "PATCH", f"{DEPLOYMENTS}/web", {"spec": {"replicas": 2}}, content_type=merge)
    )
    generations = [o["metadata"]["generation"] for o in (created, labelled, status, scaled)]
    versions = [int(o["metadata"]["resourceVersion"]) for o in (created, labelled, status, scaled)]
    assert generations == [1, 1, 1, 2]
    assert versions == sorted(set(versions))
    assert again == scaled  # a no-op patch changes nothing, not even the resourceVersion


def test_status_subresource_is_isolated(http: httpx.Client) -> None:
    body = {**deployment("web"), "status": {"replicas": 7}}
    created = ok(api(http, "POST", DEPLOYMENTS, body), 201)
    assert "status" not in created
    replaced = ok(
        api(
            http,
            "PUT",
            f"{DEPLOYMENTS}/web",
            {**created, "spec": {**created["spec"], "replicas": 3}, "status": {"replicas": 9}},
        )
    )
    assert replaced["spec"]["replicas"] == 3 and "status" not in replaced
    status = ok(
        api(
            http,
            "PUT",
            f"{DEPLOYMENTS}/web/status",
            {**replaced, "spec": {**replaced["spec"], "replicas": 1}, "status": {"replicas": 3}},
        )
    )
    assert status["spec"]["replicas"] == 3 and status["status"] == {"replicas": 3}
    assert status["metadata"]["generation"] == 2
    stale = api(http, "PUT", f"{DEPLOYMENTS}/web/status", {**replaced, "status": {}})
    assert stale.status_code == 409  # the resourceVersion precondition holds for status too
    # ConfigMaps have no status subresource: writes keep what they are given.
    cm = ok(api(http, "POST", CONFIGMAPS, {**configmap("c"), "status": {"x": 1}}), 201)
    assert cm["status"] == {"x": 1}
    assert api(http, "PUT", f"{CONFIGMAPS}/c/status", cm).status_code == 404


def test_errors_are_status_objects_with_the_api_codes(http: httpx.Client) -> None:
    created = ok(api(http, "POST", CONFIGMAPS, configmap("a")), 201)
    missing = api(http, "GET", f"{CONFIGMAPS}/nope")
    assert missing.status_code == 404
    assert missing.json() == {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": 404,
        "reason": "NotFound",
        "message": 'configmaps "nope" not found',
        "details": {"name": "nope", "group": "", "kind": "configmaps"},
    }
    duplicate = api(http, "POST", CONFIGMAPS, configmap("a"))
    assert (duplicate.status_code, duplicate.json()["reason"]) == (409, "AlreadyExists")

    stale = {**created, "data": {"k": "stale"}}
    ok(api(http, "PUT", f"{CONFIGMAPS}/a", {**created, "data": {"k": "fresh"}}))
    conflict = api(http, "PUT", f"{CONFIGMAPS}/a", stale)
    assert (conflict.status_code, conflict.json()["reason"]) == (409, "Conflict")
    conflict = api(
        http,
        "PATCH",
        f"{CONFIGMAPS}/a",
        {
            "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
            "data": {"k": "stale"},
        },
        content_type="application/merge-patch+json",
    )
    assert conflict.status_code == 409
    assert ok(api(http, "GET", f"{CONFIGMAPS}/a"))["data"] == {"k": "fresh"}

    failed_test = api(
        http,
        "PATCH",
        f"{CONFIGMAPS}/a",
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "replace", "path": "/data/k", "value": "no"},
        ],
        content_type="application/json-patch+json",
    )
    assert (failed_test.status_code, failed_test.json()["reason"]) == (422, "Invalid")
    assert api(http, "GET", "/apis/apps/v1/namespaces/default/nothings").status_code == 404


def test_put_replaces_the_object(http: httpx.Client) -> None:
    created = ok(api(http, "POST", CONFIGMAPS, configmap("a", labels={"x": "1"})), 201)
    replaced = ok(
        api(
            http,
            "PUT",
            f"{CONFIGMAPS}/a",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "a"},
                "data": {"n": "1"},
            },
        )
    )
    assert replaced["data"] == {"n": "1"} and "labels" not in replaced["metadata"]
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    assert replaced["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]
    assert api(http, "PUT", f"{CONFIGMAPS}/b", configmap("b")).status_code == 404


# -- patches --------------------------------------------------------------------------------


def test_merge_json_and_strategic_patches(http: httpx.Client) -> None:
    ok(api(http, "POST", DEPLOYMENTS, deployment("web")), 201)
    merged = ok(
        api(
            http,
            "PATCH",
            f"{DEPLOYMENTS}/web",
            {"metadata": {"labels": {"a": "1"}}, "spec": {"selector": None}},
            content_type="application/merge-patch+json",
        )
    )
    assert merged["metadata"]["labels"] == {"a": "1"} and "selector" not in merged["spec"]
    patched = ok(
        api(
            http,
            "PATCH",
            f"{DEPLOYMENTS}/web",
            [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": merged["metadata"]["resourceVersion"],
                },
                {"op": "add", "path": "/metadata/finalizers", "value": []},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/x"},
                {"op": "move", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
            ],
            content_type="application/json-patch+json",
        )
    )
    assert patched["metadata"]["finalizers"] == ["example.com/x"]
    assert patched["metadata"]["labels"] == {"b": "1"}
    smp = ok(
        api(
            http,
            "PATCH",
            f"{DEPLOYMENTS}/web",
            {
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "side", "image": "nginx"},
                                {"name": "main", "image": "v2"},
                            ]
                        }
                    }
                }
            },
            content_type="application/strategic-merge-patch+json",
        )
    )
    containers = smp["spec"]["template"]["spec"]["containers"]
    assert containers == [{"name": "main", "image": "v2"}, {"name": "side", "image": "nginx"}]

    ok(
        api(
            http,
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            yaml.safe_load(CRD_FILE.read_text()),
        ),
        201,
    )
    ok(api(http, "POST", PIPELINES, pipeline("p")), 201)
    unsupported = api(
        http,
        "PATCH",
        f"{PIPELINES}/p",
        {"spec": {}},
        content_type="application/strategic-merge-patch+json",
    )
    assert unsupported.status_code == 415  # as on a cluster: no SMP for custom resources


def test_strategic_merge_patch_directives() -> None:
    pod = {
        "containers": [{"name": "a", "env": [{"name": "X", "value": "1"}]}, {"name": "b"}],
        "finalizers": ["f1"],
        "ports": [{"containerPort": 80, "name": "http"}],
    }
    patch = {
        "containers": [
            {"name": "b", "$patch": "delete"},
            {"name": "a", "env": [{"name": "Y", "value": "2"}]},
        ],
        "$setElementOrder/containers": [{"name": "a"}],
        "finalizers": ["f2"],
        "ports": [{"containerPort": 80, "protocol": "TCP"}],
        "$deleteFromPrimitiveList/finalizers": ["f1"],
    }
    assert strategic_merge_patch(pod, patch) == {
        "containers": [
            {"name": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}
        ],
        "finalizers": ["f2"],
        "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}],
    }
    assert strategic_merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"$patch": "replace", "d": 3}}) == {
        "a": {"d": 3}
    }


def test_json_patch_operations() -> None:
    doc = {"a": [1, 2], "b": {"c~d": 1, "e/f": 2}}
    assert json_patch(
        doc,
        [
            {"op": "copy", "from": "/a/0", "path": "/a/-"},
            {"op": "remove", "path": "/b/c~0d"},
            {"op": "replace", "path": "/b/e~1f", "value": 3},
            {"op": "test", "path": "/a", "value": [1, 2, 1]},
        ],
    ) == {"a": [1, 2, 1], "b": {"e/f": 3}}
    assert doc == {"a": [1, 2], "b": {"c~d": 1, "e/f": 2}}  # the input stays as it was


# -- finalizers and deletion ----------------------------------------------------------------


def test_finalizers_hold_a_deleted_object_until_removed(http: httpx.Client) -> None:
    created = ok(api(http, "POST", CONFIGMAPS, configmap("a", finalizers=["example.com/f"])), 201)
    deleting = ok(api(http, "DELETE", f"{CONFIGMAPS}/a"))
    assert deleting["metadata"]["deletionTimestamp"]
    assert ok(api(http, "GET", f"{CONFIGMAPS}/a"))["metadata"]["finalizers"] == ["example.com/f"]
    more = api(
        http,
        "PATCH",
        f"{CONFIGMAPS}/a",
        {"metadata": {"finalizers": ["f", "g"]}},
        content_type="application/merge-patch+json",
    )
    assert more.status_code == 422  # no new finalizers on an object being deleted
    ok(
        api(
            http,
            "PATCH",
            f"{CONFIGMAPS}/a",
            [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": deleting["metadata"]["resourceVersion"],
                },
                {"op": "remove", "path": "/metadata/finalizers/0"},
            ],
            content_type="application/json-patch+json",
        )
    )
    assert api(http, "GET", f"{CONFIGMAPS}/a").status_code == 404
    with watching(http, CONFIGMAPS, resourceVersion=created["metadata"]["resourceVersion"]) as ev:
        events = [next(ev), next(ev)]
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[0]["object"]["metadata"]["deletionTimestamp"]
    assert "finalizers" not in events[1]["object"]["metadata"]


def test_garbage_collection_follows_owner_references(
    kube: KubeEmulator, http: httpx.Client
) -> None:
    def owned(name: str, *owners: dict[str, Any], **meta: Any) -> dict[str, Any]:
        refs = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": o["metadata"]["name"],
                "uid": o["metadata"]["uid"],
                "controller": False,
            }
            for o in owners
        ]
        return ok(api(http, "POST", CONFIGMAPS, configmap(name, ownerReferences=refs, **meta)), 201)

    root, other = owned("root"), owned("other")
    child = owned("child", root)
    owned("grandchild", child)
    owned("shared", root, other)
    owned("held", root, finalizers=["example.com/f"])
    orphan_owner = owned("orphan-owner")
    owned("orphan", orphan_owner)
    ok(api(http, "DELETE", f"{CONFIGMAPS}/root"))
    assert names(kube.list("configmaps", "default")) == [
        "held",
        "orphan",
        "orphan-owner",
        "other",
        "shared",
    ]
    assert kube.get("configmaps", "default", "held")["metadata"]["deletionTimestamp"]
    kube.delete("configmaps", "default", "other")
    assert kube.find("configmaps", "default", "shared") is None
    ok(api(http, "DELETE", f"{CONFIGMAPS}/orphan-owner", {"propagationPolicy": "Orphan"}))
    assert kube.find("configmaps", "default", "orphan") is not None


# -- selectors, list and watch --------------------------------------------------------------


def test_label_and_field_selectors_filter_lists(http: httpx.Client) -> None:
    for name, labels in [
        ("a", {"app": "x", "tier": "web"}),
        ("b", {"app": "y"}),
        ("c", {"tier": "db"}),
        ("d", {}),
    ]:
        ok(api(http, "POST", CONFIGMAPS, configmap(name, labels)), 201)

    def selected(**params: str) -> list[str]:
        body = ok(api(http, "GET", CONFIGMAPS, **params))
        assert body["kind"] == "ConfigMapList" and body["metadata"]["resourceVersion"]
        return names(body["items"])

    assert selected(labelSelector="app=x") == ["a"]
    assert selected(labelSelector="app==x,tier=web") == ["a"]
    assert selected(labelSelector="app!=x") == ["b", "c", "d"]
    assert selected(labelSelector="app in (x, y)") == ["a", "b"]
    assert selected(labelSelector="app notin (x)") == ["b", "c", "d"]
    assert selected(labelSelector="tier") == ["a", "c"]
    assert selected(labelSelector="!tier") == ["b", "d"]
    assert selected(fieldSelector="metadata.name=c") == ["c"]
    assert selected(fieldSelector="metadata.name!=c", labelSelector="!app") == ["d"]
    assert api(http, "GET", CONFIGMAPS, labelSelector="app in x").status_code == 400


def test_watch_from_a_resource_version_gets_exactly_the_later_events(http: httpx.Client) -> None:
    first = ok(api(http, "POST", CONFIGMAPS, configmap("a")), 201)
    ok(api(http, "POST", CONFIGMAPS, configmap("b")), 201)
    ok(
        api(
            http,
            "PATCH",
            f"{CONFIGMAPS}/b",
            {"data": {"k": "2"}},
            content_type="application/merge-patch+json",
        )
    )
    ok(api(http, "DELETE", f"{CONFIGMAPS}/a"))
    with watching(http, CONFIGMAPS, resourceVersion=first["metadata"]["resourceVersion"]) as ev:
        assert [seen(next(ev)) for _ in range(3)] == [
            ("ADDED", "b"),
            ("MODIFIED", "b"),
            ("DELETED", "a"),
        ]
        ok(api(http, "POST", CONFIGMAPS, configmap("c")), 201)
        assert seen(next(ev)) == ("ADDED", "c")  # live, with nothing replayed in between


def test_watch_without_a_resource_version_starts_from_the_current_state(
    http: httpx.Client,
) -> None:
    ok(api(http, "POST", CONFIGMAPS, configmap("a")), 201)
    ok(api(http, "POST", "/api/v1/namespaces", {"metadata": {"name": "other"}}), 201)
    ok(api(http, "POST", "/api/v1/namespaces/other/configmaps", configmap("b")), 201)
    with watching(http, CONFIGMAPS) as ev:
        assert seen(next(ev)) == ("ADDED", "a")  # the state of now, not the history
        ok(api(http, "DELETE", f"{CONFIGMAPS}/a"))
        assert seen(next(ev)) == ("DELETED", "a")
    with watching(http, "/api/v1/configmaps", sendInitialEvents="true") as ev:
        assert [seen(next(ev)) for _ in range(1)] == [("ADDED", "b")]
        bookmark = next(ev)
        assert bookmark["type"] == "BOOKMARK"
        assert bookmark["object"]["metadata"]["annotations"] == {
            "k8s.io/initial-events-end": "true"
        }


def test_watch_loses_nothing_under_concurrent_writes(
    kube: KubeEmulator, http: httpx.Client
) -> None:
    start = ok(api(http, "POST", CONFIGMAPS, configmap("a")), 201)["metadata"]["resourceVersion"]

    def write() -> None:
        with httpx.Client(base_url=kube.url, timeout=10) as client:
            for i in range(60):
                client.patch(
                    f"{CONFIGMAPS}/a",
                    json={"data": {"k": str(i)}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )

    with watching(http, CONFIGMAPS, resourceVersion=start) as ev:
        writer = threading.Thread(target=write)
        writer.start()
        events = [next(ev) for _ in range(60)]
        writer.join()
    assert [e["object"]["data"]["k"] for e in events] == [str(i) for i in range(60)]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(set(versions))


def test_watch_follows_selectors_and_ends_after_its_timeout(http: httpx.Client) -> None:
    ok(api(http, "POST", CONFIGMAPS, configmap("a")), 201)
    merge = "application/merge-patch+json"
    with watching(http, CONFIGMAPS, labelSelector="app=x", resourceVersion="1") as ev:
        ok(
            api(
                http,
                "PATCH",
                f"{CONFIGMAPS}/a",
                {"metadata": {"labels": {"app": "x"}}},
                content_type=merge,
            )
        )
        assert seen(next(ev)) == ("ADDED", "a")  # it starts matching
        ok(
            api(
                http,
                "PATCH",
                f"{CONFIGMAPS}/a",
                {"metadata": {"labels": {"app": "y"}}},
                content_type=merge,
            )
        )
        assert seen(next(ev)) == ("DELETED", "a")  # it stops matching
    started = time.monotonic()
    with watching(http, CONFIGMAPS, fieldSelector="metadata.name=b", timeoutSeconds="1") as ev:
        ok(api(http, "POST", CONFIGMAPS, configmap("c")), 201)
        ok(api(http, "POST", CONFIGMAPS, configmap("b")), 201)
        assert [seen(e) for e in ev] == [("ADDED", "b")]  # then the server ends the stream
    # Not before timeoutSeconds; a server that ignored it would fail the 5 s read timeout.
    assert time.monotonic() - started > 0.9


# -- subresources, scopes, namespaces and discovery ------------------------------------------


def test_scale_subresource_of_deployments(kube: KubeEmulator, http: httpx.Client) -> None:
    ok(api(http, "POST", DEPLOYMENTS, deployment("web", replicas=2)), 201)
    scale = ok(api(http, "GET", f"{DEPLOYMENTS}/web/scale"))
    assert (scale["apiVersion"], scale["kind"]) == ("autoscaling/v1", "Scale")
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"] == {"replicas": 0, "selector": "app=web"}
    patched = ok(
        api(
            http,
            "PATCH",
            f"{DEPLOYMENTS}/web/scale",
            {"spec": {"replicas": 5}},
            content_type="application/merge-patch+json",
        )
    )
    assert patched["spec"]["replicas"] == 5
    web = kube.get("deploy", "default", "web")
    assert (web["spec"]["replicas"], web["metadata"]["generation"]) == (5, 2)
    assert api(http, "PUT", f"{DEPLOYMENTS}/web/scale", scale).status_code == 409  # stale
    put = ok(api(http, "PUT", f"{DEPLOYMENTS}/web/scale", {**patched, "spec": {"replicas": 1}}))
    assert put["spec"]["replicas"] == 1
    assert api(http, "GET", f"{CONFIGMAPS}/web/scale").status_code == 404


def test_namespaces_and_scopes(kube: KubeEmulator, http: httpx.Client) -> None:
    assert names(ok(api(http, "GET", "/api/v1/namespaces"))["items"]) == [
        "default",
        "kube-public",
        "kube-system",
    ]
    team = ok(
        api(
            http,
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}},
        ),
        201,
    )
    assert team["status"] == {"phase": "Active"}
    assert (
        ok(api(http, "GET", "/api/v1/namespaces/team"))["metadata"]["uid"]
        == (team["metadata"]["uid"])
    )
    assert (
        api(http, "POST", "/api/v1/namespaces/nowhere/configmaps", configmap("a")).status_code
        == 404
    )
    ok(api(http, "POST", "/api/v1/namespaces/team/configmaps", configmap("a")), 201)
    ok(api(http, "POST", CONFIGMAPS, configmap("b")), 201)
    assert names(ok(api(http, "GET", "/api/v1/configmaps"))["items"]) == ["b", "a"]
    role = ok(
        api(
            http,
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "r", "namespace": "ignored"},
                "rules": [],
            },
        ),
        201,
    )
    assert "namespace" not in role["metadata"]
    assert (
        api(
            http, "GET", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/clusterroles/r"
        ).status_code
        == 404
    )
    ok(api(http, "DELETE", "/api/v1/namespaces/team"))
    assert names(kube.list("configmaps")) == ["b"]


def test_discovery_lists_core_groups_and_registered_crds(http: httpx.Client) -> None:
    assert ok(api(http, "GET", "/api"))["versions"] == ["v1"]
    core = ok(api(http, "GET", "/api/v1"))
    assert core["groupVersion"] == "v1"
    core_names = {r["name"] for r in core["resources"]}
    assert {
        "namespaces",
        "pods",
        "services",
        "configmaps",
        "events",
        "secrets",
        "serviceaccounts",
        "endpoints",
        "pods/status",
    } <= core_names
    groups = {
        g["name"]: g["preferredVersion"]["groupVersion"]
        for g in ok(api(http, "GET", "/apis"))["groups"]
    }
    assert {
        "apps": "apps/v1",
        "batch": "batch/v1",
        "coordination.k8s.io": "coordination.k8s.io/v1",
        "events.k8s.io": "events.k8s.io/v1",
        "apiextensions.k8s.io": "apiextensions.k8s.io/v1",
        "rbac.authorization.k8s.io": "rbac.authorization.k8s.io/v1",
    }.items() <= groups.items()
    apps = {r["name"]: r for r in ok(api(http, "GET", "/apis/apps/v1"))["resources"]}
    assert apps["deployments"]["namespaced"] and "list" in apps["deployments"]["verbs"]
    assert apps["deployments/scale"]["kind"] == "Scale"
    assert "deployments/status" in apps
    assert "jobs/status" in {r["name"] for r in ok(api(http, "GET", "/apis/batch/v1"))["resources"]}
    rbac = {
        r["name"]: r["namespaced"]
        for r in ok(api(http, "GET", "/apis/rbac.authorization.k8s.io/v1"))["resources"]
    }
    assert rbac == {
        "roles": True,
        "rolebindings": True,
        "clusterroles": False,
        "clusterrolebindings": False,
    }
    assert api(http, "GET", "/apis/sloline.dev/v1alpha1").status_code == 404

    crd = ok(
        api(
            http,
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            yaml.safe_load(CRD_FILE.read_text()),
        ),
        201,
    )
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
    assert "sloline.dev" in {g["name"] for g in ok(api(http, "GET", "/apis"))["groups"]}
    served = ok(api(http, "GET", "/apis/sloline.dev/v1alpha1"))["resources"]
    assert {(r["name"], r["kind"]) for r in served} == {
        ("predictionpipelines", "PredictionPipeline"),
        ("predictionpipelines/status", "PredictionPipeline"),
    }
    ok(api(http, "POST", PIPELINES, pipeline("p")), 201)
    ok(
        api(
            http,
            "DELETE",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
            "predictionpipelines.sloline.dev",
        )
    )
    assert api(http, "GET", "/apis/sloline.dev/v1alpha1").status_code == 404
    assert api(http, "GET", f"{PIPELINES}/p").status_code == 404


def test_table_requests_get_plain_json(http: httpx.Client) -> None:
    ok(api(http, "POST", CONFIGMAPS, configmap("a")), 201)
    accept = (
        "application/json;as=Table;v=v1;g=meta.k8s.io,"
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
    )
    response = http.get(CONFIGMAPS, headers={"Accept": accept})
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json()["kind"] == "ConfigMapList"


def test_faults_can_be_injected_with_kmock_reactions(
    kube: KubeEmulator, http: httpx.Client
) -> None:
    kube.server["patch", kmock.resource("apps/v1/deployments")] << 503
    ok(api(http, "POST", DEPLOYMENTS, deployment("web")), 201)
    assert (
        api(
            http, "PATCH", f"{DEPLOYMENTS}/web", {}, content_type="application/merge-patch+json"
        ).status_code
        == 503
    )


# -- the blocking test API and the clients --------------------------------------------------


def test_blocking_api(kube: KubeEmulator) -> None:
    kube.create(configmap("a", labels={"app": "x"}))
    kube.load(
        "---\n" + yaml.safe_dump(configmap("b")) + "---\n" + yaml.safe_dump(deployment("web"))
    )
    assert names(kube.list("cm", "default", labels="app=x")) == ["a"]
    assert (
        kube.patch(
            "deployments.apps",
            "default",
            "web",
            [{"op": "replace", "path": "/spec/replicas", "value": 4}],
            patch_type="json",
        )["metadata"]["generation"]
        == 2
    )
    kube.patch(
        "Deployment", "default", "web", {"status": {"readyReplicas": 4}}, subresource="status"
    )
    assert kube.wait_for(
        "deploy", "default", "web", lambda d: d.get("status", {}).get("readyReplicas") == 4
    )
    with pytest.raises(ApiError) as error:
        kube.get("configmaps", "default", "nope")
    assert (error.value.status, error.value.reason) == (404, "NotFound")
    with pytest.raises(LookupError, match="register its CRD"):
        kube.list("predictionpipelines")
    kube.delete("configmaps", "default", "a")
    assert [v is None for v in kube.history("configmaps", "default", "a")] == [False, True]


def test_the_kubernetes_client_talks_to_the_emulator(kube: KubeEmulator) -> None:
    import kubernetes

    core = kubernetes.client.CoreV1Api(kube.api_client())
    core.create_namespaced_config_map("default", configmap("a"))
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["a"]
    with pytest.raises(kubernetes.client.ApiException) as error:
        core.read_namespaced_config_map("nope", "default")
    assert error.value.status == 404
    with kube.as_default():
        default = kubernetes.client.CoreV1Api()
        assert default.read_namespace("default").status.phase == "Active"


def test_kubectl_applies_a_crd_and_its_custom_resources(kube: KubeEmulator) -> None:
    kube.kubectl("apply", "-f", str(CRD_FILE))
    kube.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=10s",
        "crd/predictionpipelines.sloline.dev",
    )
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(pipeline("p")))
    listed = json.loads(kube.kubectl("get", "predictionpipelines", "-o", "json").stdout)
    assert names(listed["items"]) == ["p"]
    short_names = yaml.safe_load(CRD_FILE.read_text())["spec"]["names"].get("shortNames", [])
    if "slp" in short_names:
        assert kube.kubectl("get", "slp", "-o", "name").stdout.split() == [
            "predictionpipeline.sloline.dev/p"
        ]

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            kube.kubectl,
            "wait",
            "--for=jsonpath={.status.phase}=Ready",
            "--timeout=10s",
            "predictionpipelines/p",
        )
        deadline = time.monotonic() + 10
        while not any(r.action == kmock.action.WATCH for r in list(kube.server)):
            assert time.monotonic() < deadline, "kubectl wait never watched"
            time.sleep(0.02)
        kube.patch(
            "predictionpipelines",
            "default",
            "p",
            {"status": {"phase": "Ready"}},
            subresource="status",
        )
        assert "condition met" in waiting.result(timeout=15).stdout
    kube.kubectl("delete", "predictionpipelines", "p")
    assert kube.find("predictionpipelines", "default", "p") is None


def test_kubectl_manages_deployments(kube: KubeEmulator) -> None:
    manifest = deployment("web")
    manifest["spec"]["template"]["spec"]["containers"].append({"name": "side", "image": "x"})
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    manifest["spec"]["template"]["spec"]["containers"][:] = [{"name": "main", "image": "v2"}]
    assert "configured" in kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest)).stdout
    got = json.loads(kube.kubectl("get", "deploy", "-o", "json").stdout)["items"]
    assert got[0]["spec"]["template"]["spec"]["containers"] == [{"name": "main", "image": "v2"}]
    kube.kubectl("scale", "deploy", "web", "--replicas=3")
    assert kube.get("deployments", "default", "web")["spec"]["replicas"] == 3
    kube.kubectl("wait", "--for=jsonpath={.spec.replicas}=3", "--timeout=10s", "deploy/web")
    assert "web" in kube.kubectl("get", "deployments").stdout  # the non-Table fallback
    kube.kubectl("delete", "deploy", "web")
    assert kube.find("deployments", "default", "web") is None
    assert kube.kubectl("get", "ns", "-o", "name").stdout.split() == [
        "namespace/default",
        "namespace/kube-public",
        "namespace/kube-system",
    ]


# -- kopf -----------------------------------------------------------------------------------

OPERATOR = """
import kopf
import kubernetes

@kopf.on.create("sloline.dev", "v1alpha1", "predictionpipelines")
def create(body, name, namespace, patch, **_):
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"},
             "data": {"pipeline": name}}
    kopf.adopt(child)
    kubernetes.client.CoreV1Api().create_namespaced_config_map(namespace, child)
    patch.status["phase"] = "Ready"
    kopf.info(body, reason="Created", message="the config map is created")

@kopf.on.delete("sloline.dev", "v1alpha1", "predictionpipelines")
def delete(name, **_):
    pass  # its presence makes kopf put a finalizer on every pipeline
"""


def test_a_kopf_operator_runs_against_the_emulator(kube: KubeEmulator, tmp_path: Path) -> None:
    from kopf.testing import KopfRunner

    operator = tmp_path / "operator.py"
    operator.write_text(OPERATOR)
    kube.register_crd(CRD_FILE)
    with kube.as_default(), KopfRunner(["run", "-A", "--standalone", str(operator)]) as runner:
        kube.create(pipeline("p"))
        config = kube.wait_for("configmaps", "default", "p-config")
        ready = kube.wait_for(
            "predictionpipelines",
            "default",
            "p",
            lambda p: p.get("status", {}).get("phase") == "Ready",
        )
        assert config["metadata"]["ownerReferences"][0]["uid"] == ready["metadata"]["uid"]
        assert ready["metadata"]["finalizers"]
        deadline = time.monotonic() + 10
        while not kube.list("events", "default", fields="involvedObject.name=p"):
            assert time.monotonic() < deadline, "kopf posted no event"
            time.sleep(0.02)
        kube.delete("predictionpipelines", "default", "p")
        kube.wait_gone("predictionpipelines", "default", "p")  # kopf released its finalizer
        assert kube.find("configmaps", "default", "p-config") is None  # collected
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None
