"""Generate the `predictionpipelines.sloline.dev` CRD from the pydantic spec models.

The JSON Schema pydantic produces is turned into a Kubernetes *structural* OpenAPI v3
schema: references inlined, `anyOf [X, null]` -> `X` + `nullable`, open maps marked
`x-kubernetes-preserve-unknown-fields`, 2020-12 `exclusiveMinimum` -> OpenAPI 3.0 form.
Cross-field rules the schema cannot say are CEL `x-kubernetes-validations`. The
sloline-crds chart holds the output in `helm/sloline-crds/files/` (the one copy in the
repository); a test regenerates it and fails on any drift.
"""

from __future__ import annotations

from typing import Any

from sloline.common.trace import MAX_PLANNING_ARRIVALS
from sloline.spec.models import PipelineSpec, WorkloadSpec

GROUP = "sloline.dev"
PLURAL = "predictionpipelines"
VERSION = "v1alpha1"

# CEL rules for what the schema cannot say: every check of `sloline validate` that CEL
# can make within the API server's cost budget (estimated from maxItems and maxLength
# when the CRD is created). The costliest, the `from` rule, grows with stages x inputs per
# stage x (pipeline inputs + stages): at 64 x 32 x (64 + 64) kube-apiserver v1.37.2
# refused it (1.34x its budget), so a stage takes at most 16 inputs (0.67x;
# tests/unit/spec/test_crd.py keeps that margin). It checks that a `from` names a
# pipeline input or starts with `<stage>.` of an existing stage. The rest needs the
# admission webhook (sloline/operator/admission.py): that the stage has that output (a
# join four lists deep), cycles (a graph walk), `when` conditions (parsed and
# type-checked), planning traces (an unbounded list), `model.config` on onnx and
# torchscript stages (a free-form object CEL cannot size: kube-apiserver refuses
# `size()` on it) and what the operator's settings decide (hardware classes, pod
# templates, routes).
SPEC_RULES = [
    {
        "rule": "self.stages.exists(s, s.name == self.output)",
        "message": "output must name one of the stages",
        "fieldPath": ".output",
    },
    {
        "rule": "self.stages.all(s, self.stages.exists_one(t, t.name == s.name))",
        "message": "stage names must be unique",
        "fieldPath": ".stages",
    },
    {
        "rule": "self.inputs.all(i, self.inputs.exists_one(j, j.name == i.name))",
        "message": "pipeline input names must be unique",
        "fieldPath": ".inputs",
    },
    {
        "rule": "self.stages.all(s, !self.inputs.exists(i, i.name == s.name))",
        "message": "a stage must not share its name with a pipeline input",
        "fieldPath": ".stages",
    },
    {
        "rule": "self.stages.all(s, s.inputs.all(i, "
        "self.inputs.exists(p, p.name == i.from) || "
        "self.stages.exists(t, i.from.startsWith(t.name + '.'))))",
        "message": "every stage input's `from` must name a pipeline input or "
        "`<stage>.<output>` of a stage of this pipeline",
        "fieldPath": ".stages",
    },
]
# A path is relative and has no `..` component (`sloline.spec.paths`, which the operator
# checks again with symlinks and entrypoints; the API server sees no files).
_INSIDE = "!{0}.startsWith('/') && !{0}.matches('(^|/)[.][.](/|$)')"
_INSIDE_MESSAGE = "must be a path relative to the model directory, without '..'"
_PYTHON = "self.model.runtime == 'python'"
_SET = "(has(self.model.{0}) && self.model.{0} != '')"
STAGE_RULES = [
    {
        "rule": "!has(self.model.uri) || (" + _INSIDE.format("self.model.uri") + ")",
        "message": f"model.uri {_INSIDE_MESSAGE}",
        "fieldPath": ".model.uri",
    },
    {
        "rule": "!has(self.minReplicas) || !has(self.maxReplicas) || "
        "self.minReplicas <= self.maxReplicas",
        "message": "minReplicas must not exceed maxReplicas",
        "fieldPath": ".minReplicas",
    },
    {
        "rule": "self.inputs.all(i, self.inputs.exists_one(j, j.name == i.name))",
        "message": "a stage's input names must be unique",
        "fieldPath": ".inputs",
    },
    {
        "rule": "self.outputs.all(o, self.outputs.exists_one(p, p.name == o.name))",
        "message": "a stage's output names must be unique",
        "fieldPath": ".outputs",
    },
    {
        "rule": "self.inputs.all(i, !i.from.startsWith(self.name + '.'))",
        "message": "a stage cannot read its own output",
        "fieldPath": ".inputs",
    },
    {
        "rule": f"{_PYTHON} || self.inputs.all(i, !has(i.optional) || !i.optional)",
        "message": "optional inputs are only for python stages",
        "fieldPath": ".inputs",
    },
    {
        "rule": f"!({_PYTHON}) || {_SET.format('entrypoint')}",
        "message": "python stages need model.entrypoint (module:attr)",
        "fieldPath": ".model.entrypoint",
    },
    {
        "rule": f"!({_PYTHON}) || !{_SET.format('uri')}",
        "message": "python stages take model.entrypoint, not model.uri",
        "fieldPath": ".model.uri",
    },
    {
        "rule": f"!({_PYTHON}) || !{_SET.format('storageUri')}",
        "message": "python stages load from the model directory; model.storageUri is for "
        "onnx and torchscript stages",
        "fieldPath": ".model.storageUri",
    },
    {
        "rule": f"{_PYTHON} || {_SET.format('uri')} || {_SET.format('storageUri')}",
        "message": "onnx and torchscript stages need a model file (model.uri or model.storageUri)",
        "fieldPath": ".model.uri",
    },
    {
        "rule": f"{_PYTHON} || !{_SET.format('entrypoint')}",
        "message": "model.entrypoint is only for python stages",
        "fieldPath": ".model.entrypoint",
    },
]
_DURATION_DEFAULT = WorkloadSpec.model_fields["duration_s"].default
WORKLOAD_RULES = [
    {
        "rule": "[has(self.rateRps), has(self.trace), has(self.traceUri)].filter(x, x).size() == 1",
        "message": "give exactly one of rateRps, trace or traceUri",
    },
    {
        "rule": "!has(self.rateRps) || double(self.rateRps) * "
        f"(has(self.durationS) ? double(self.durationS) : {_DURATION_DEFAULT!r}) "
        f"<= {float(MAX_PLANNING_ARRIVALS)!r}",
        "message": f"rateRps x durationS must be at most {MAX_PLANNING_ARRIVALS:,} arrivals "
        "(the planner's limit per planning trace; lower durationS)",
    },
    {
        "rule": "!has(self.traceUri) || (" + _INSIDE.format("self.traceUri") + ")",
        "message": f"traceUri {_INSIDE_MESSAGE}",
        "fieldPath": ".traceUri",
    },
]
SAMPLES_RULES = [
    {
        "rule": "!has(self.uri) || (" + _INSIDE.format("self.uri") + ")",
        "message": f"samples.uri {_INSIDE_MESSAGE}",
        "fieldPath": ".uri",
    },
]

PRINTER_COLUMNS = [
    {
        "name": "Ready",
        "type": "string",
        "description": "the Ready condition: the pipeline can serve",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "URL",
        "type": "string",
        "description": "the pipeline's HTTP URL inside the cluster",
        "jsonPath": ".status.url",
    },
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "SLO",
        "type": "number",
        "description": "end-to-end latency SLO (ms)",
        "jsonPath": ".spec.slo.latencyMs",
    },
    {
        "name": "Est-P99",
        "type": "number",
        "description": "the plan's estimated P99 latency (ms)",
        "jsonPath": ".status.plan.estimatedP99Ms",
    },
    {
        "name": "Cost/h",
        "type": "number",
        "description": "the plan's cost per hour",
        "jsonPath": ".status.plan.costPerHour",
    },
    {
        "name": "Attainment",
        "type": "string",
        "description": "share of requests within the SLO over the last 5 minutes",
        "jsonPath": ".status.attainment",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

PHASES = ["Pending", "Profiling", "Planning", "Deploying", "Ready", "Failed"]

# metav1.Condition, as Kubernetes' own types declare it.
CONDITION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One aspect of the pipeline's state.",
    "required": ["type", "status"],
    "properties": {
        "type": {
            "type": "string",
            "maxLength": 316,
            "description": "Valid, Profiled, Planned, ModelsReady or Ready.",
        },
        "status": {
            "type": "string",
            "enum": ["True", "False", "Unknown"],
            "description": "True, False or Unknown.",
        },
        "reason": {
            "type": "string",
            "maxLength": 1024,
            "description": "Why the condition is in its status, in CamelCase.",
        },
        "message": {
            "type": "string",
            "maxLength": 32768,
            "description": "What happened, for humans.",
        },
        "lastTransitionTime": {
            "type": "string",
            "format": "date-time",
            "description": "When the status last changed.",
        },
        "observedGeneration": {
            "type": "integer",
            "format": "int64",
            "minimum": 0,
            "description": "The spec generation the condition describes.",
        },
    },
}
_URL = {"type": "string", "description": "http(s) URL of the router Service inside the cluster."}

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Written by the operator (docs/kubernetes.md, Status).",
    "properties": {
        "phase": {
            "type": "string",
            "enum": PHASES,
            "description": "Where the pipeline stands: " + ", ".join(PHASES) + ".",
        },
        "observedGeneration": {
            "type": "integer",
            "format": "int64",
            "minimum": 0,
            "description": "The spec generation last reconciled.",
        },
        "conditions": {
            "type": "array",
            "description": (
                "Valid, Profiled, Planned, ModelsReady (models from storage) and Ready, as "
                "Kubernetes conditions."
            ),
            "items": CONDITION_SCHEMA,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        "plan": {
            "type": "object",
            "description": "The plan in force; more fields of `sloline plan` may follow.",
            "properties": {
                "stages": {
                    "type": "array",
                    "description": "What the plan chose for each stage.",
                    "items": {
                        "type": "object",
                        "description": "One stage of the plan.",
                        "properties": {
                            "name": {"type": "string", "description": "The stage."},
                            "hardware": {
                                "type": "string",
                                "description": "Hardware class of its pods.",
                            },
                            "maxBatch": {
                                "type": "integer",
                                "minimum": 1,
                                "description": "Largest batch it forms.",
                            },
                            "replicas": {
                                "type": "integer",
                                "minimum": 0,
                                "description": "Planned replicas.",
                            },
                        },
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                },
                "estimatedP99Ms": {
                    "type": "number",
                    "description": "The plan's estimated P99 latency in ms.",
                },
                "costPerHour": {
                    "type": "number",
                    "description": "The plan's cost per hour, in the catalog's currency.",
                },
            },
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "endpoints": {
            "type": "object",
            "description": "Where clients reach the pipeline inside the cluster.",
            "properties": {
                "http": _URL,
                "grpc": {"type": "string", "description": "host:port of the gRPC front door."},
            },
        },
        "url": _URL,
        "address": {
            "type": "object",
            "description": "The pipeline as a Knative/KServe addressable.",
            "properties": {"url": _URL},
        },
        "attainment": {
            "type": "string",
            "pattern": r"^[0-9]{1,3}(\.[0-9]+)?%$",
            "description": "Share of requests within the SLO over the last 5 minutes, "
            "e.g. `99.52%` (from Prometheus).",
        },
    },
}


def spec_schema() -> dict[str, Any]:
    raw = PipelineSpec.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _structural(raw, defs)
    schema["x-kubernetes-validations"] = SPEC_RULES
    schema["properties"]["workload"]["x-kubernetes-validations"] = WORKLOAD_RULES
    schema["properties"]["stages"]["items"]["x-kubernetes-validations"] = STAGE_RULES
    schema["properties"]["samples"]["x-kubernetes-validations"] = SAMPLES_RULES
    return schema


def _structural(node: Any, defs: dict[str, Any]) -> Any:  # noqa: C901, PLR0912 - one case per keyword
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    any_of = node.get("anyOf")
    if any_of is not None and {o.get("type") for o in any_of} == {"string", "integer"}:
        # a quantity (`cpu: 1` or `cpu: 500m`): Kubernetes' int-or-string
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "title")}
        return {**_structural(rest, defs), "x-kubernetes-int-or-string": True}
    if any_of is not None:
        options = [o for o in any_of if o.get("type") != "null"]
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            single: dict[str, Any] = _structural({**options[0], **rest}, defs)
            if len(options) < len(any_of):
                single["nullable"] = True
            single.pop("default", None)
            return single
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "additionalProperties") and not (
            key == "additionalProperties" and isinstance(value, dict) and value
        ):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "default" and isinstance(value, dict | list):
            continue  # empty-collection defaults add nothing
        elif key == "description":
            out[key] = " ".join(str(value).split())
        else:
            out[key] = _structural(value, defs)
    if out.get("type") == "object" and "properties" not in out:
        extra = out.get("additionalProperties")
        if not isinstance(extra, dict) or not extra or extra == {}:
            out.pop("additionalProperties", None)
            out["x-kubernetes-preserve-unknown-fields"] = True
    if "additionalProperties" in out and out["additionalProperties"] in ({}, True):
        out.pop("additionalProperties")
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition object, ready for `kubectl apply`."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": "predictionpipeline",
                "kind": "PredictionPipeline",
                "listKind": "PredictionPipelineList",
                "shortNames": ["slp"],
                "categories": ["sloline"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": STATUS_SCHEMA,
                            },
                        }
                    },
                }
            ],
        },
    }
