"""One reconcile against the Kubernetes API emulator (tests/support/kube): with every
profile cached, it plans and deploys, decoding each profile message once and computing
the dataflow digest once."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from sloline.operator import planning
from sloline.operator import reconcile as reconcile_module
from sloline.operator.kube import KubeApi
from sloline.operator.naming import Target, profiles_name
from sloline.operator.planning import CacheEntry, dataflow_digest, profile_tasks
from sloline.operator.reconcile import OperatorContext, reconcile
from sloline.operator.settings import OperatorSettings
from sloline.planner import profile_message
from sloline.planner.profile import StageProfile
from sloline.planner.profile_message import ProfileMessage, encode_profile
from tests.support.kube import KubeEmulator
from tests.support.kube.monitoring import SERVICE_MONITOR_CRD
from tests.unit.operator.helpers import NOOP

ROOT = Path(__file__).resolve().parents[3]
# A minimal Gateway API HTTPRoute CRD: the emulator then serves the kind.
HTTP_ROUTE_CRD = copy.deepcopy(SERVICE_MONITOR_CRD)
HTTP_ROUTE_CRD["metadata"]["name"] = "httproutes.gateway.networking.k8s.io"
HTTP_ROUTE_CRD["spec"]["group"] = "gateway.networking.k8s.io"
HTTP_ROUTE_CRD["spec"]["names"] = {
    "kind": "HTTPRoute",
    "listKind": "HTTPRouteList",
    "plural": "httproutes",
    "singular": "httproute",
}
CRD = ROOT / "helm" / "sloline-crds" / "files" / "predictionpipelines.sloline.dev.yaml"


def cache_profiles(
    kube: KubeEmulator, body: dict[str, Any], settings: OperatorSettings
) -> dict[str, str]:
    """Fill `<p>-profiles` with a profile of every task, so a reconcile plans and deploys
    at once; the profile messages by cache key."""
    target = Target.of(body)
    dataflow = dataflow_digest(target, settings)
    messages = {
        task.key: encode_profile(
            task.stage, task.hardware, StageProfile.from_latencies(task.hardware, {1: 1e-3})
        )
        for task in profile_tasks(target, settings)
    }
    cache = {key: CacheEntry.of(text, dataflow).to_text() for key, text in messages.items()}
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": profiles_name(target.name), "namespace": target.namespace},
            "data": cache,
        }
    )
    return messages


def test_a_reconcile_decodes_each_profile_message_once(
    kube: KubeEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.register_crd(CRD)
    body = kube.create(yaml.safe_load(NOOP.read_text()) | {"metadata": {"name": "noop"}})
    settings = OperatorSettings()
    messages = cache_profiles(kube, body, settings)

    decoded: Counter[str] = Counter()
    digests: list[str] = []
    real_decode, real_digest = profile_message.decode_message, dataflow_digest

    def counting_decode(text: str) -> ProfileMessage:
        decoded[text] += 1
        return real_decode(text)

    def counting_digest(t: Target, s: OperatorSettings) -> str:
        digests.append(real_digest(t, s))
        return digests[-1]

    for module in (profile_message, planning, reconcile_module):
        if hasattr(module, "decode_message"):
            monkeypatch.setattr(module, "decode_message", counting_decode)
    monkeypatch.setattr(reconcile_module, "dataflow_digest", counting_digest)

    ctx = OperatorContext(KubeApi.connect(str(kube.kubeconfig_path)), settings)
    report = reconcile(ctx, body, lambda _type, _reason, _message: None)

    assert report.created  # planned and deployed
    assert decoded == Counter(messages.values())  # each message once
    assert digests == [dataflow_digest(Target.of(body), settings)]


def test_a_reconcile_creates_the_routes_the_cluster_serves_and_prunes_them(
    kube: KubeEmulator,
) -> None:
    """The emulator serves HTTPRoute (its CRD registered) but neither GRPCRoute nor
    Ingress: the HTTPRoute is created, owned by the pipeline; the others are reported in
    an event; with exposure gone from the spec the HTTPRoute is deleted."""
    kube.register_crd(CRD)
    kube.register_crd(HTTP_ROUTE_CRD)
    doc = yaml.safe_load(NOOP.read_text()) | {"metadata": {"name": "noop"}}
    doc["spec"]["exposure"] = {
        "httpRoute": {"parentRefs": [{"name": "public"}]},
        "grpcRoute": {"parentRefs": [{"name": "public"}]},
        "ingress": {},
    }
    body = kube.create(doc)
    settings = OperatorSettings()
    cache_profiles(kube, body, settings)
    events: list[tuple[str, str, str]] = []
    ctx = OperatorContext(KubeApi.connect(str(kube.kubeconfig_path)), settings)

    report = reconcile(ctx, body, lambda *event: events.append(event))

    assert "HTTPRoute/noop" in report.created
    route = kube.get("httproutes", "default", "noop")
    assert route["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    assert route["spec"]["rules"][0]["backendRefs"] == [{"name": "noop-router", "port": 8000}]
    assert (
        "Warning",
        "ExposureUnavailable",
        "the cluster does not serve GRPCRoute, Ingress: not created",
    ) in events

    body = kube.get("predictionpipelines", "default", "noop")
    body["spec"].pop("exposure")
    body = kube.replace(body)
    report = reconcile(ctx, body, lambda *_: None)
    assert "HTTPRoute/noop" in report.deleted
    assert kube.find("httproutes", "default", "noop") is None
