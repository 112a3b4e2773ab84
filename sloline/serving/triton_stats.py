"""Triton's model configuration, statistics and repository extensions, REST and gRPC.

Triton's tools (perf_analyzer, model-analyzer) and clients (`tritonclient.http`'s
`get_model_config`, `get_inference_statistics`, `get_model_repository_index`) ask for these
besides the Open Inference Protocol. The pipeline is one model (the router's name):

- `GET /v2/models/{m}[/versions/{v}]/config`: its configuration, built from the model
  metadata (batch dimension first, so `max_batch_size` 1 and `dims` without it);
- `GET /v2/models[/{m}[/versions/{v}]]/stats`: `TritonStats`, counted by the router once
  per request when it is answered (two integer adds and a clock read);
- `POST /v2/repository/index`: the one model, READY when the router is;
  `POST /v2/repository/models/{m}/load|unload` answer 400: sloline serves a fixed pipeline.

gRPC serves the same documents as Triton's `ModelConfig`, `ModelStatistics`,
`RepositoryIndex` and `RepositoryModelLoad`/`Unload` RPCs (`TritonExtensions`).

Triton splits a request's time into queue, compute input, compute infer and compute
output; a pipeline's request crosses several stage queues and workers, so sloline reports
the request's whole time as `compute_infer` and 0 for the others. The per-stage queue and
service times are in the Prometheus metrics.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sloline.common.tensors import DataPlane, InvalidInput
from sloline.serving.proto import grpc_service_pb2 as pb

Handler = Callable[[Request], Awaitable[Response]]

_ZERO = {"count": 0, "ns": 0}


class TritonStats:
    """Per-model request counts and total durations (ns), Triton's statistics extension."""

    __slots__ = (
        "fail_count",
        "fail_ns",
        "last_inference_ms",
        "rows",
        "success_count",
        "success_ns",
    )

    def __init__(self) -> None:
        self.success_count = 0
        self.success_ns = 0
        self.fail_count = 0
        self.fail_ns = 0
        self.rows = 0
        self.last_inference_ms = 0

    def success(self, latency_s: float, rows: int) -> None:
        self.success_count += 1
        self.success_ns += int(latency_s * 1e9)
        self.rows += rows
        self.last_inference_ms = int(time.time() * 1000)

    def fail(self, latency_s: float) -> None:
        self.fail_count += 1
        self.fail_ns += int(latency_s * 1e9)

    def to_json(self, name: str, version: str) -> dict[str, Any]:
        ok = {"count": self.success_count, "ns": self.success_ns}
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.rows,
            "execution_count": self.success_count,
            "inference_stats": {
                "success": ok,
                "fail": {"count": self.fail_count, "ns": self.fail_ns},
                "queue": {"count": self.success_count, "ns": 0},
                "compute_input": {"count": self.success_count, "ns": 0},
                "compute_infer": ok,
                "compute_output": {"count": self.success_count, "ns": 0},
                "cache_hit": _ZERO,
                "cache_miss": _ZERO,
            },
            "batch_stats": [],
        }


def model_config(plane: DataPlane, name: str, version: str = "") -> dict[str, Any]:
    """Triton's model configuration (JSON form) of the pipeline `name`."""
    meta = plane.model_metadata(name, version)

    def tensors(ts: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "data_type": "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}",
                "dims": list(t.shape[1:]),
            }
            for t in ts
        ]

    return {
        "name": meta.name,
        "platform": meta.platform,
        "backend": "",
        "version_policy": {"specific": {"versions": [int(v) for v in meta.versions]}},
        "max_batch_size": 1,
        "input": tensors(meta.inputs),
        "output": tensors(meta.outputs),
    }


NOT_SUPPORTED = "sloline serves a fixed pipeline: model load and unload are not supported"


class TritonExtensions:
    """The extensions' documents for the pipeline `name` served by `plane`."""

    def __init__(self, plane: DataPlane, name: str, stats: TritonStats) -> None:
        self.plane = plane
        self.name = name
        self.stats = stats

    def config(self, name: str, version: str = "") -> dict[str, Any]:
        return model_config(self.plane, name, version)

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """All models' statistics, or `name`'s (at `version`) when given."""
        if name:
            self.plane.check_model(name, version)
        latest = self.plane.model_metadata(self.name).versions[-1]
        return {"model_stats": [self.stats.to_json(self.name, latest)]}

    def index(self) -> list[dict[str, str]]:
        state = "READY" if self.plane.ready() else "UNAVAILABLE"
        versions = self.plane.model_metadata(self.name).versions
        return [{"name": self.name, "version": v, "state": state} for v in versions]

    def load(self, name: str) -> None:
        self.plane.check_model(name)
        raise InvalidInput(NOT_SUPPORTED)

    # gRPC: the same documents as Triton's messages.
    def config_proto(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        doc = self.config(request.name, request.version)
        config = json_format.ParseDict(doc, pb.ModelConfig(), ignore_unknown_fields=True)
        return pb.ModelConfigResponse(config=config)

    def statistics_proto(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        doc = self.statistics(request.name, request.version)
        out = pb.ModelStatisticsResponse()
        json_format.ParseDict(doc, out, ignore_unknown_fields=True)
        return out

    def index_proto(self) -> pb.RepositoryIndexResponse:
        out = pb.RepositoryIndexResponse()
        json_format.ParseDict({"models": self.index()}, out)
        return out


def triton_routes(
    ext: TritonExtensions,
    json: Callable[[Any], Response],
    guarded: Callable[[Handler], Handler],
) -> list[Route]:
    """The REST routes of the extensions, for the front door's route table (before
    `/v2/models/{name}`, which would take `/v2/models/stats`)."""

    def _version(request: Request) -> str:
        return str(request.path_params.get("version", ""))

    async def config(request: Request) -> Response:
        return json(ext.config(request.path_params["name"], _version(request)))

    async def statistics(request: Request) -> Response:
        return json(ext.statistics(request.path_params.get("name", ""), _version(request)))

    async def index(_: Request) -> Response:
        return json(ext.index())

    async def load(request: Request) -> Response:
        ext.load(request.path_params["name"])
        raise AssertionError("TritonExtensions.load returned")

    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"
    return [
        Route("/v2/models/stats", guarded(statistics), methods=["GET"]),
        Route(f"{model}/config", guarded(config), methods=["GET"]),
        Route(f"{versioned}/config", guarded(config), methods=["GET"]),
        Route(f"{model}/stats", guarded(statistics), methods=["GET"]),
        Route(f"{versioned}/stats", guarded(statistics), methods=["GET"]),
        Route("/v2/repository/index", guarded(index), methods=["POST"]),
        Route("/v2/repository/models/{name}/load", guarded(load), methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", guarded(load), methods=["POST"]),
    ]
