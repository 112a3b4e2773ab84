"""Whole-pipeline validation and the compiled DAG every other part executes or simulates.

`build_graph` checks what a per-field schema cannot: unique names, references that
resolve, conditions that parse and read only upstream values, no cycles, an output stage
that exists. Every problem is reported with the exact field path (`spec.stages[2].inputs[0].from`)
and a reason, all of them at once, so a user fixes a file in one pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sloline.common.trace import MAX_PLANNING_ARRIVALS, arrival_problem
from sloline.spec.condition import Condition, ConditionError, parse_condition
from sloline.spec.models import PredictionPipeline, StageSpec, TensorSpec
from sloline.spec.paths import path_issues
from sloline.spec.shaping import template_issues


@dataclass(frozen=True, slots=True)
class Issue:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class PipelineError(ValueError):
    """An invalid pipeline: `issues` lists every problem with its field path."""

    def __init__(self, issues: list[Issue], source: str = "pipeline") -> None:
        self.issues = issues
        self.source = source
        lines = "\n".join(f"  - {issue}" for issue in issues)
        super().__init__(f"{source} is invalid ({len(issues)} problem(s)):\n{lines}")


@dataclass(frozen=True, slots=True)
class Ref:
    """Where a value comes from: `stage == ""` means a pipeline input."""

    stage: str
    tensor: str

    @staticmethod
    def parse(text: str, stage_names: set[str]) -> Ref:
        head, dot, tail = text.partition(".")
        if dot and head in stage_names:
            return Ref(head, tail)
        return Ref("", text)

    def __str__(self) -> str:
        return f"{self.stage}.{self.tensor}" if self.stage else self.tensor


@dataclass(frozen=True, slots=True)
class StageNode:
    """A stage as the runtime sees it: its spec, what it waits for and its condition."""

    spec: StageSpec
    index: int
    deps: tuple[str, ...]  # stages whose completion (or skip) this stage waits for
    input_refs: tuple[tuple[str, Ref, bool], ...]  # (model input name, source, optional)
    condition: Condition | None

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True, slots=True)
class PipelineGraph:
    pipeline: PredictionPipeline
    stages: dict[str, StageNode]
    order: tuple[str, ...]  # a topological order
    children: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.pipeline.metadata.name

    @property
    def output(self) -> StageNode:
        return self.stages[self.pipeline.spec.output]

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.pipeline.spec.inputs

    def longest_path(self, latency: dict[str, float]) -> float:
        """Largest sum of `latency` over any dependency path (InferLine Alg. 1 line 6)."""
        finish: dict[str, float] = {}
        for name in self.order:
            node = self.stages[name]
            start = max((finish[d] for d in node.deps), default=0.0)
            finish[name] = start + latency[name]
        return max(finish.values())


@dataclass(frozen=True, slots=True)
class _Names:
    """What references resolve against."""

    stages: set[str]
    inputs: set[str]
    outputs: Mapping[str, Mapping[str, object]]


def build_graph(pipeline: PredictionPipeline) -> PipelineGraph:
    """Check the pipeline's structure and return its DAG; raise `PipelineError` if invalid."""
    spec = pipeline.spec
    names = _Names(
        {s.name for s in spec.stages},
        {t.name for t in spec.inputs},
        {s.name: {t.name: t for t in s.outputs} for s in spec.stages},
    )
    issues = _check_names(pipeline) + _check_workload(pipeline) + _check_replicas(pipeline)
    issues += [Issue(path, reason) for path, reason in path_issues(pipeline)]
    issues += [Issue(p, r) for p, r in template_issues(spec, pipeline.metadata.annotations)]
    nodes: dict[str, StageNode] = {}
    for i, stage in enumerate(spec.stages):
        node, found = _stage_node(i, stage, names)
        nodes[stage.name] = node
        issues += found
    if spec.output not in names.stages:
        issues.append(
            Issue("spec.output", f"no stage named {spec.output!r}; stages: {sorted(names.stages)}")
        )
    order, cycle = _toposort(nodes)
    if cycle:
        first = nodes[cycle[0]].index
        issues.append(
            Issue(f"spec.stages[{first}].inputs", "cycle: " + " -> ".join([*cycle, cycle[0]]))
        )
    if issues:
        raise PipelineError(issues, source=f"pipeline {pipeline.metadata.name!r}")
    children: dict[str, list[str]] = {n: [] for n in nodes}
    for node in nodes.values():
        for dep in node.deps:
            children[dep].append(node.name)
    return PipelineGraph(pipeline, nodes, tuple(order), {k: tuple(v) for k, v in children.items()})


def _check_names(pipeline: PredictionPipeline) -> list[Issue]:
    spec, issues = pipeline.spec, []
    input_names = [t.name for t in spec.inputs]
    for i, name in enumerate(input_names):
        if name in input_names[:i]:
            issues.append(Issue(f"spec.inputs[{i}].name", f"duplicate input {name!r}"))
    stage_names = [s.name for s in spec.stages]
    for i, name in enumerate(stage_names):
        if name in stage_names[:i]:
            issues.append(Issue(f"spec.stages[{i}].name", f"duplicate stage {name!r}"))
        if name in input_names:
            issues.append(
                Issue(f"spec.stages[{i}].name", f"{name!r} is also a pipeline input name")
            )
    for i, stage in enumerate(spec.stages):
        for field_name, tensors in (("inputs", stage.inputs), ("outputs", stage.outputs)):
            seen = [t.name for t in tensors]
            for j, name in enumerate(seen):
                if name in seen[:j]:
                    issues.append(
                        Issue(f"spec.stages[{i}].{field_name}[{j}].name", f"duplicate {name!r}")
                    )
    return issues


def _check_workload(pipeline: PredictionPipeline) -> list[Issue]:
    workload = pipeline.spec.workload
    given = [workload.rate_rps is not None, workload.trace is not None, bool(workload.trace_uri)]
    if sum(given) != 1:
        return [Issue("spec.workload", "give exactly one of rateRps, trace or traceUri")]
    if workload.trace is not None:
        problem = arrival_problem(workload.trace)
        return [Issue("spec.workload.trace", problem)] if problem else []
    if workload.rate_rps is not None:
        expected = workload.rate_rps * workload.duration_s
        if expected > MAX_PLANNING_ARRIVALS:
            return [
                Issue(
                    "spec.workload",
                    f"rateRps x durationS is {expected:,.0f} arrivals; the planner simulates "
                    f"at most {MAX_PLANNING_ARRIVALS:,} arrivals per planning trace "
                    "(lower durationS)",
                )
            ]
    return []


def _check_replicas(pipeline: PredictionPipeline) -> list[Issue]:
    return [
        Issue(
            f"spec.stages[{i}].minReplicas",
            f"minReplicas {stage.min_replicas} is above maxReplicas {stage.max_replicas}",
        )
        for i, stage in enumerate(pipeline.spec.stages)
        if stage.min_replicas is not None
        and stage.max_replicas is not None
        and stage.min_replicas > stage.max_replicas
    ]


def _stage_node(i: int, stage: StageSpec, names: _Names) -> tuple[StageNode, list[Issue]]:
    """One stage's dependencies, input sources and condition, with their problems."""
    path = f"spec.stages[{i}]"
    issues = _check_model(stage, path)
    deps: list[str] = []
    refs: list[tuple[str, Ref, bool]] = []
    for j, item in enumerate(stage.inputs):
        ref = Ref.parse(item.from_, names.stages)
        problem = _check_ref(ref, stage.name, names.inputs, names.outputs)
        if problem:
            issues.append(Issue(f"{path}.inputs[{j}].from", problem))
        if item.optional and stage.model.runtime != "python":
            issues.append(
                Issue(f"{path}.inputs[{j}].optional", "optional inputs are only for python stages")
            )
        if ref.stage and ref.stage not in deps:
            deps.append(ref.stage)
        refs.append((item.name, ref, item.optional))
    condition = None
    if stage.when is not None:
        condition, found, read = _condition(stage.when, stage.name, names, f"{path}.when")
        issues += found
        deps += [name for name in read if name not in deps]
    return StageNode(stage, i, tuple(deps), tuple(refs), condition), issues


def _condition(
    text: str, stage: str, names: _Names, path: str
) -> tuple[Condition | None, list[Issue], list[str]]:
    """The stage's parsed condition, its problems and the stages it reads."""
    try:
        condition = parse_condition(text)
    except ConditionError as exc:
        return None, [Issue(path, str(exc))], []
    issues, read = [], []
    for ref_stage, tensor_name in sorted(condition.refs):
        ref = Ref(ref_stage, tensor_name)
        problem = _check_ref(ref, stage, names.inputs, names.outputs)
        if problem:
            issues.append(Issue(path, problem))
        elif ref.stage:
            read.append(ref.stage)
    return condition, issues, read


def reference_issues(data: Mapping[str, Any]) -> list[Issue]:
    """The reference checks of `build_graph` (`from`, `when`, `output`) on a decoded
    document whose types are wrong, so that they are reported beside the type errors;
    parts of the wrong shape are left to those."""
    spec = data.get("spec")
    if not isinstance(spec, dict):
        return []
    named = [(i, s) for i, s in enumerate(_dicts(spec.get("stages"))) if _str(s, "name")]
    names = _Names(
        {s["name"] for _, s in named},
        {t["name"] for t in _dicts(spec.get("inputs")) if _str(t, "name")},
        {
            s["name"]: {t["name"]: None for t in _dicts(s.get("outputs")) if _str(t, "name")}
            for _, s in named
        },
    )
    issues = []
    for i, stage in named:
        for j, item in enumerate(_dicts(stage.get("inputs"))):
            if _str(item, "from"):
                ref = Ref.parse(item["from"], names.stages)
                problem = _check_ref(ref, stage["name"], names.inputs, names.outputs)
                if problem:
                    issues.append(Issue(f"spec.stages[{i}].inputs[{j}].from", problem))
        if _str(stage, "when"):
            issues += _condition(stage["when"], stage["name"], names, f"spec.stages[{i}].when")[1]
    if _str(spec, "output") and spec["output"] not in names.stages:
        issues.append(
            Issue(
                "spec.output", f"no stage named {spec['output']!r}; stages: {sorted(names.stages)}"
            )
        )
    return issues


def _dicts(value: Any) -> list[dict[str, Any]]:
    """A list's items as mappings (others as empty ones, so positions hold)."""
    return [v if isinstance(v, dict) else {} for v in value] if isinstance(value, list) else []


def _str(item: Mapping[str, Any], key: str) -> bool:
    return isinstance(item.get(key), str)


def _check_model(stage: StageSpec, path: str) -> list[Issue]:
    model = stage.model
    if model.runtime == "python":
        if not model.entrypoint:
            return [Issue(f"{path}.model.entrypoint", "python stages need module:attr")]
        if model.uri:
            return [Issue(f"{path}.model.uri", "python stages take entrypoint, not uri")]
        if model.storage_uri:
            return [
                Issue(
                    f"{path}.model.storageUri",
                    "python stages load from the model directory; storageUri is for "
                    "onnx and torchscript stages",
                )
            ]
        return []
    issues = []
    if not model.uri and not model.storage_uri:
        issues.append(Issue(f"{path}.model.uri", f"{model.runtime} stages need a model file"))
    if model.entrypoint:
        issues.append(Issue(f"{path}.model.entrypoint", f"not used by {model.runtime} stages"))
    if model.config:
        issues.append(Issue(f"{path}.model.config", f"not used by {model.runtime} stages"))
    return issues


def _check_ref(
    ref: Ref, stage: str, inputs: set[str], outputs: Mapping[str, Mapping[str, object]]
) -> str | None:
    if not ref.stage:
        if ref.tensor in inputs:
            return None
        return (
            f"{ref.tensor!r} is neither a pipeline input ({sorted(inputs)}) nor "
            f"stage.tensor of a known stage"
        )
    if ref.stage == stage:
        return f"stage {stage!r} cannot read its own output"
    if ref.tensor not in outputs[ref.stage]:
        return f"stage {ref.stage!r} has no output {ref.tensor!r} ({sorted(outputs[ref.stage])})"
    return None


def _toposort(nodes: dict[str, StageNode]) -> tuple[list[str], list[str]]:
    """Kahn's algorithm in declaration order; returns (order, a cycle if any)."""
    indegree = {name: len(node.deps) for name, node in nodes.items()}
    children: dict[str, list[str]] = {name: [] for name in nodes}
    for node in nodes.values():
        for dep in node.deps:
            if dep in children:
                children[dep].append(node.name)
    ready = [name for name in nodes if indegree[name] == 0]
    order: list[str] = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for child in children[name]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(order) == len(nodes):
        return order, []
    # Walk dependencies among the leftover nodes until a node repeats: that is a cycle.
    left = [n for n in nodes if n not in order]
    path, current = [], left[0]
    while current not in path:
        path.append(current)
        current = next(d for d in nodes[current].deps if d in left)
    return order, path[path.index(current) :][::-1]
