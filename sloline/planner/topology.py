"""The pipeline DAG as the planner and estimator see it: stages by index in topological
order, what each waits for, which of those waits propagate a skip, and the output stage.

A :class:`Topology` is the light, numpy-friendly twin of :class:`sloline.spec.PipelineGraph`
(which carries models, tensors and conditions the planner has no use for). It is built from
a graph with :meth:`Topology.from_graph`, or directly from dependency lists in tests and
benchmarks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sloline.spec.validate import PipelineGraph

__all__ = ["Topology"]


@dataclass(frozen=True, slots=True)
class Topology:
    """Stages in topological order with dependencies as indices into ``stages``.

    ``deps[m]``: stages whose completion (or skip) stage m waits for.
    ``required[m]``: the subset whose skip skips stage m too (the router skips a stage when
    a non-optional input or its condition reads a skipped stage).
    ``output``: index of the stage whose completion answers the query.
    """

    stages: tuple[str, ...]
    deps: tuple[tuple[int, ...], ...]
    required: tuple[tuple[int, ...], ...]
    output: int

    def __post_init__(self) -> None:
        n = len(self.stages)
        if n == 0:
            raise ValueError("a topology needs at least one stage")
        if len(set(self.stages)) != n:
            raise ValueError(f"duplicate stage names in {self.stages}")
        if len(self.deps) != n or len(self.required) != n:
            raise ValueError("deps and required need one entry per stage")
        for m, (deps, req) in enumerate(zip(self.deps, self.required, strict=True)):
            if any(not 0 <= d < m for d in deps) or len(set(deps)) != len(deps):
                raise ValueError(
                    f"stage {self.stages[m]!r}: deps {deps} must be distinct earlier stages "
                    "(stages are listed in topological order)"
                )
            if not set(req) <= set(deps):
                raise ValueError(f"stage {self.stages[m]!r}: required {req} not within deps")
        if not 0 <= self.output < n:
            raise ValueError(f"output index {self.output} out of range for {n} stages")

    def __len__(self) -> int:
        return len(self.stages)

    def index(self, name: str) -> int:
        try:
            return self.stages.index(name)
        except ValueError:
            raise KeyError(f"no stage {name!r} in {list(self.stages)}") from None

    @classmethod
    def chain(cls, names: Sequence[str]) -> Topology:
        """A linear pipeline: each stage reads the previous one; the last is the output."""
        deps = tuple(((m - 1,) if m else ()) for m in range(len(names)))
        return cls(tuple(names), deps, deps, len(names) - 1)

    @classmethod
    def from_deps(
        cls,
        deps: Mapping[str, Sequence[str]],
        output: str,
        optional: Mapping[str, Sequence[str]] | None = None,
    ) -> Topology:
        """From ``{stage: [stages it reads]}``; ``optional[stage]`` lists deps whose skip
        does not skip ``stage``. Stages are ordered topologically, ties in given order."""
        names = list(deps)
        unknown = {d for ds in deps.values() for d in ds} - set(names)
        if unknown:
            raise ValueError(f"dependencies on unknown stages {sorted(unknown)}")
        order: list[str] = []
        while len(order) < len(names):
            ready = [n for n in names if n not in order and all(d in order for d in deps[n])]
            if not ready:
                raise ValueError(f"cycle among {sorted(set(names) - set(order))}")
            order.append(ready[0])
        optional = optional or {}
        pos = {name: i for i, name in enumerate(order)}
        return cls(
            stages=tuple(order),
            deps=tuple(tuple(pos[d] for d in deps[n]) for n in order),
            required=tuple(
                tuple(pos[d] for d in deps[n] if d not in optional.get(n, ())) for n in order
            ),
            output=pos[output],
        )

    @classmethod
    def from_graph(cls, graph: PipelineGraph) -> Topology:
        """The topology of a validated pipeline, with the router's skip rules."""
        deps: dict[str, tuple[str, ...]] = {}
        optional: dict[str, tuple[str, ...]] = {}
        for name in graph.order:
            node = graph.stages[name]
            deps[name] = node.deps
            needed = {ref.stage for _, ref, opt in node.input_refs if ref.stage and not opt}
            if node.condition is not None:
                needed |= {stage for stage, _ in node.condition.refs if stage}
            optional[name] = tuple(d for d in node.deps if d not in needed)
        return cls.from_deps(deps, graph.pipeline.spec.output, optional)

    def longest_path(self, latency_s: Sequence[float]) -> tuple[float, tuple[str, ...]]:
        """Largest sum of per-stage latencies over any dependency path ending at the
        output, and that path (InferLine Alg. 1 line 6)."""
        finish: list[float] = []
        via: list[int] = []
        for m, deps in enumerate(self.deps):
            best = max(deps, key=lambda d: finish[d], default=-1)
            via.append(best)
            finish.append((finish[best] if best >= 0 else 0.0) + latency_s[m])
        path: list[str] = []
        m = self.output
        while m >= 0:
            path.append(self.stages[m])
            m = via[m]
        return finish[self.output], tuple(reversed(path))
