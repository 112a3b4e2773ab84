"""The checks in front of a router's servers: `BearerAuth` (ASGI middleware of the REST
door) and `TokenInterceptor` (gRPC servers: the client door and the worker port). Both
refuse before the handler runs, so a refused caller's body or Hello is never read, and
log a WARNING naming the peer. Tokens and their comparison: `auth.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from sloline.serving.auth import OPEN_PATHS, TokenSet, metadata_value

log = logging.getLogger(__name__)

# --- REST --------------------------------------------------------------------------------

_UNAUTHORIZED_HEADERS: Final = [
    (b"content-type", b"application/json"),
    (b"www-authenticate", b'Bearer realm="sloline"'),
]


class BearerAuth:
    """ASGI middleware: every HTTP request but the health probes needs a bearer token;
    without an accepted one it gets 401 with `WWW-Authenticate: Bearer` and a JSON error,
    and its body is never read."""

    def __init__(self, app: ASGIApp, tokens: TokenSet, open_paths: frozenset[str] = OPEN_PATHS):
        self._app = app
        self._tokens = tokens
        self._open = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open:
            await self._app(scope, receive, send)
            return
        header = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                header = value
                break
        if self._tokens.authorizes(header):
            await self._app(scope, receive, send)
            return
        client = scope.get("client")
        log.warning(
            "HTTP %s %s from %s: %s bearer token; refused (401)",
            scope["method"],
            scope["path"],
            f"{client[0]}:{client[1]}" if client else "?",
            "no" if header is None else "wrong",
        )
        body = orjson.dumps(
            {"error": "authentication required: send 'Authorization: Bearer <token>'"}
        )
        headers = [*_UNAUTHORIZED_HEADERS, (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


# --- gRPC ---------------------------------------------------------------------------------


def _refusal(handler: grpc.RpcMethodHandler, method: str, what: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that logs the peer and ends the call with
    UNAUTHENTICATED, reading nothing."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        log.warning("%s %s from %s: missing or wrong token; refused", what, method, context.peer())
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, f"{what}: a valid bearer token is required"
        )

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every call on the server needs `authorization: Bearer <token>` metadata; a call
    without an accepted one ends UNAUTHENTICATED before its handler runs."""

    def __init__(self, tokens: TokenSet, what: str) -> None:
        self._tokens = tokens
        self._what = what

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        header = metadata_value(handler_call_details.invocation_metadata)
        if handler is None or self._tokens.authorizes(header):
            return handler
        method = handler_call_details.method
        return _refusal(handler, method, self._what)
