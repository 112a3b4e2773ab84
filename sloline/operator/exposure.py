"""Reaching a pipeline from outside the cluster: an Ingress and Gateway API routes to the
router's Service, one of each kind the pipeline wants (`spec.exposure`, or the operator
settings' `exposure.enabled` for every pipeline), all named `<p>` and owned by the
pipeline. Pure functions, like the rest of rendering.

Ingress and HTTPRoute carry the Open Inference Protocol's REST API (the `http` port);
GRPCRoute carries its gRPC API (the `grpc` port). Hosts and Gateways default to the
operator settings (`exposure.host`, a template of `{name}` and `{namespace}`, and
`exposure.parentRefs`).
"""

from __future__ import annotations

from typing import Any, Final

from sloline.operator.naming import GRPC_PORT, HTTP_PORT, Target, labels, router_name
from sloline.operator.settings import OperatorSettings
from sloline.spec import Issue
from sloline.spec.models import ExposureSpec, IngressExposure, RouteExposure

GATEWAY_API: Final = "gateway.networking.k8s.io/v1"
Manifest = dict[str, Any]


def wanted_exposure(
    target: Target, settings: OperatorSettings
) -> tuple[IngressExposure | None, RouteExposure | None, RouteExposure | None]:
    """(ingress, httpRoute, grpcRoute) the pipeline gets: its own, else an empty one
    (all defaults) where the settings enable that kind for every pipeline."""
    spec = target.graph.pipeline.spec.exposure or ExposureSpec()
    enabled = set(settings.exposure.enabled)
    ingress = spec.ingress or (IngressExposure() if "ingress" in enabled else None)
    http = spec.http_route or (RouteExposure() if "httpRoute" in enabled else None)
    grpc = spec.grpc_route or (RouteExposure() if "grpcRoute" in enabled else None)
    return ingress, http, grpc


def _default_host(target: Target, settings: OperatorSettings) -> str:
    return settings.exposure.host.format(name=target.name, namespace=target.namespace)


def render_ingress(
    target: Target, settings: OperatorSettings, ingress: IngressExposure
) -> Manifest:
    """`<p>`: an Ingress of `path` (a prefix) on the host to the router's `http` port,
    with TLS at the Ingress when a Secret is named."""
    host = ingress.host if ingress.host is not None else _default_host(target, settings)
    backend = {"service": {"name": router_name(target.name), "port": {"name": "http"}}}
    rule: dict[str, Any] = {
        "http": {"paths": [{"path": ingress.path, "pathType": "Prefix", "backend": backend}]}
    }
    if host:
        rule = {"host": host, **rule}
    spec: dict[str, Any] = {"rules": [rule]}
    class_name = ingress.ingress_class_name or settings.exposure.ingress_class_name
    if class_name:
        spec["ingressClassName"] = class_name
    if ingress.tls_secret_name:
        tls: dict[str, Any] = {"secretName": ingress.tls_secret_name}
        if host:
            tls["hosts"] = [host]
        spec["tls"] = [tls]
    annotations = {**settings.exposure.ingress_annotations, **ingress.annotations}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": target.metadata(target.name, labels(target.name, "router"), annotations),
        "spec": spec,
    }


def render_route(
    target: Target, settings: OperatorSettings, route: RouteExposure, kind: str
) -> Manifest:
    """`<p>`: an HTTPRoute (every path to the `http` port) or a GRPCRoute (every method
    to the `grpc` port) attached to the route's Gateways (default: the settings')."""
    hostnames = route.hostnames or [h for h in [_default_host(target, settings)] if h]
    port = HTTP_PORT if kind == "HTTPRoute" else GRPC_PORT
    rule: dict[str, Any] = {"backendRefs": [{"name": router_name(target.name), "port": port}]}
    if kind == "HTTPRoute":
        rule = {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], **rule}
    spec: dict[str, Any] = {"parentRefs": route.parent_refs or settings.exposure.parent_refs}
    if hostnames:
        spec["hostnames"] = hostnames
    spec["rules"] = [rule]
    return {
        "apiVersion": GATEWAY_API,
        "kind": kind,
        "metadata": target.metadata(target.name, labels(target.name, "router"), route.annotations),
        "spec": spec,
    }


def render_exposure(target: Target, settings: OperatorSettings) -> list[Manifest]:
    """The Ingress, HTTPRoute and GRPCRoute the pipeline wants (`wanted_exposure`)."""
    ingress, http, grpc = wanted_exposure(target, settings)
    out = [render_ingress(target, settings, ingress)] if ingress else []
    out += [render_route(target, settings, http, "HTTPRoute")] if http else []
    out += [render_route(target, settings, grpc, "GRPCRoute")] if grpc else []
    return out


def exposure_issues(target: Target, settings: OperatorSettings) -> list[Issue]:
    """A route without a Gateway to attach to (none in the spec nor in the settings)."""
    _, http, grpc = wanted_exposure(target, settings)
    return [
        Issue(
            f"spec.exposure.{key}.parentRefs",
            "no Gateway to attach the route to: give parentRefs here or in the operator "
            "settings (exposure.parentRefs)",
        )
        for key, route in (("httpRoute", http), ("grpcRoute", grpc))
        if route is not None and not (route.parent_refs or settings.exposure.parent_refs)
    ]
