"""REST front door: the Open Inference Protocol v2 HTTP API over a `DataPlane`.

A thin adapter (KServe's layering): it reads bytes, calls `rest_codec` and the plane,
and writes bytes; the model name and version in the path go to the plane, which checks
them (`DataPlane.check_model`, before an infer body is read). Routes are
`/v2/health/{live,ready}`, `/v2`, `/v2/models/{name}[/versions/{version}]`, `.../ready`,
`POST .../infer`, plus `/metrics` from an injected ASGI app (also served alone by
`create_metrics_app`, for a separate metrics port).

Errors: every `InferenceError` becomes its HTTP status with `{"error": "<message>"}` (503
adds `Retry-After`); anything unexpected is logged and answered with 500, and the server
keeps serving. A body larger than its limit is refused with 413 from its Content-Length
before it is read (and while streaming when it has none): `max_json_body_bytes` for a JSON
body, `max_body_bytes` with the binary tensor extension (whose JSON header must still fit
`max_json_body_bytes`). The rest of a refused body is discarded as it arrives (clients
that send the whole body before reading get their 413), for at most the body timeout.

Plain Starlette rather than FastAPI: there is no request model to validate (the codec
does that faster than pydantic) and no dependency injection to resolve. Routing one POST
through the ASGI app in-process costs Starlette about half what it costs FastAPI
(docs/benchmarks.md, "Micro-benchmarks behind design choices"). Starlette's own 404 / 405
are answered in the same `{"error": ...}` shape. `POST .../infer`, the one hot route,
skips even Starlette: the app matches it first and answers it on raw ASGI
(`_InferEndpoint`), which is also the route's endpoint inside Starlette, so other
methods on it still get Starlette's 405.

Serve it from a socket made by `bind_socket` (see there: TCP_NODELAY).
"""

from __future__ import annotations

import logging
import math
import re
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

import sloline
from sloline.common.tensors import (
    DataPlane,
    InferenceError,
    InvalidInput,
    Overloaded,
    PayloadTooLarge,
)
from sloline.serving import codec, logs, rest_codec, tracing
from sloline.serving.triton_stats import LOCAL_STATS_PATH, TritonExtensions, triton_routes

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# A JSON body costs ~15x its size in Python objects while it is decoded, and blocks the
# event loop meanwhile (docs/operations.md, "Front-door limits"): big tensors go binary.
DEFAULT_MAX_JSON_BODY_BYTES = 4 * 1024 * 1024
# All request bodies held at once (read or announced, until answered): 8 maximal binary ones.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 512 * 1024 * 1024
JSON = "application/json"
_INFER_PATH: Final = re.compile(
    r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer"
)
_HEADER_LENGTH: Final = rest_codec.HEADER_LENGTH.lower().encode()
_REQUEST_ID: Final = logs.REQUEST_ID_HEADER.encode()

Handler = Callable[[Request], Awaitable[Response]]


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket for `uvicorn.Server.serve(sockets=[...])` (port 0: pick a free one).

    Create it with this, not `socket.socket(AF_INET)`: asyncio turns on TCP_NODELAY only
    for sockets whose protocol is IPPROTO_TCP, and connections accepted from a socket
    made with protocol 0 inherit 0. uvicorn writes a response's headers and body
    separately, so without TCP_NODELAY Nagle holds the body back until the client's
    delayed ACK, adding ~40 ms to every keep-alive request on Linux.

    `reuse_port`: share the port with other processes that bind it the same way (the
    embedded mode's routers; the kernel spreads connections over them).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status, headers, media_type=JSON)


def error_response(exc: InferenceError) -> Response:
    """`{"error": message}` with the error's status; 503 says when to retry."""
    headers = None
    if exc.retry_after_s is not None:
        # Retry-After takes whole seconds; round up so clients never retry too early.
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    return _json({"error": exc.message}, exc.status, headers)


def _guarded(handler: Handler) -> Handler:
    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except InferenceError as exc:
            return error_response(exc)
        except Exception as exc:
            logger.exception("unexpected error serving %s %s", request.method, request.url.path)
            return _json({"error": f"internal server error: {type(exc).__name__}: {exc}"}, 500)

    return guarded


class _Disconnected(Exception):
    """The client went away before its body arrived: nobody to answer."""


async def _read_body(
    receive: Receive,
    declared: bytes | None,
    limit: _BodyLimit,
    budget: _BodyBudget,
    reserved: list[int],
) -> list[bytes]:
    """The body as the chunks uvicorn received (the codec copies tensors out of them),
    its bytes held in `budget` (`reserved` says how many, for the caller to give back)."""
    if declared is not None:
        if not declared.isdigit():
            raise InvalidInput(
                f"Content-Length header {declared.decode('latin-1')!r} is not a byte count"
            )
        if int(declared) > limit.bytes:
            raise limit.exceeded(f"is {int(declared)} bytes, over")
        budget.reserve(int(declared), reserved)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit.bytes:
                raise limit.exceeded("exceeds")
            if size > reserved[0]:  # chunked: no Content-Length was reserved
                budget.reserve(size - reserved[0], reserved)
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks


class _BodyLimit:
    """The largest body a request may send: `max_json_body_bytes` when it is all JSON,
    `max_body_bytes` with the binary tensor extension (its JSON header is checked apart)."""

    __slots__ = ("bytes", "json", "max_body_bytes")

    def __init__(self, limit: int, *, json: bool, max_body_bytes: int) -> None:
        self.bytes = limit
        self.json = json
        self.max_body_bytes = max_body_bytes

    def exceeded(self, how: str) -> PayloadTooLarge:
        if not self.json:
            return PayloadTooLarge(
                f"request body {how} the {self.bytes}-byte limit; send a smaller batch or "
                "raise the server's max_body_bytes"
            )
        return PayloadTooLarge(
            f"JSON request body {how} the {self.bytes}-byte limit for JSON; send the "
            f"tensors raw with the binary tensor extension ({rest_codec.HEADER_LENGTH} header, "
            f"bodies up to {self.max_body_bytes} bytes) or raise the server's "
            "max_json_body_bytes"
        )


class _BodyBudget:
    """Bytes of request bodies held by the REST door at once (read, or promised by their
    Content-Length, until the plane has answered): beyond it a request is 503 before its
    body is read, so many large bodies at once cannot exhaust the router's memory."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def reserve(self, size: int, reserved: list[int]) -> None:
        """Hold `size` more bytes for one request (`reserved` counts its total)."""
        if self.held + size > self.limit:
            raise Overloaded(
                f"request bodies being served hold {self.held} bytes; {size} more would pass "
                f"the {self.limit}-byte limit (max_buffered_body_bytes); retry later",
                retry_after_s=1.0,
            )
        self.held += size
        reserved[0] += size


def create_http_app(
    plane: DataPlane,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_body_bytes: int = DEFAULT_MAX_JSON_BODY_BYTES,
    max_buffered_body_bytes: int = DEFAULT_MAX_BUFFERED_BODY_BYTES,
    metrics_app: ASGIApp | None = None,
    triton: TritonExtensions | None = None,
) -> ASGIApp:
    """The OIP v2 REST app over `plane`, for uvicorn on a socket from `bind_socket`.

    `metrics_app` (e.g. `prometheus_client.make_asgi_app(registry)`) answers `GET /metrics`;
    `triton` adds Triton's configuration,
    statistics and repository extensions (`sloline.serving.triton_stats`).
    """

    async def live(_: Request) -> Response:
        ok = plane.live()
        return _json({"live": ok}, 200 if ok else 503)

    async def ready(_: Request) -> Response:
        ok = plane.ready()
        return _json({"ready": ok}, 200 if ok else 503)

    async def server_metadata(_: Request) -> Response:
        return _json(
            {
                "name": codec.SERVER_NAME,
                "version": sloline.__version__,
                "extensions": codec.SERVER_EXTENSIONS,
            }
        )

    async def model_metadata(request: Request) -> Response:
        params = request.path_params
        metadata = plane.model_metadata(params["name"], params.get("version", ""))
        return _json(rest_codec.metadata_to_json(metadata))

    async def model_ready(request: Request) -> Response:
        name = request.path_params["name"]
        ok = plane.model_ready(name, request.path_params.get("version", ""))
        return _json({"name": name, "ready": ok}, 200 if ok else 503)

    infer = _InferEndpoint(
        plane, max_body_bytes, max_json_body_bytes, _BodyBudget(max_buffered_body_bytes)
    )
    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"
    routes = [] if triton is None else triton_routes(triton, _json, _guarded)
    routes += [
        Route(f"{model}/infer", infer, methods=["POST"]),
        Route(f"{versioned}/infer", infer, methods=["POST"]),
        Route("/v2/health/live", _guarded(live), methods=["GET"]),
        Route("/v2/health/ready", _guarded(ready), methods=["GET"]),
        Route("/v2", _guarded(server_metadata), methods=["GET"]),
        Route(model, _guarded(model_metadata), methods=["GET"]),
        Route(versioned, _guarded(model_metadata), methods=["GET"]),
        Route(f"{model}/ready", _guarded(model_ready), methods=["GET"]),
        Route(f"{versioned}/ready", _guarded(model_ready), methods=["GET"]),
    ]
    if metrics_app is not None:
        routes.append(Route("/metrics", _AsgiEndpoint(metrics_app), methods=["GET"]))
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_exception})
    return _InferFirst(app, infer)


def create_metrics_app(
    metrics_app: ASGIApp, plane: DataPlane | None = None, triton: TritonExtensions | None = None
) -> Starlette:
    """An app serving `GET /metrics` (the router's separate metrics port); given the
    plane, `/v2/health/{live,ready}`: the kubelet probes this plain port when the client
    doors need TLS client certificates the kubelet does not have; given `triton`, this
    router's own statistics at `LOCAL_STATS_PATH`, which the pipeline's other routers add
    to theirs (counts of the kind `/metrics` serves beside it)."""
    routes = [Route("/metrics", _AsgiEndpoint(metrics_app), methods=["GET"])]
    if triton is not None:
        ext = triton

        async def local_stats(_: Request) -> Response:
            return _json(ext.local())

        routes.append(Route(LOCAL_STATS_PATH, _guarded(local_stats), methods=["GET"]))
    if plane is not None:

        async def live(_: Request) -> Response:
            return _json({"live": plane.live()}, 200 if plane.live() else 503)

        async def ready(_: Request) -> Response:
            return _json({"ready": plane.ready()}, 200 if plane.ready() else 503)

        routes += [
            Route("/v2/health/live", live, methods=["GET"]),
            Route("/v2/health/ready", ready, methods=["GET"]),
        ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_exception})


async def _http_exception(_: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no such route) and 405 (wrong method), as OIP JSON errors."""
    assert isinstance(exc, HTTPException)
    return _json({"error": exc.detail}, exc.status_code, dict(exc.headers or {}))


class _InferFirst:
    """`POST /v2/models/{name}[/versions/{version}]/infer` straight to its endpoint; every
    other request through Starlette (whose middleware and routing the hot route skips)."""

    def __init__(self, app: Starlette, infer: _InferEndpoint) -> None:
        self._app = app
        self._infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            root = scope.get("root_path", "")
            match = _INFER_PATH.fullmatch(path[len(root) :] if root else path)
            if match is not None:
                scope["path_params"] = match.groupdict(default="")
                await self._infer(scope, receive, send)
                return
        await self._app(scope, receive, send)


class _InferEndpoint:
    """`POST .../infer` on raw ASGI: ask the plane about the model, read the body, decode,
    infer, write the parts.

    Errors as everywhere else: an `InferenceError` is its status with `{"error": ...}`,
    anything unexpected is logged and answered 500.
    """

    def __init__(
        self, plane: DataPlane, max_body_bytes: int, max_json_body_bytes: int, budget: _BodyBudget
    ) -> None:
        self._plane = plane
        self._budget = budget
        self._binary_limit = _BodyLimit(max_body_bytes, json=False, max_body_bytes=max_body_bytes)
        self._json_limit = _BodyLimit(
            min(max_json_body_bytes, max_body_bytes), json=True, max_body_bytes=max_body_bytes
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reserved = [0]  # body bytes this request holds in the budget until it is answered
        start = time.perf_counter()
        rid = logs.request_id(_header(scope, _REQUEST_ID))
        rid_header = (_REQUEST_ID, rid.encode("latin-1"))
        try:
            if tracing.tracer is None:
                encoded = await self._answer(scope, receive, reserved)
            else:
                encoded = await self._traced(scope, receive, reserved, rid)
        except _Disconnected:
            return
        except InferenceError as exc:
            await _with_header(error_response(exc), rid_header)(scope, receive, send)
            logs.access(
                "http", scope["path_params"]["name"], exc.status, time.perf_counter() - start
            )
            return
        except Exception as exc:
            logger.exception("unexpected error serving POST %s", scope["path"])
            message = f"internal server error: {type(exc).__name__}: {exc}"
            await _with_header(_json({"error": message}, 500), rid_header)(scope, receive, send)
            logs.access("http", scope["path_params"]["name"], 500, time.perf_counter() - start)
            return
        finally:
            # Answered: the body is not needed any more (a router's answers are views of
            # its workers' messages, not of the request), whatever the client reads.
            self._budget.held -= reserved[0]
        size = b"%d" % encoded.size
        if encoded.header_length is None:
            headers = [(b"content-length", size), (b"content-type", JSON.encode()), rid_header]
        else:
            headers = [
                (b"content-length", size),
                (_HEADER_LENGTH, b"%d" % encoded.header_length),
                (b"content-type", b"application/octet-stream"),
                rid_header,
            ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        # Part by part: large outputs are not joined into one more copy before the socket.
        last = len(encoded.parts) - 1
        for i, part in enumerate(encoded.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})
        logs.access("http", scope["path_params"]["name"], 200, time.perf_counter() - start)

    async def _traced(
        self, scope: Scope, receive: Receive, reserved: list[int], rid: str
    ) -> rest_codec.RestBody:
        """`_answer` in a server span, the child of the client's `traceparent` header."""
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        attributes = {
            "http.request.method": "POST",
            "url.path": scope["path"],
            "sloline.request_id": rid,
        }
        with tracing.server_span("POST /v2/models/{name}/infer", carrier, attributes):
            return await self._answer(scope, receive, reserved)

    async def _answer(
        self, scope: Scope, receive: Receive, reserved: list[int]
    ) -> rest_codec.RestBody:
        name, version = scope["path_params"]["name"], scope["path_params"].get("version", "")
        # The model first: a request to a model that is not here is a 404 whatever its
        # body holds, and its body is not worth reading.
        self._plane.check_model(name, version)
        headers = dict(scope["headers"])
        encoding = headers.get(b"content-encoding", b"identity")
        if encoding != b"identity":
            raise InvalidInput(
                f"Content-Encoding {encoding.decode('latin-1')!r} is not supported; send it plain"
            )
        header_length = headers.get(_HEADER_LENGTH)
        limit = self._json_limit if header_length is None else self._binary_limit
        json_limit = self._json_limit.bytes
        if header_length and header_length.isdigit() and int(header_length) > json_limit:
            raise PayloadTooLarge(
                f"{rest_codec.HEADER_LENGTH} is {int(header_length)} bytes, over the "
                f"{json_limit}-byte limit for JSON; send large tensors raw after the JSON header "
                "or raise the server's max_json_body_bytes"
            )
        body = await _read_body(
            receive, headers.get(b"content-length"), limit, self._budget, reserved
        )
        request = rest_codec.decode_rest_request(
            name,
            body,
            None if header_length is None else header_length.decode("latin-1"),
            model_version=version,
        )
        response = await self._plane.infer(request)
        return rest_codec.encode_rest_response(request, response)


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The value of header `name` (lower case), None when the request has none."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _with_header(response: Response, header: tuple[bytes, bytes]) -> Response:
    response.raw_headers.append(header)
    return response


class _AsgiEndpoint:
    """Serve an ASGI app at one exact path (a Mount would only match `/metrics/...`).

    Starlette treats a plain function endpoint as `f(request)`, and prometheus_client's
    ASGI app is a plain `f(scope, receive, send)` function, so it is wrapped in an object.
    """

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)
