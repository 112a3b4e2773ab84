"""Exposure: the Ingress (checked against Kubernetes' schema) and the Gateway API routes
(checked against the structure of the Gateway API v1 CRDs, which Kubernetes does not
build in) the operator renders from spec.exposure and its settings, owned by the pipeline
and pointing at the router's Service ports."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest

from sloline.operator.exposure import render_exposure
from sloline.operator.naming import Target
from sloline.operator.planning import operator_issues
from sloline.operator.render import render_router_network
from sloline.operator.settings import OperatorSettings, parse_settings
from sloline.spec import PipelineError
from tests.unit.operator.helpers import pipeline_object

GATEWAY = [{"name": "public", "namespace": "gateways", "sectionName": "https"}]
SETTINGS = {
    "exposure": {
        "host": "{name}.{namespace}.ml.example.com",
        "ingressClassName": "nginx",
        "ingressAnnotations": {"nginx.ingress.kubernetes.io/proxy-body-size": "64m"},
        "parentRefs": GATEWAY,
    }
}
# Gateway API v1 (standard channel): the fields and limits of HTTPRoute and GRPCRoute
# that the rendered routes use.
HOSTNAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PARENT_REF_KEYS = {"group", "kind", "namespace", "name", "sectionName", "port"}
BACKEND_REF_KEYS = {"group", "kind", "name", "namespace", "port", "weight", "filters"}
HTTP_RULE_KEYS = {
    "name",
    "matches",
    "filters",
    "backendRefs",
    "timeouts",
    "retry",
    "sessionPersistence",
}
GRPC_RULE_KEYS = {"name", "matches", "filters", "backendRefs", "sessionPersistence"}


def check_route(route: dict[str, Any]) -> None:
    """What the Gateway API CRDs' schemas require of the routes the operator renders."""
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert set(route) == {"apiVersion", "kind", "metadata", "spec"}
    spec = route["spec"]
    assert set(spec) <= {"parentRefs", "hostnames", "rules"}
    assert 1 <= len(spec["parentRefs"]) <= 32
    for ref in spec["parentRefs"]:
        assert set(ref) <= PARENT_REF_KEYS and ref["name"]
    assert len(spec.get("hostnames", [])) <= 16
    for host in spec.get("hostnames", []):
        assert len(host) <= 253 and HOSTNAME.match(host), host
    assert 1 <= len(spec["rules"]) <= 16
    keys = HTTP_RULE_KEYS if route["kind"] == "HTTPRoute" else GRPC_RULE_KEYS
    for rule in spec["rules"]:
        assert set(rule) <= keys
        for match in rule.get("matches", []):
            assert match["path"]["type"] in {"Exact", "PathPrefix", "RegularExpression"}
            assert match["path"]["value"].startswith("/")
        for ref in rule["backendRefs"]:
            assert set(ref) <= BACKEND_REF_KEYS
            assert isinstance(ref["port"], int) and 1 <= ref["port"] <= 65535


def exposed(spec: dict[str, Any] | None, settings: OperatorSettings) -> dict[str, Any]:
    doc = pipeline_object()
    if spec is not None:
        doc["spec"]["exposure"] = spec
    t = Target.of(doc)
    objects = render_exposure(t, settings)
    for obj in objects:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == t.uid
        assert obj["metadata"]["namespace"] == "team-a"
        assert obj["metadata"]["labels"]["sloline.dev/pipeline"] == "noop"
        if obj["kind"] == "Ingress":
            kubernetes_validate.validate(obj, "1.37", strict=True)
        else:
            check_route(obj)
    return {o["kind"]: o for o in objects}


def test_nothing_is_exposed_unless_asked() -> None:
    assert exposed(None, OperatorSettings()) == {}
    assert exposed(None, parse_settings(SETTINGS)) == {}


def test_every_kind_from_the_spec_with_the_settings_defaults() -> None:
    settings = parse_settings(SETTINGS)
    objects = exposed({"ingress": {}, "httpRoute": {}, "grpcRoute": {}}, settings)
    assert sorted(objects) == ["GRPCRoute", "HTTPRoute", "Ingress"]
    service = render_router_network(Target.of(pipeline_object()))[0]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    host = "noop.team-a.ml.example.com"
    ingress = objects["Ingress"]
    assert ingress["metadata"]["name"] == "noop"
    assert ingress["metadata"]["annotations"] == SETTINGS["exposure"]["ingressAnnotations"]
    assert ingress["spec"] == {
        "ingressClassName": "nginx",
        "rules": [
            {
                "host": host,
                "http": {
                    "paths": [
                        {
                            "path": "/",
                            "pathType": "Prefix",
                            "backend": {
                                "service": {
                                    "name": service["metadata"]["name"],
                                    "port": {"name": "http"},
                                }
                            },
                        }
                    ]
                },
            }
        ],
    }
    http, grpc = objects["HTTPRoute"]["spec"], objects["GRPCRoute"]["spec"]
    for spec in (http, grpc):
        assert spec["parentRefs"] == GATEWAY
        assert spec["hostnames"] == [host]
    assert http["rules"][0]["backendRefs"] == [
        {"name": service["metadata"]["name"], "port": ports["http"]}
    ]
    assert grpc["rules"] == [
        {"backendRefs": [{"name": service["metadata"]["name"], "port": ports["grpc"]}]}
    ]


def test_the_spec_overrides_the_settings() -> None:
    objects = exposed(
        {
            "ingress": {
                "ingressClassName": "traefik",
                "host": "digits.example.org",
                "path": "/v2",
                "tlsSecretName": "digits-tls",
                "annotations": {"example.com/a": "b"},
            },
            "httpRoute": {
                "parentRefs": [{"name": "internal"}],
                "hostnames": ["digits.internal"],
                "annotations": {"example.com/c": "d"},
            },
        },
        parse_settings(SETTINGS),
    )
    ingress = objects["Ingress"]
    assert ingress["spec"]["ingressClassName"] == "traefik"
    assert ingress["spec"]["tls"] == [{"secretName": "digits-tls", "hosts": ["digits.example.org"]}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "digits.example.org" and rule["http"]["paths"][0]["path"] == "/v2"
    assert ingress["metadata"]["annotations"]["example.com/a"] == "b"
    route = objects["HTTPRoute"]
    assert route["spec"]["parentRefs"] == [{"name": "internal"}]
    assert route["spec"]["hostnames"] == ["digits.internal"]
    assert route["metadata"]["annotations"] == {"example.com/c": "d"}


def test_settings_expose_every_pipeline_and_any_host() -> None:
    settings = parse_settings(
        {"exposure": {"enabled": ["ingress", "grpcRoute"], "parentRefs": GATEWAY}}
    )
    objects = exposed(None, settings)
    assert sorted(objects) == ["GRPCRoute", "Ingress"]
    assert "host" not in objects["Ingress"]["spec"]["rules"][0]
    assert "ingressClassName" not in objects["Ingress"]["spec"]
    assert "hostnames" not in objects["GRPCRoute"]["spec"]


def test_a_route_without_a_gateway_is_an_invalid_spec() -> None:
    doc = pipeline_object()
    doc["spec"]["exposure"] = {"grpcRoute": {}}
    issues = operator_issues(Target.of(doc), OperatorSettings())
    assert [str(i) for i in issues] == [
        "spec.exposure.grpcRoute.parentRefs: no Gateway to attach the route to: give "
        "parentRefs here or in the operator settings (exposure.parentRefs)"
    ]
    assert operator_issues(Target.of(doc), parse_settings(SETTINGS)) == []


def test_bad_exposure_fields_are_refused() -> None:
    doc = pipeline_object()
    doc["spec"]["exposure"] = {"ingress": {"path": "v2", "tlsSecretName": "Bad_Name"}}
    with pytest.raises(PipelineError) as info:
        Target.of(doc)
    assert {i.path for i in info.value.issues} == {
        "spec.exposure.ingress.path",
        "spec.exposure.ingress.tlsSecretName",
    }
    with pytest.raises(PipelineError, match=r"exposure\.host"):
        parse_settings({"exposure": {"host": "{pipeline}.example.com"}})
