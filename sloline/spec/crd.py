"""Generate the `predictionpipelines.sloline.dev` CRD from the pydantic spec models.

The JSON Schema pydantic produces is turned into a Kubernetes *structural* OpenAPI v3
schema: references inlined, `anyOf [X, null]` -> `X` + `nullable`, open maps marked
`x-kubernetes-preserve-unknown-fields`, 2020-12 `exclusiveMinimum` -> OpenAPI 3.0 form.
Cross-field rules the schema cannot say are CEL `x-kubernetes-validations`. `crds/` and
the Helm chart hold the output; a test regenerates it and fails on any drift.
"""

from __future__ import annotations

from typing import Any

from sloline.spec.models import PipelineSpec

GROUP = "sloline.dev"
PLURAL = "predictionpipelines"
VERSION = "v1alpha1"

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
]
WORKLOAD_RULES = [
    {
        "rule": "[has(self.rateRps), has(self.trace), has(self.traceUri)].filter(x, x).size() == 1",
        "message": "give exactly one of rateRps, trace or traceUri",
    },
]

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "SLO-ms", "type": "number", "jsonPath": ".spec.slo.latencyMs"},
    {"name": "Est-P99-ms", "type": "number", "jsonPath": ".status.plan.estimatedP99Ms"},
    {"name": "Cost/h", "type": "number", "jsonPath": ".status.plan.costPerHour"},
    {"name": "Attainment", "type": "string", "jsonPath": ".status.attainment"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def spec_schema() -> dict[str, Any]:
    raw = PipelineSpec.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _structural(raw, defs)
    schema["x-kubernetes-validations"] = SPEC_RULES
    schema["properties"]["workload"]["x-kubernetes-validations"] = WORKLOAD_RULES
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
                "shortNames": ["ppl", "slopipe"],
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
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                        }
                    },
                }
            ],
        },
    }
