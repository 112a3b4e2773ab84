"""Per-request DAG execution state: which stages are ready, done or skipped.

The router and the in-process executor both drive a request through the pipeline with a
`DagRun`: `start()` and `complete(stage, outputs)` return the stages that became ready,
with their model inputs gathered. Conditions are evaluated the moment a stage's
dependencies have finished; a false condition skips the stage, and a stage that needs a
required value from a skipped stage is skipped too. This is pure bookkeeping: no I/O, no
clocks, no threads. What every run of a graph shares (`DagShape`) is computed once; the
router runs one `DagRun` per request, so a run copies one small dict and adds to two sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from sloline.common.tensors import StageFailed, Tensor
from sloline.spec import PipelineGraph
from sloline.spec.condition import ConditionError
from sloline.spec.validate import StageNode


@dataclass(frozen=True, slots=True)
class ReadyStage:
    name: str
    inputs: dict[str, Tensor]  # model input name -> value


@dataclass(frozen=True, slots=True)
class DagShape:
    """The parts of a `PipelineGraph` every run reads, resolved once."""

    stages: dict[str, StageNode]
    children: dict[str, tuple[str, ...]]
    pending: dict[str, int]  # per stage: dependencies not finished yet, at the start
    roots: tuple[str, ...]
    output: str

    @staticmethod
    def of(graph: PipelineGraph) -> DagShape:
        pending = {name: len(node.deps) for name, node in graph.stages.items()}
        return DagShape(
            stages=graph.stages,
            children={name: graph.children.get(name, ()) for name in graph.stages},
            pending=pending,
            roots=tuple(name for name, count in pending.items() if count == 0),
            output=graph.pipeline.spec.output,
        )


class DagRun:
    """The progress of one request through a `PipelineGraph` (or its `DagShape`)."""

    __slots__ = ("_pending", "_shape", "_values", "done", "skipped")

    def __init__(self, graph: PipelineGraph | DagShape, inputs: Mapping[str, Tensor]) -> None:
        self._shape = graph if isinstance(graph, DagShape) else DagShape.of(graph)
        self._values: dict[str, Mapping[str, Tensor]] = {"": inputs}
        self._pending = self._shape.pending.copy()
        self.done: set[str] = set()
        self.skipped: set[str] = set()

    @property
    def finished(self) -> bool:
        out = self._shape.output
        return out in self.done or out in self.skipped

    def output(self) -> dict[str, Tensor]:
        """The output stage's values; raises `StageFailed` if the output stage was skipped."""
        out = self._shape.output
        if out in self.skipped:
            raise StageFailed(
                f"output stage {out!r} was skipped (its condition or a required input's "
                "producer was skipped); give it optional inputs or no condition"
            )
        return dict(self._values[out])

    def start(self) -> list[ReadyStage]:
        return self._settle(list(self._shape.roots))

    def complete(self, stage: str, outputs: Mapping[str, Tensor]) -> list[ReadyStage]:
        """Record `stage`'s outputs and return the stages that became ready."""
        self._values[stage] = outputs
        self.done.add(stage)
        return self._settle(self._release(stage))

    def _release(self, stage: str) -> list[str]:
        released = []
        pending = self._pending
        for child in self._shape.children[stage]:
            pending[child] -= 1
            if pending[child] == 0:
                released.append(child)
        return released

    def _settle(self, candidates: list[str]) -> list[ReadyStage]:
        """Decide run-or-skip for stages whose deps are finished; skips cascade."""
        ready: list[ReadyStage] = []
        while candidates:
            name = candidates.pop(0)
            inputs = self._gather(name)
            if inputs is None:
                self.skipped.add(name)
                candidates.extend(self._release(name))
            else:
                ready.append(ReadyStage(name, inputs))
        return ready

    def _gather(self, name: str) -> dict[str, Tensor] | None:
        node = self._shape.stages[name]
        inputs: dict[str, Tensor] = {}
        for input_name, ref, optional in node.input_refs:
            if ref.stage in self.skipped:
                if optional:
                    continue
                return None
            inputs[input_name] = self._values[ref.stage][ref.tensor]
        if node.condition is not None:
            views = {  # a skipped stage is absent: has() is false, reading it skips
                stage: _ArrayView(self._values[stage])
                for stage in {s for s, _ in node.condition.refs}
                if stage not in self.skipped
            }
            try:
                if not node.condition(views):
                    return None
            except ConditionError as exc:
                raise StageFailed(f"stage {name!r}: {exc}") from exc
        return inputs


class _ArrayView(Mapping[str, np.ndarray]):
    """Read tensors as numpy arrays lazily, for condition evaluation."""

    __slots__ = ("_tensors",)

    def __init__(self, tensors: Mapping[str, Tensor]) -> None:
        self._tensors = tensors

    def __getitem__(self, key: str) -> np.ndarray:
        return self._tensors[key].array()

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)
