"""The HTTP face of the emulated API server: a kmock handler that routes Kubernetes URLs to
the store (`store.py`) and answers discovery, so kopf, the kubernetes client and kubectl can
talk to it as to a cluster.

It extends `kmock.KubernetesScaffold` (Status errors, discovery of `kmock.resources`, the
reaction DSL) rather than `kmock.KubernetesEmulator`, whose create/patch/delete semantics
and watch are what this package replaces. kmock's reactions still come first, so a test can
inject faults: `kube.server['patch', kmock.resource('apps/v1/deployments')] << 500`.
Requests are parsed here because kmock 0.8 cannot parse `/api/v1/namespaces`.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import parsing, rendering

from tests.support.kube.kinds import ApiError, Kind, bad_request, no_such_resource
from tests.support.kube.selectors import SelectorError, field_selector, label_selector
from tests.support.kube.store import Store

SUBRESOURCE_VERBS = ["get", "patch", "update"]


def parse_path(path: str) -> parsing.ParsedPath:
    """Split `/api/v1/...` and `/apis/<group>/<version>/...` into the Kubernetes parts."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:  # /, /version, /apis, /apis/<group>, /openapi/...: not a resource
        group = parts[1] if parts[0] == "apis" and len(parts) == 2 else None
        return parsing.ParsedPath(group=group)
    namespace = None
    # /namespaces/<ns>/<plural>... is namespaced; /namespaces[/<name>[/status]] is the resource.
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    plural, name = [*rest, None, None][:2]
    subresource = "/".join(rest[2:]) or None
    return parsing.ParsedPath(group, version, plural, namespace, name, subresource)


def _load(body: bytes, content_type: str) -> Any:
    try:
        return (
            yaml.safe_load(body) if "yaml" in content_type else json.loads(body) if body else None
        )
    except ValueError:  # yaml.YAMLError and json.JSONDecodeError are ValueErrors
        return None


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesScaffold):
    """A kmock handler serving the Kubernetes API from an in-memory `Store`."""

    store: Store = attrs.field(init=False)
    # Exceptions other than API errors: emulator bugs, re-raised when the emulator stops.
    failures: list[BaseException] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store = Store(self.resources)
        self.fallback[self._is_resource_request] << self._serve

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw_request.read()
        path = parse_path(raw_request.path)
        resource = (
            None
            if path.group is None
            else kmock.resource(group=path.group, version=path.version, plural=path.plural)
        )
        request = rendering.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            body=body,
            text=body.decode(errors="replace"),
            data=_load(body, raw_request.content_type),
            action=parsing.guess_k8s(path, kmock.method(raw_request.method), raw_request.query),
            resource=resource,
            namespace=path.namespace,
            name=path.name,
            subresource=path.subresource,
        )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except rendering.StreamingError as e:  # a watch failed after its headers went out
            self.failures.append(e.__cause__ or e)
            response: aiohttp.web.StreamResponse = e.args[0]
            return response
        except Exception as e:  # every failure becomes a Status response
            if not isinstance(e, kmock.KubernetesError):
                self.failures.append(e)
            return await self._render_error(e)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        status = exc.status if isinstance(exc, kmock.KubernetesError) else 500
        reason = (
            exc.reason
            if isinstance(exc, ApiError)
            else {404: "NotFound"}.get(status, "InternalError")
        )
        message = exc.message if isinstance(exc, kmock.KubernetesError) else repr(exc)
        details = exc.details if isinstance(exc, ApiError) else {}
        return aiohttp.web.json_response(
            {
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "status": "Failure",
                "code": status,
                "reason": reason,
                "message": message,
                "details": details,
            },
            status=status,
        )

    # -- discovery ----------------------------------------------------------------------------

    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        # kmock's version reports groupVersion "/v1" for the core group and omits verbs.
        assert request.resource is not None  # the route is /api/<v> or /apis/<g>/<v>
        group, version = request.resource.group, request.resource.version
        served = sorted(
            (r for r in self.resources if (r.group, r.version) == (group, version)),
            key=lambda r: r.plural or "",
        )
        if not served and group:
            raise no_such_resource()
        entries: list[dict[str, Any]] = []
        for resource in served:
            info = self.resources[resource]
            entry = {
                "name": resource.plural,
                "singularName": info.singular or "",
                "namespaced": bool(info.namespaced),
                "kind": info.kind,
                "verbs": sorted(info.verbs),
                "shortNames": sorted(info.shortnames),
                "categories": sorted(info.categories),
            }
            entries.append(entry)
            for sub in sorted(info.subresources):
                scale = {"kind": "Scale", "group": "autoscaling", "version": "v1"}
                entries.append(
                    {
                        **entry,
                        "name": f"{resource.plural}/{sub}",
                        "singularName": "",
                        "verbs": SUBRESOURCE_VERBS,
                        "shortNames": [],
                        "categories": [],
                        **(scale if sub == "scale" else {}),
                    }
                )
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }

    # -- the resources ------------------------------------------------------------------------

    @staticmethod
    def _is_resource_request(request: kmock.Request) -> bool:
        return request.resource is not None and request.resource.plural is not None

    async def _serve(self, request: kmock.Request) -> kmock.Payload:
        assert request.resource is not None  # checked by _is_resource_request
        store = self.store
        kind = store.kinds.kind(request.resource)
        namespace, name, sub = request.namespace, request.name, request.subresource
        method = request.method
        collection = name is None and method in ("GET", "POST")
        if (
            (namespace is not None and not kind.namespaced)
            or (kind.namespaced and namespace is None and not (collection and method == "GET"))
            or (sub is not None and sub not in kind.subresources)
        ):
            raise no_such_resource()
        if "dryRun" in request.params:  # refused rather than silently applied
            raise bad_request("dryRun is not emulated")
        if method == "GET" and request.params.get("watch") in ("true", "1"):
            return self._watch(kind, namespace, name, request.params)
        if collection and method == "GET":
            items = store.list(kind, namespace, self._selector(request.params, name))
            meta = {"resourceVersion": store.resource_version}
            return kmock.Response(
                status=200,
                payload={
                    "apiVersion": kind.api_version,
                    "kind": f"{kind.kind}List",
                    "metadata": meta,
                    "items": items,
                },
            )
        if collection:
            return kmock.Response(status=201, payload=store.create(kind, namespace, request.data))
        if name is None:
            raise bad_request(f"{method} on a collection is not supported", 405, "MethodNotAllowed")
        if method == "GET":
            obj = (
                store.scale(kind, namespace, name)
                if sub == "scale"
                else store.get(kind, namespace, name)
            )
        elif method == "PUT" and sub == "scale":
            obj = store.rescale(kind, namespace, name, request.data)
        elif method == "PUT":
            obj = store.replace(kind, namespace, name, request.data, sub)
        elif method == "PATCH":
            content_type = request.headers.get("Content-Type", "")
            obj = store.patch(kind, namespace, name, request.data, content_type, sub)
        elif method == "DELETE" and sub is None:
            options = dict(request.data) if isinstance(request.data, dict) else {}
            options.setdefault("propagationPolicy", request.params.get("propagationPolicy"))
            obj = store.delete(kind, namespace, name, options)
        else:
            raise bad_request(f"{method} is not supported here", 405, "MethodNotAllowed")
        return kmock.Response(status=200, payload=obj)

    @staticmethod
    def _selector(params: Any, name: str | None) -> Any:
        try:
            labels = label_selector(params.get("labelSelector"))
            fields = field_selector(params.get("fieldSelector"))
        except SelectorError as e:
            raise bad_request(str(e)) from e
        return lambda obj: labels(obj) and fields(obj) and name in (None, obj["metadata"]["name"])

    def _watch(self, kind: Kind, namespace: str | None, name: str | None, params: Any) -> Any:
        match = self._selector(params, name)
        try:
            since = (
                int(params.get("resourceVersion") or 0) or None
            )  # "" and "0": current state, then live
            timeout_s = float(params.get("timeoutSeconds") or 1800)
        except ValueError as e:
            raise bad_request(f"invalid watch parameter: {e}") from e
        bookmark = params.get("sendInitialEvents") == "true"

        async def events() -> Any:
            yield b""  # send the headers before the first event, as the API server does
            async for event in self.store.watch(
                kind, namespace, match, since=since, bookmark=bookmark, timeout_s=timeout_s
            ):
                yield event

        headers = {"Content-Type": "application/json"}
        return kmock.Response(status=200, headers=headers, payload=events())
