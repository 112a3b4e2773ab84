"""From spec to plan on Kubernetes: which profiles a pipeline needs, the profile cache, and
planning from profiling Jobs' messages. Pure functions: no API calls, no clock.

Each (stage, hardware class) is profiled once per *cache key* `<stage>.<hardware>.<digest>`.
The digest covers what the measurement depends on: the stage's spec and the specs of every
stage upstream of it (they produce its inputs and decide whether it runs), the pipeline's
inputs and samples, the hardware class, the runtime image, the batch cap and the model
directory. So a spec change re-profiles exactly the stages it can affect: the changed
stage and everything downstream of it.

Each message also carries the visit matrix of the pipeline's samples (conditional
routing, InferLine §4.1). A message measured under an older spec may carry stale routing,
so the cache records, per entry, the digest of the whole dataflow it was measured under;
messages measured under the current dataflow go last when assembling, and
`assemble_profile` takes the routing of the newest one. Any dataflow change changes some
stage's key, so at least one such message always exists.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from sloline.operator.exposure import exposure_issues
from sloline.operator.naming import ANNOTATION_MODEL_DIR, Target, digest, model_dir_problem
from sloline.operator.pods import pod_issues
from sloline.operator.settings import OperatorSettings
from sloline.planner.plan import Plan
from sloline.planner.profile import PipelineProfile
from sloline.planner.profile_message import ProfileMessage, assemble_profile, decode_message
from sloline.spec import Issue, PipelineError, PipelineGraph
from sloline.spec.models import STAGE_KUBERNETES_ONLY

RESERVED_STAGE_NAMES = frozenset({"router", "config", "profiles"})
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProfileTask:
    """One (stage, hardware class) profile the plan needs, and its cache key."""

    stage: str
    hardware: str
    key: str


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A cached profile message, decoded once, and the dataflow digest it was measured
    under."""

    message: str
    dataflow: str
    decoded: ProfileMessage = field(compare=False, repr=False)

    @classmethod
    def of(cls, message: str, dataflow: str) -> CacheEntry:
        """The entry of a message; ValueError when it is not a profile message."""
        return cls(message, dataflow, decode_message(message))

    def to_text(self) -> str:
        return json.dumps({"dataflow": self.dataflow, "message": self.message}, sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> CacheEntry:
        doc = json.loads(text)
        return cls.of(str(doc["message"]), str(doc["dataflow"]))


def object_issues(
    obj: Mapping[str, Any], settings: OperatorSettings
) -> tuple[Target | None, list[Issue]]:
    """Every problem of a PredictionPipeline object on this cluster, and its `Target` when
    the spec parses: `sloline validate`'s spec checks (pydantic, the DAG) then
    `operator_issues`. The one check behind both the `Valid` condition and the admission
    webhook, so both say the same thing."""
    try:
        target = Target.of(obj)
        return target, operator_issues(target, settings)
    except PipelineError as exc:
        return None, list(exc.issues)
    except Exception as exc:  # a bug must not pass an object off as valid
        meta = obj.get("metadata") or {}
        _LOG.error(
            "%s/%s: validating the spec failed", meta.get("namespace"), meta.get("name"),
            exc_info=True,
        )  # fmt: skip
        return None, [Issue("spec", f"validation failed: {type(exc).__name__}: {cut(str(exc))}")]


def cut(text: str, limit: int = 500) -> str:
    """An exception's text for a message (it may quote hostile input at length)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def operator_issues(target: Target, settings: OperatorSettings) -> list[Issue]:
    """What a valid spec can still get wrong on this cluster: hardware classes missing from
    the operator's catalog, names the rendered objects cannot take, files the operator
    cannot read, a `sloline.dev/model-dir` annotation outside the models root, pod
    templates the pods cannot take (`pod_issues`), routes without a Gateway."""
    spec = target.graph.pipeline.spec
    catalog = settings.catalog.names()
    issues = [
        Issue(f"spec.hardware[{i}]", f"no hardware class {name!r} in the catalog ({catalog})")
        for i, name in enumerate(spec.hardware)
        if name not in catalog
    ]
    allowed = spec.hardware or catalog
    for i, stage in enumerate(spec.stages):
        if stage.hardware is not None and stage.hardware not in allowed:
            issues.append(
                Issue(
                    f"spec.stages[{i}].hardware",
                    f"{stage.hardware!r} is not an allowed hardware class ({allowed})",
                )
            )
        if stage.name in RESERVED_STAGE_NAMES:
            issues.append(
                Issue(
                    f"spec.stages[{i}].name",
                    f"{stage.name!r} is reserved on Kubernetes (the operator creates "
                    f"{target.name}-{stage.name}); rename the stage",
                )
            )
    if not target.name[:1].isalpha():
        issues.append(
            Issue("metadata.name", "must start with a letter (it names the router Service)")
        )
    annotation = target.model_dir_annotation
    if annotation is not None:
        problem = model_dir_problem(annotation, settings.models.root)
        if problem:
            issues.append(Issue(f"metadata.annotations[{ANNOTATION_MODEL_DIR}]", problem))
    if not issues:  # the pods render only with a usable model directory and classes
        issues += pod_issues(target, settings)
    issues += exposure_issues(target, settings)
    if spec.workload.trace_uri:
        issues.append(
            Issue(
                "spec.workload.traceUri",
                "the operator cannot read files from the model volume; give the planning "
                "trace inline (trace) or as rateRps + cv2",
            )
        )
    return issues


def _ancestors(graph: PipelineGraph, stage: str) -> list[str]:
    seen: set[str] = set()
    todo = list(graph.stages[stage].deps)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.stages[name].deps)
    return sorted(seen)


def _stage_doc(graph: PipelineGraph, stage: str) -> dict[str, Any]:
    return graph.stages[stage].spec.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude=STAGE_KUBERNETES_ONLY
    )


def _common(target: Target, settings: OperatorSettings) -> dict[str, Any]:
    spec = target.graph.pipeline.spec
    return {
        "inputs": [t.model_dump(mode="json", by_alias=True) for t in spec.inputs],
        "samples": spec.samples.model_dump(mode="json", by_alias=True) if spec.samples else None,
        "image": settings.runtime_image,
        "modelDir": target.model_dir(settings),
    }


def dataflow_digest(target: Target, settings: OperatorSettings) -> str:
    """Digest of everything that decides which stages a sample visits."""
    graph = target.graph
    return digest(
        {**_common(target, settings), "stages": {n: _stage_doc(graph, n) for n in graph.order}}
    )


def profile_tasks(target: Target, settings: OperatorSettings) -> tuple[ProfileTask, ...]:
    """Every (stage, class) to profile: a stage pinned to a class only on it, others on
    each allowed class (`spec.hardware`, empty = the whole catalog), in graph order."""
    graph = target.graph
    spec = graph.pipeline.spec
    allowed = spec.hardware or settings.catalog.names()
    common = _common(target, settings)
    tasks = []
    for stage in graph.order:
        node = graph.stages[stage]
        base = {
            **common,
            "stage": _stage_doc(graph, stage),
            "upstream": {n: _stage_doc(graph, n) for n in _ancestors(graph, stage)},
            "cap": settings.profiling.cap,
        }
        for hw in [node.spec.hardware] if node.spec.hardware else allowed:
            hw_doc = settings.catalog.get(hw).model_dump(mode="json", by_alias=True)
            key = f"{stage}.{hw}.{digest({**base, 'hardware': hw_doc})}"
            tasks.append(ProfileTask(stage, hw, key))
    return tuple(tasks)


def catalog_file(settings: OperatorSettings) -> str:
    """`catalog.yaml` for `sloline profile-job --catalog` (the pod's class's threads)."""
    doc = settings.catalog.model_dump(mode="json", by_alias=True, exclude_none=True)
    return yaml.safe_dump(doc, sort_keys=True)


def read_cache(data: Mapping[str, str]) -> dict[str, CacheEntry]:
    """Cache entries of a `<p>-profiles` ConfigMap's data; unreadable entries are dropped
    (they are profiled again)."""
    out = {}
    for key, text in data.items():
        if key.count(".") < 2 or key.endswith((".yaml", ".json")):
            continue
        try:
            entry = CacheEntry.from_text(text)
        except (ValueError, KeyError, TypeError):
            continue
        out[key] = entry
    return out


def assemble(
    tasks: Sequence[ProfileTask],
    cache: Mapping[str, CacheEntry],
    dataflow: str,
    settings: OperatorSettings,
) -> PipelineProfile:
    """The pipeline profile of cached messages for `tasks` (all must be cached): messages
    measured under the current dataflow go last, so routing comes from one of them."""
    entries = [cache[t.key] for t in tasks]
    ordered = [e for e in entries if e.dataflow != dataflow] + [
        e for e in entries if e.dataflow == dataflow
    ]
    return assemble_profile([e.decoded for e in ordered], hop_s=settings.profiling.hop_s)


def plan_inputs(target: Target, settings: OperatorSettings, tasks: Sequence[ProfileTask]) -> str:
    """Digest of everything a plan depends on: the spec, the catalog, the cache keys of
    its profiles. When `<p>-config` already holds a plan with the same digest (operator
    restart, a label change), that plan is reused instead of planning again."""
    spec = target.graph.pipeline.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return digest(
        {
            "spec": spec,
            "catalog": settings.catalog.model_dump(mode="json", by_alias=True),
            "profiles": sorted(t.key for t in tasks),
            "hopS": settings.profiling.hop_s,
        }
    )


def plan_from_profile(target: Target, profile: PipelineProfile, settings: OperatorSettings) -> Plan:
    """Plan with the ordinary planner (InferLine Alg. 1 + 2). Raises `InfeasibleError` when
    no configuration meets the SLO, `ValueError` for other planning problems."""
    from sloline.planner.evaluator import Evaluator
    from sloline.planner.planner import plan
    from sloline.planner.problem import PlanningProblem
    from sloline.planner.workload import trace_for_workload

    graph = target.graph
    arrivals = trace_for_workload(graph.pipeline.spec.workload)
    problem = PlanningProblem.from_graph(graph, profile, settings.catalog, arrivals)
    return plan(problem, Evaluator(problem))
