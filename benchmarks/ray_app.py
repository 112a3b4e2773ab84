"""Ray Serve running the same pipeline, for the serving benchmark's comparison.

Model composition the way Ray Serve documents it: an ingress deployment receives the HTTP
request and calls one deployment per stage through `DeploymentHandle`s, in the
pipeline's dependency order (stages whose dependencies are done run concurrently). Each
stage deployment loads the *same* stage with sloline's runtime adapters
(`load_pipeline_stage`, same thread budget) and batches with `@serve.batch` at the same
max batch size sloline uses. `batch_wait_timeout_s=0`: a batch is whatever is queued
when the replica is free, which is exactly sloline's queue rule (sloline never waits
for a batch to fill).

Wire format: the request body is the raw bytes of the pipeline's single input (shape from
the spec, one variable dimension inferred from the length); the response body is the
raw bytes of the output stage's tensors, in declaration order.

Run as a process: `python benchmarks/ray_app.py PIPELINE --port P --max-batch S=B
--threads S=T`. The Ray mode comes from the environment it is started with
(`RAY_SERVE_THROUGHPUT_OPTIMIZED=1` and `RAY_SERVE_ENABLE_HA_PROXY=1` for the
high-throughput mode; both are read by Ray at import time). It prints one JSON line
`{"ready": ...}` when the application answers, then serves until stdin closes.

Set up like sloline, so neither side is handicapped: no per-request access log in any
deployment or the proxy (sloline writes none; `serve.run(logging_config=...)`), and the
orchestrator starts Ray with `RAY_worker_niceness=0` (`systems.py`), so its replicas run
at the same priority as sloline's router and workers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from typing import Any

import numpy as np

STAGE_MAX_ONGOING = 256  # per stage replica: enough queued work for full batches
INGRESS_MAX_ONGOING = 1024  # more than any closed-loop concurrency the benchmark uses


def build_app(pipeline_file: str, max_batch: dict[str, int], threads: dict[str, int]) -> Any:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    from sloline.common.tensors import DTYPES
    from sloline.spec import load_pipeline

    loaded = load_pipeline(pipeline_file)
    graph = loaded.graph
    if any(node.condition is not None for node in graph.stages.values()):
        raise SystemExit("the Ray Serve comparison supports pipelines without `when` conditions")
    if len(graph.inputs) != 1:
        raise SystemExit("the Ray Serve comparison supports pipelines with one input tensor")

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=STAGE_MAX_ONGOING)
    class Stage:
        def __init__(self, pipeline_file: str, name: str, threads: int, batch: int) -> None:
            from sloline.runtimes import load_pipeline_stage

            self.runner = load_pipeline_stage(load_pipeline(pipeline_file), name, threads=threads)
            self.runner.warmup()
            self.run_batch.set_max_batch_size(batch)

        @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
        async def run_batch(self, items: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
            return self.runner.run(items)

        async def __call__(self, item: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return await self.run_batch(item)

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=INGRESS_MAX_ONGOING)
    class Ingress:
        def __init__(self, pipeline_file: str, handles: dict[str, Any]) -> None:
            self.graph = load_pipeline(pipeline_file).graph
            self.handles = handles
            spec = self.graph.inputs[0]
            self.input_name, self.dtype = spec.name, DTYPES[spec.datatype]
            self.shape = list(spec.shape)
            self.outputs = [t.name for t in self.graph.output.spec.outputs]

        def decode(self, body: bytes) -> np.ndarray:
            array = np.frombuffer(body, dtype=self.dtype)
            known = math.prod(d for d in self.shape if d != -1)
            shape = [array.size // known if d == -1 else d for d in self.shape]
            return array.reshape(shape)

        async def __call__(self, request: Request) -> Response:
            graph = self.graph
            values: dict[str, dict[str, np.ndarray]] = {
                "": {self.input_name: self.decode(await request.body())}
            }
            pending = {name: len(node.deps) for name, node in graph.stages.items()}
            ready = [name for name, count in pending.items() if count == 0]
            while ready:
                calls = []
                for name in ready:
                    refs = graph.stages[name].input_refs
                    item = {k: values[ref.stage][ref.tensor] for k, ref, _ in refs}
                    calls.append(self.handles[name].remote(item))
                results = await asyncio.gather(*calls)
                released = []
                for name, out in zip(ready, results, strict=True):
                    values[name] = out
                    for child in graph.children[name]:
                        pending[child] -= 1
                        if pending[child] == 0:
                            released.append(child)
                ready = released
            out = values[graph.output.name]
            body = b"".join(np.ascontiguousarray(out[n]).tobytes() for n in self.outputs)
            return Response(body, media_type="application/octet-stream")

    handles = {
        name: Stage.options(name=f"stage_{name}").bind(
            pipeline_file, name, threads.get(name, 1), max_batch.get(name, 1)
        )
        for name in graph.order
    }
    return Ingress.bind(pipeline_file, handles)


def _assignments(values: list[str]) -> dict[str, int]:
    return {k: int(v) for k, _, v in (s.partition("=") for s in values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch", action="append", default=[], metavar="STAGE=B")
    parser.add_argument("--threads", action="append", default=[], metavar="STAGE=T")
    parser.add_argument("--num-cpus", type=int, default=None)
    parser.add_argument("--object-store-mb", type=int, default=512)
    args = parser.parse_args()

    import ray
    from ray import serve

    start = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=args.num_cpus,
        include_dashboard=False,
        object_store_memory=args.object_store_mb * 1024 * 1024,
        log_to_driver=False,
        logging_level="WARNING",
    )
    quiet = {"enable_access_log": False}  # sloline logs no line per request either
    serve.start(http_options={"host": "127.0.0.1", "port": args.port}, logging_config=quiet)
    app = build_app(args.pipeline, _assignments(args.max_batch), _assignments(args.threads))
    serve.run(app, name="pipeline", route_prefix="/", blocking=False, logging_config=quiet)
    print(json.dumps({"ready": True, "startup_s": time.perf_counter() - start}), flush=True)
    try:
        sys.stdin.read()  # the orchestrator closes stdin to stop us
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
