"""A small JSON client for the few Kubernetes resources the operator touches: the I/O edge.

Objects stay plain dicts (camelCase, as the API serves them), so rendered manifests and
live objects compare directly and custom resources (PredictionPipeline, ServiceMonitor)
need no generated classes. Transport, TLS and credentials come from the `kubernetes`
client's configuration (in-cluster service account or a kubeconfig file); kopf logs in
with the very same credentials (`connection_info`), so the operator has one identity.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

PATCH_JSON: Final = "application/json-patch+json"
PATCH_MERGE: Final = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class Resource:
    """A namespaced resource type: where its objects live in the API."""

    api_version: str
    kind: str
    plural: str

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path


CONFIG_MAPS = Resource("v1", "ConfigMap", "configmaps")
SERVICES = Resource("v1", "Service", "services")
SECRETS = Resource("v1", "Secret", "secrets")
NETWORK_POLICIES = Resource("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
DISRUPTION_BUDGETS = Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
PODS = Resource("v1", "Pod", "pods")
DEPLOYMENTS = Resource("apps/v1", "Deployment", "deployments")
JOBS = Resource("batch/v1", "Job", "jobs")
SERVICE_MONITORS = Resource("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors")
PIPELINES = Resource("sloline.dev/v1alpha1", "PredictionPipeline", "predictionpipelines")
INGRESSES = Resource("networking.k8s.io/v1", "Ingress", "ingresses")
HTTP_ROUTES = Resource("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes")
GRPC_ROUTES = Resource("gateway.networking.k8s.io/v1", "GRPCRoute", "grpcroutes")
EXPOSURE: Final = (INGRESSES, HTTP_ROUTES, GRPC_ROUTES)
RESOURCES: Final = {
    (r.api_version, r.kind): r
    for r in (
        CONFIG_MAPS,
        SERVICES,
        SECRETS,
        NETWORK_POLICIES,
        DISRUPTION_BUDGETS,
        PODS,
        DEPLOYMENTS,
        JOBS,
        SERVICE_MONITORS,
        PIPELINES,
        *EXPOSURE,
    )
}


def resource_of(obj: Mapping[str, Any]) -> Resource:
    try:
        return RESOURCES[(obj["apiVersion"], obj["kind"])]
    except KeyError:
        raise ValueError(f"the operator does not manage {obj.get('kind')!r} objects") from None


class ApiError(RuntimeError):
    """A failed API call: `status` is the HTTP status code, `reason` the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """A stale write: resourceVersion mismatch (409) or a failed JSON-patch test (422)."""
        return self.status in (409, 422)


class KubeApi:
    """Synchronous (call it from worker threads), thread-safe: one connection pool."""

    def __init__(self, api_client: Any, *, timeout_s: float = 30.0) -> None:
        self._client = api_client
        self._timeout_s = timeout_s

    @classmethod
    def connect(cls, kubeconfig: str | None = None, *, in_cluster: bool | None = None) -> KubeApi:
        """In a pod: the service account; elsewhere the kubeconfig file `kubeconfig`
        (default: `~/.kube/config`)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        if in_cluster is None:
            in_cluster = kubeconfig is None and os.path.exists(
                "/var/run/secrets/kubernetes.io/serviceaccount/token"
            )
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig or os.path.expanduser("~/.kube/config"),
                client_configuration=configuration,
            )
        return cls(client.ApiClient(configuration))

    @property
    def configuration(self) -> Any:
        return self._client.configuration

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One API call; returns the decoded body, raises `ApiError` on an error status."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method_, url, headers_, body_, _ = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(
            method_, url, header_params=headers_, body=body_, _request_timeout=self._timeout_s
        )
        data = response.read()
        if response.status >= 400:
            try:
                status = json.loads(data)
            except ValueError:  # not a Status object (e.g. a proxy's error page)
                status = {}
            if not isinstance(status, dict):
                status = {}
            reason = status.get("reason") or str(response.reason)
            message = status.get("message") or data.decode(errors="replace")[:500]
            raise ApiError(response.status, reason, message)
        decoded: Any = json.loads(data) if data else {}
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def list(
        self, resource: Resource, namespace: str, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else {}
        items = self.request("GET", resource.path(namespace), query=query).get("items") or []
        # List items carry no apiVersion/kind; add them so they look like single objects.
        return [{"apiVersion": resource.api_version, "kind": resource.kind, **i} for i in items]

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        resource = resource_of(obj)
        namespace = obj["metadata"]["namespace"]
        return self.request("POST", resource.path(namespace), body=dict(obj))

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Sequence[Mapping[str, Any]] | Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A JSON patch (a list of operations) or a JSON merge patch (a mapping)."""
        body: Any
        if isinstance(patch, Mapping):
            body, content_type = dict(patch), PATCH_MERGE
        else:
            body, content_type = [dict(op) for op in patch], PATCH_JSON
        return self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            body=body,
            content_type=content_type,
        )

    def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete with background propagation (the garbage collector removes dependents,
        e.g. a Job's pods); False if it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            self.request("DELETE", resource.path(namespace, name), body=body)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def serves(self, group_version: str, plural: str) -> bool:
        """Whether the API serves `plural` in `group_version` (e.g. whether the Prometheus
        Operator's ServiceMonitor CRD is installed)."""
        try:
            found = self.request("GET", f"/apis/{group_version}")
        except ApiError as exc:
            if exc.status in (403, 404, 503):
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources", []))
