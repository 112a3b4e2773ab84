"""gRPC front door: the Open Inference Protocol v2 `inference.GRPCInferenceService`.

The same thin adapter as the REST door, over the same `DataPlane` (which checks model
names and versions) and `grpc_codec`, for
`grpc.aio` servers: the stock `tritonclient.grpc` client and KServe clients work against
it. `InferenceError`s map to gRPC status codes (400 INVALID_ARGUMENT, 404 NOT_FOUND,
413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE with the retry hint in the message and in the
trailing metadata `retry-after-ms`, 504 DEADLINE_EXCEEDED, anything else INTERNAL).
Message-size limits are channel options of the server; use `server_options()`.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Final, NoReturn

import grpc

import sloline
from sloline.common.tensors import DataPlane, InferenceError, InferRequest, InferResponse
from sloline.serving import codec, grpc_codec, logs, tracing
from sloline.serving.proto import grpc_service_pb2 as pb
from sloline.serving.proto import grpc_service_pb2_grpc as pb_grpc
from sloline.serving.triton_stats import NOT_SUPPORTED, TritonExtensions

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
RETRY_AFTER_METADATA: Final = "retry-after-ms"

_CODES: Final = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Channel options for `grpc.aio.server(options=...)`: the largest message either way.

    Bigger requests are refused by gRPC itself with RESOURCE_EXHAUSTED before the
    servicer sees them.
    """
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def add_inference_service(
    server: Any, plane: DataPlane, triton: TritonExtensions | None = None
) -> None:
    """Register the OIP v2 service for `plane` on a `grpc.aio.Server` (before `start()`);
    `triton` adds Triton's configuration, statistics and repository RPCs."""
    servicer = InferenceServicer(plane) if triton is None else TritonServicer(plane, triton)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


async def _fail(context: Any, exc: Exception, method: str, rid: str = "") -> NoReturn:
    """End the RPC with the status for `exc` (and the request id `rid` in the trailing
    metadata when given); `context.abort` always raises."""
    if not isinstance(exc, InferenceError):
        logger.exception("unexpected error in %s", method, exc_info=exc)
        exc = InferenceError(f"internal server error: {type(exc).__name__}: {exc}")
    code = _CODES.get(exc.status, grpc.StatusCode.INTERNAL)
    trailing: tuple[tuple[str, str], ...] = ((logs.REQUEST_ID_HEADER, rid),) if rid else ()
    if exc.retry_after_s is None:
        await context.abort(code, exc.message, trailing_metadata=trailing)
    else:
        retry_ms = max(1, math.ceil(exc.retry_after_s * 1000))
        await context.abort(
            code,
            f"{exc.message} (retry after {retry_ms} ms)",
            trailing_metadata=((RETRY_AFTER_METADATA, str(retry_ms)), *trailing),
        )
    raise AssertionError("grpc.aio ServicerContext.abort() returned")


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """`inference.GRPCInferenceService` over a `DataPlane`."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    async def ServerLive(  # noqa: N802 (gRPC method names; signature fixed by gRPC)
        self, _request: pb.ServerLiveRequest, _context: Any
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._plane.live())

    async def ServerReady(  # noqa: N802
        self, _request: pb.ServerReadyRequest, _context: Any
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._plane.ready())

    async def ServerMetadata(  # noqa: N802
        self, _request: pb.ServerMetadataRequest, _context: Any
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=codec.SERVER_NAME, version=sloline.__version__, extensions=codec.SERVER_EXTENSIONS
        )

    async def ModelReady(  # noqa: N802
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        try:
            ready = self._plane.model_ready(request.name, request.version)
            return pb.ModelReadyResponse(ready=ready)
        except Exception as exc:
            await _fail(context, exc, "ModelReady")

    async def ModelMetadata(  # noqa: N802
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        try:
            metadata = self._plane.model_metadata(request.name, request.version)
            return grpc_codec.metadata_to_proto(metadata)
        except Exception as exc:
            await _fail(context, exc, "ModelMetadata")

    async def ModelInfer(  # noqa: N802
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        start = time.perf_counter()
        rid = logs.request_id(_metadata(context, logs.REQUEST_ID_HEADER))
        context.set_trailing_metadata(((logs.REQUEST_ID_HEADER, rid),))
        try:
            # The model before the tensors: an unknown model is NOT_FOUND whatever it was sent.
            self._plane.check_model(request.model_name, request.model_version)
            infer_request = grpc_codec.request_from_proto(request)
            if tracing.tracer is None:
                response = await self._plane.infer(infer_request)
            else:
                response = await self._traced(infer_request, context, rid)
            answer = grpc_codec.response_to_proto(infer_request, response)
        except Exception as exc:
            status = exc.status if isinstance(exc, InferenceError) else 500
            logs.access("grpc", request.model_name, status, time.perf_counter() - start)
            await _fail(context, exc, "ModelInfer", rid)
        logs.access("grpc", request.model_name, 200, time.perf_counter() - start)
        return answer

    async def _traced(self, request: InferRequest, context: Any, rid: str) -> InferResponse:
        """The plane's answer in a server span, the child of the client's `traceparent`."""
        carrier = {item.key: str(item.value) for item in context.invocation_metadata() or ()}
        attributes = {"rpc.system": "grpc", "rpc.method": "ModelInfer", "sloline.request_id": rid}
        name = "inference.GRPCInferenceService/ModelInfer"
        with tracing.server_span(name, carrier, attributes):
            return await self._plane.infer(request)


def _metadata(context: Any, key: str) -> str | None:
    """The value of the client's metadata `key`, None when it sent none."""
    for item in context.invocation_metadata() or ():
        if item.key == key:
            return str(item.value)
    return None


class TritonServicer(InferenceServicer):
    """`InferenceServicer` plus Triton's configuration, statistics and repository RPCs."""

    def __init__(self, plane: DataPlane, triton: TritonExtensions) -> None:
        super().__init__(plane)
        self._triton = triton

    async def ModelConfig(  # noqa: N802
        self, request: pb.ModelConfigRequest, context: Any
    ) -> pb.ModelConfigResponse:
        try:
            return self._triton.config_proto(request)
        except Exception as exc:
            await _fail(context, exc, "ModelConfig")

    async def ModelStatistics(  # noqa: N802
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        try:
            return await self._triton.statistics_proto(request)
        except Exception as exc:
            await _fail(context, exc, "ModelStatistics")

    async def RepositoryIndex(  # noqa: N802
        self, _request: pb.RepositoryIndexRequest, _context: Any
    ) -> pb.RepositoryIndexResponse:
        return self._triton.index_proto()

    async def RepositoryModelLoad(  # noqa: N802
        self, _request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_SUPPORTED)
        raise AssertionError("grpc.aio ServicerContext.abort() returned")

    async def RepositoryModelUnload(  # noqa: N802
        self, _request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_SUPPORTED)
        raise AssertionError("grpc.aio ServicerContext.abort() returned")
