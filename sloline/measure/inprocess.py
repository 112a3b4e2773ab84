"""Run a pipeline inside the calling process: every stage loaded here, no router, no
workers, no network. It is the reference the served pipeline must agree with (tests) and
the floor the serving overhead is measured against (benchmarks). It walks the same DAG
semantics (`DagRun`) as the router, so conditions and skips behave identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sloline.common.tensors import Arrays, Tensor
from sloline.runtimes import StageRunner, load_pipeline_stage
from sloline.serving.dag import DagRun, ReadyStage
from sloline.spec import LoadedPipeline


class InProcessPipeline:
    def __init__(self, loaded: LoadedPipeline, *, threads: int = 1) -> None:
        self.loaded = loaded
        self.runners: dict[str, StageRunner] = {
            name: load_pipeline_stage(loaded, name, threads=threads) for name in loaded.graph.order
        }
        self.visits = dict.fromkeys(self.runners, 0)  # requests that ran each stage

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Arrays:
        return self.infer_many([inputs])[0]

    def infer_many(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        max_batch: Mapping[str, int] | None = None,
    ) -> list[Arrays]:
        """Answer `requests`, batching each stage's work up to `max_batch[stage]` (default
        all at once). Inputs carry no batch dimension, as the router passes them on."""
        runs = self._execute(requests, max_batch, None)
        return [{k: t.array() for k, t in run.output().items()} for run in runs]

    def trace(
        self, requests: Sequence[Mapping[str, np.ndarray]]
    ) -> tuple[dict[str, list[Arrays]], np.ndarray]:
        """Run `requests` and return what each stage received and the visit matrix
        (bool [request, stage in graph order]): the profiler's view of the samples."""
        seen: dict[str, list[Arrays]] = {name: [] for name in self.loaded.graph.order}
        runs = self._execute(requests, None, seen)
        order = self.loaded.graph.order
        visits = np.array([[name in run.done for name in order] for run in runs], dtype=bool)
        return seen, visits.reshape(len(runs), len(order))

    def _execute(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        max_batch: Mapping[str, int] | None,
        seen: dict[str, list[Arrays]] | None,
    ) -> list[DagRun]:
        graph = self.loaded.graph
        runs = [
            DagRun(graph, {k: Tensor.from_array(np.asarray(v)) for k, v in r.items()})
            for r in requests
        ]
        ready: dict[str, list[tuple[int, ReadyStage]]] = {name: [] for name in graph.order}
        for i, run in enumerate(runs):
            for stage in run.start():
                ready[stage.name].append((i, stage))
        for name in graph.order:
            work = ready[name]
            self.visits[name] += len(work)
            size = (max_batch or {}).get(name) or max(len(work), 1)
            for start in range(0, len(work), size):
                chunk = work[start : start + size]
                inputs = [{k: t.array() for k, t in stage.inputs.items()} for _, stage in chunk]
                if seen is not None:
                    seen[name].extend(inputs)
                results = self.runners[name].run(inputs)
                for (i, _), out in zip(chunk, results, strict=True):
                    values = {k: Tensor.from_array(v) for k, v in out.items()}
                    for nxt in runs[i].complete(name, values):
                        ready[nxt.name].append((i, nxt))
        return runs
