"""`ClusterClient`: a small blocking client of a real kube-apiserver, from a kubeconfig
with client certificates (as `scripts/cluster.py` writes them), for the process kubelet
as a node agent (`kubelet.py`, docs/e2e.md "The node agent").

It offers the calls the kubelet makes of the API emulator's `KubeEmulator` (`get`, `find`,
`list`, `create`, `patch`, `delete`), with the same `ApiError` on failure, plus `post`
for subresources (TokenRequest) and `watch`, a thread that calls back on every event of
a watch (reconnecting), so that the kubelet reacts at once instead of polling.
Standard library only (`urllib`, `ssl`).
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.kube.kinds import ApiError
from tests.support.kube.podspec import Obj

# resource -> (API group path, namespaced): what the node agent and the end-to-end tests
# (tests/support/cluster.py) use.
RESOURCES = {
    "pods": ("api/v1", True),
    "services": ("api/v1", True),
    "configmaps": ("api/v1", True),
    "secrets": ("api/v1", True),
    "serviceaccounts": ("api/v1", True),
    "namespaces": ("api/v1", False),
    "nodes": ("api/v1", False),
    "leases": ("apis/coordination.k8s.io/v1", True),
    "endpointslices": ("apis/discovery.k8s.io/v1", True),
    "events": ("api/v1", True),
    "deployments": ("apis/apps/v1", True),
    "jobs": ("apis/batch/v1", True),
    "servicemonitors": ("apis/monitoring.coreos.com/v1", True),
    "predictionpipelines": ("apis/sloline.dev/v1alpha1", True),
}
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


def _file_or_data(user: dict[str, Any], key: str, folder: Path) -> str:
    """The path of a kubeconfig credential given as `<key>` (a file) or `<key>-data`."""
    if user.get(key):
        return str(user[key])
    path = folder / key
    path.write_bytes(base64.b64decode(user[f"{key}-data"]))
    return str(path)


class ClusterClient:
    """Blocking calls to the apiserver of a kubeconfig's current context (HTTPS with the
    context's client certificate); thread-safe (one connection per call)."""

    def __init__(self, kubeconfig: str | Path, timeout_s: float = 10.0) -> None:
        self.kubeconfig_path = Path(kubeconfig)
        config = yaml.safe_load(self.kubeconfig_path.read_text())  # JSON is YAML too
        current = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self.server = cluster["server"].rstrip("/")
        self._tmp = tempfile.TemporaryDirectory(prefix="kube-client-")
        folder = Path(self._tmp.name)
        self.ca_file = _file_or_data(cluster, "certificate-authority", folder)
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._ssl.load_cert_chain(
            _file_or_data(user, "client-certificate", folder),
            _file_or_data(user, "client-key", folder),
        )
        self._timeout_s = timeout_s

    @property
    def address(self) -> tuple[str, int]:
        """The apiserver's host and port."""
        url = urllib.parse.urlsplit(self.server)
        return url.hostname or "", url.port or 443

    # -- paths ----------------------------------------------------------------------------

    @staticmethod
    def path(
        resource: str, namespace: str | None = None, name: str | None = None, sub: str = ""
    ) -> str:
        group, namespaced = RESOURCES[resource]
        parts = [group]
        if namespaced and namespace:
            parts += ["namespaces", namespace]
        parts.append(resource)
        if name:
            parts.append(name)
        if sub:
            parts.append(sub)
        return "/" + "/".join(parts)

    # -- calls ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
    ) -> Any:
        """One call; the decoded JSON answer, or ApiError with the server's Status."""
        url = self.server + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self._ssl, timeout=self._timeout_s) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                status = json.loads(text)
            except json.JSONDecodeError:
                status = {"message": text}
            raise ApiError(
                status=exc.code,
                reason=status.get("reason", ""),
                message=f"{method} {path}: {status.get('message', text)}",
                details=status.get("details") or {},
            ) from None

    def get(self, resource: str, namespace: str | None, name: str) -> Obj:
        found: Obj = self.request("GET", self.path(resource, namespace, name))
        return found

    def find(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        """The object, or None where it does not exist."""
        try:
            return self.get(resource, namespace, name)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return None

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        fields: str | None = None,
        labels: str | None = None,
    ) -> list[Obj]:
        query = {"fieldSelector": fields} if fields else {}
        if labels:
            query["labelSelector"] = labels
        answer = self.request("GET", self.path(resource, namespace), query=query or None)
        kind = answer.get("kind", "List").removesuffix("List")
        version = answer.get("apiVersion", "v1")
        return [{"apiVersion": version, "kind": kind, **item} for item in answer["items"]]

    def create(self, obj: Obj) -> Obj:
        resource = obj["kind"].lower() + "s"
        namespace = obj["metadata"].get("namespace")
        created: Obj = self.request("POST", self.path(resource, namespace), obj)
        return created

    def post(self, resource: str, namespace: str | None, name: str, sub: str, body: Obj) -> Obj:
        answer: Obj = self.request("POST", self.path(resource, namespace, name, sub), body)
        return answer

    def patch(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str = "",
        patch_type: str = "merge",
    ) -> Obj:
        path = self.path(resource, namespace, name, subresource)
        patched: Obj = self.request("PATCH", path, patch, content_type=PATCH_TYPES[patch_type])
        return patched

    def delete(self, resource: str, namespace: str | None, name: str, options: Obj) -> None:
        self.request("DELETE", self.path(resource, namespace, name), options)

    def watch(
        self,
        resource: str,
        on_event: Callable[[], None],
        stop: threading.Event,
        *,
        fields: str | None = None,
    ) -> threading.Thread:
        """A daemon thread that calls `on_event()` on every event of a watch of `resource`
        in all namespaces (from its current state), reconnecting until `stop` is set."""

        def run() -> None:
            query = {"watch": "1", "timeoutSeconds": "20"}
            if fields:
                query["fieldSelector"] = fields
            url = f"{self.server}{self.path(resource)}?{urllib.parse.urlencode(query)}"
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(url, context=self._ssl, timeout=30) as stream:
                        for _line in stream:
                            on_event()
                            if stop.is_set():
                                return
                except (OSError, ssl.SSLError):
                    stop.wait(1.0)

        thread = threading.Thread(target=run, name=f"watch-{resource}", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._tmp.cleanup()
