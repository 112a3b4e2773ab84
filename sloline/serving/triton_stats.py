"""Triton's model configuration, statistics and repository extensions, REST and gRPC.

Triton's tools (perf_analyzer, model-analyzer) and clients (`tritonclient.http`'s
`get_model_config`, `get_inference_statistics`, `get_model_repository_index`) ask for these
besides the Open Inference Protocol. The pipeline is one model (the router's name):

- `GET /v2/models/{m}[/versions/{v}]/config`: its configuration, built from the model
  metadata: `max_batch_size` the rows one request may carry (`RouterSettings.max_rows`),
  `dims` without that leading batch dimension, as Triton writes a batching model's;
- `GET /v2/models[/{m}[/versions/{v}]]/stats`: `TritonStats`, the pipeline as the model
  and each stage as a model of its own (named by the stage, as an ensemble's composing
  models are listed beside it);
- `POST /v2/repository/index`: the one model, READY when the router is;
  `POST /v2/repository/models/{m}/load|unload` answer 400: sloline serves a fixed pipeline.

gRPC serves the same documents as Triton's `ModelConfig`, `ModelStatistics`,
`RepositoryIndex` and `RepositoryModelLoad`/`Unload` RPCs (`TritonExtensions`).

How a pipeline's time maps onto Triton's split (queue, compute input, compute infer,
compute output; Triton counts each per request, a batch's compute time once for every
request in it):

- the pipeline: `success`/`fail` the requests answered and failed with their whole time
  in the router; `queue` the time its rows waited in stage queues, summed over the
  stages they visited (the router's `sloline_stage_queue_wait_seconds`); `compute_infer`
  the model time of the batches they were in, summed over those stages (measured in the
  workers); compute input and output 0 (the router's own work and the hops are what
  perf_analyzer shows as overhead); `batch_stats` the requests by the rows they carried,
  each with its whole time as `compute_infer`;
- a stage: per item (row) that visited it, `queue` its queue wait and `compute_infer`
  its batch's model time; `execution_count` the batches and `batch_stats` the batches by
  their size, each with its model time. Failures are counted for the pipeline only.

Counting costs the request path one dictionary update per answered request and per
batch that comes back; queue waits are read from the metrics' series when asked for.

Many routers (`sloline run --routers N`, or a router Deployment of N replicas): each
counts what it served, and serves its own document (every model, with a random id of
the router) at `LOCAL_STATS_PATH` on its metrics port. Asked for statistics, a router
fetches its peers' documents (`peers.Peers`: every peer at once, about a second at most)
and answers with the sum (`add_statistics`), so any router gives the pipeline's totals,
which only grow while every router answers. A peer that does not answer is left out
of that answer (logged when it starts and stops failing), and a router that restarts
starts its counts from 0.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from google.protobuf import json_format
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sloline.common.tensors import DataPlane, InvalidInput
from sloline.serving.peers import Peers
from sloline.serving.proto import grpc_service_pb2 as pb

Handler = Callable[[Request], Awaitable[Response]]

# A router's own statistics document, on its metrics port (`create_metrics_app`).
LOCAL_STATS_PATH = "/sloline/router-stats"

_ZERO = {"count": 0, "ns": 0}
_BATCH_FIELDS = ("compute_input", "compute_infer", "compute_output")
_KEYS = ("name", "version", "batch_size")  # what an entry is, not what it counts


class QueueWaits(Protocol):
    """A stage's queue-wait series (`metrics.Series`): its sum in seconds."""

    sum: float


def _duration(count: int, ns: float) -> dict[str, int]:
    return {"count": count, "ns": int(ns)}


def _batch_stats(sizes: Mapping[int, list[int]]) -> list[dict[str, Any]]:
    """Triton's `batch_stats`: per batch size, executions and their compute time (ns)."""
    return [
        {
            "batch_size": size,
            "compute_input": _duration(count, 0),
            "compute_infer": _duration(count, ns),
            "compute_output": _duration(count, 0),
        }
        for size, (count, ns) in sorted(sizes.items())
    ]


def _count(sizes: dict[int, list[int]], size: int, ns: int) -> None:
    entry = sizes.get(size)
    if entry is None:
        sizes[size] = [1, ns]
    else:
        entry[0] += 1
        entry[1] += ns


class TritonStats:
    """What Triton's statistics extension reports, counted by the router: requests
    answered and failed with their total durations (ns), the requests by rows, and per
    stage the batches by size with their model time. `queue_waits` are the router's
    per-stage queue-wait series (read, not written, here)."""

    __slots__ = (
        "fail_count",
        "fail_ns",
        "last_inference_ms",
        "max_batch_size",
        "queue_waits",
        "request_rows",
        "rows",
        "stage_batches",
        "success_count",
        "success_ns",
    )

    def __init__(
        self, queue_waits: Mapping[str, QueueWaits] | None = None, max_batch_size: int = 1
    ) -> None:
        self.success_count = 0
        self.success_ns = 0
        self.fail_count = 0
        self.fail_ns = 0
        self.rows = 0
        self.last_inference_ms = 0
        self.max_batch_size = max_batch_size
        self.queue_waits: Mapping[str, QueueWaits] = queue_waits or {}
        self.request_rows: dict[int, list[int]] = {}  # rows -> [requests, ns]
        self.stage_batches: dict[str, dict[int, list[int]]] = {s: {} for s in self.queue_waits}

    def success(self, latency_s: float, rows: int) -> None:
        ns = int(latency_s * 1e9)
        self.success_count += 1
        self.success_ns += ns
        self.rows += rows
        self.last_inference_ms = int(time.time() * 1000)
        _count(self.request_rows, rows, ns)

    def fail(self, latency_s: float) -> None:
        self.fail_count += 1
        self.fail_ns += int(latency_s * 1e9)

    def batch(self, stage: str, size: int, service_s: float) -> None:
        """A batch of `size` items came back from `stage`, `service_s` of model time."""
        _count(self.stage_batches[stage], size, int(service_s * 1e9))

    def _stage_totals(self, stage: str) -> tuple[int, int, int, float]:
        """(items, batches, per-item compute ns, queue ns) of one stage."""
        sizes = self.stage_batches[stage]
        items = sum(size * count for size, (count, _) in sizes.items())
        batches = sum(count for count, _ in sizes.values())
        infer_ns = sum(size * ns for size, (_, ns) in sizes.items())
        return items, batches, infer_ns, self.queue_waits[stage].sum * 1e9

    def to_json(self, name: str, version: str) -> dict[str, Any]:
        """The pipeline's entry."""
        n = self.success_count
        totals = [self._stage_totals(stage) for stage in self.stage_batches]
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.rows,
            "execution_count": n,
            "inference_stats": {
                "success": _duration(n, self.success_ns),
                "fail": _duration(self.fail_count, self.fail_ns),
                "queue": _duration(n, sum(t[3] for t in totals)),
                "compute_input": _duration(n, 0),
                "compute_infer": _duration(n, sum(t[2] for t in totals)),
                "compute_output": _duration(n, 0),
                "cache_hit": _ZERO,
                "cache_miss": _ZERO,
            },
            "batch_stats": _batch_stats(self.request_rows),
        }

    def stage_json(self, stage: str, version: str) -> dict[str, Any]:
        """One stage's entry, named by the stage."""
        items, batches, infer_ns, queue_ns = self._stage_totals(stage)
        return {
            "name": stage,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": items,
            "execution_count": batches,
            "inference_stats": {
                "success": _duration(items, queue_ns + infer_ns),
                "fail": _ZERO,
                "queue": _duration(items, queue_ns),
                "compute_input": _duration(items, 0),
                "compute_infer": _duration(items, infer_ns),
                "compute_output": _duration(items, 0),
                "cache_hit": _ZERO,
                "cache_miss": _ZERO,
            },
            "batch_stats": _batch_stats(self.stage_batches[stage]),
        }


def add_statistics(total: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """`total` plus another router's statistics document (`{"model_stats": [...]}`), as
    a new document: per model (by name) every count and ns summed, `last_inference` the
    later, `batch_stats` added by batch size. The models, their fields and their order
    are `total`'s: a model or field `other` lacks adds nothing, one only it has is left
    out (routers of two sloline versions still add up). ValueError when `other` is not
    such a document (a number where `total` has a number, and so on)."""
    out = copy.deepcopy(dict(total))
    by_name = {entry["name"]: entry for entry in out["model_stats"]}
    entries = other["model_stats"]
    if not isinstance(entries, list):
        raise ValueError("model_stats is not a list")
    for entry in entries:
        into = by_name.get(_field(entry, "name", str))
        if into is not None:
            _add(into, entry)
    return out


def _field(doc: Any, key: str, kind: type) -> Any:
    if not isinstance(doc, dict):
        raise ValueError(f"{type(doc).__name__} where an object belongs")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{key}: {type(value).__name__}, not {kind.__name__}")
    return value


def _add(into: dict[str, Any], other: Any) -> None:
    """Add `other`'s numbers into `into`'s, field by field (`into` names the fields)."""
    if not isinstance(other, dict):
        raise ValueError(f"{type(other).__name__} where an object belongs")
    for key, mine in into.items():
        if key not in other or key in _KEYS:
            continue
        if key == "batch_stats":
            into[key] = _add_batches(mine, other[key])
        elif isinstance(mine, dict):
            _add(mine, other[key])
        elif key == "last_inference":
            into[key] = max(mine, _field(other, key, int))
        else:
            into[key] = mine + _field(other, key, int)


def _add_batches(mine: list[dict[str, Any]], other: Any) -> list[dict[str, Any]]:
    if not isinstance(other, list):
        raise ValueError("batch_stats is not a list")
    by_size = {b["batch_size"]: b for b in mine}
    for batch in other:
        size = _field(batch, "batch_size", int)
        into = by_size.get(size)
        if into is None:
            into = by_size[size] = {"batch_size": size, **{f: dict(_ZERO) for f in _BATCH_FIELDS}}
        _add(into, batch)
    return [by_size[size] for size in sorted(by_size)]


def model_config(
    plane: DataPlane, name: str, version: str = "", max_batch_size: int = 1
) -> dict[str, Any]:
    """Triton's model configuration (JSON form) of the pipeline `name`, whose requests
    carry 1 to `max_batch_size` rows (the metadata's leading -1)."""
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
        "max_batch_size": max_batch_size,
        "input": tensors(meta.inputs),
        "output": tensors(meta.outputs),
    }


NOT_SUPPORTED = "sloline serves a fixed pipeline: model load and unload are not supported"


class TritonExtensions:
    """The extensions' documents for the pipeline `name` served by `plane`; statistics
    summed with those of the pipeline's other routers, `peers` (module docstring)."""

    def __init__(
        self, plane: DataPlane, name: str, stats: TritonStats, peers: Peers | None = None
    ) -> None:
        self.plane = plane
        self.name = name
        self.stats = stats
        self.peers = peers or Peers()
        self.id = secrets.token_hex(8)  # tells this router's own document from its peers'

    def config(self, name: str, version: str = "") -> dict[str, Any]:
        return model_config(self.plane, name, version, self.stats.max_batch_size)

    def local(self) -> dict[str, Any]:
        """This router's own counts of every model (the pipeline's, then its stages'),
        with its id: what it serves its peers at `LOCAL_STATS_PATH`."""
        latest = self.plane.model_metadata(self.name).versions[-1]
        stats = self.stats
        stages = [stats.stage_json(s, latest) for s in stats.stage_batches if s != self.name]
        return {"router": self.id, "model_stats": [stats.to_json(self.name, latest), *stages]}

    async def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """All models' statistics (the pipeline's, then its stages'), or `name`'s (at
        `version`) when given: the pipeline's or a stage's; summed over every router
        that answers."""
        wanted = ""
        if name and name != self.name and name in self.stats.stage_batches:
            self.plane.check_model(self.name, version)  # the version, as the pipeline's
            wanted = name
        elif name:
            self.plane.check_model(name, version)
            wanted = self.name
        total = self.local()
        seen = {self.id}

        def add(doc: Any) -> None:
            nonlocal total
            router = _field(doc, "router", str)
            if router not in seen:  # this router, or one reached by two addresses
                total = add_statistics(total, doc)
                seen.add(router)

        await self.peers.gather(LOCAL_STATS_PATH, add)
        entries = total["model_stats"]
        if wanted:
            entries = [next(e for e in entries if e["name"] == wanted)]
        return {"model_stats": entries}

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

    async def statistics_proto(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        doc = await self.statistics(request.name, request.version)
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
        name = request.path_params.get("name", "")
        return json(await ext.statistics(name, _version(request)))

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
