"""The CRD validates what the API server will validate: every example custom resource
passes its OpenAPI schema (jsonschema) and every CEL `x-kubernetes-validations` rule
(cel-python), and broken resources fail exactly the rule that describes them, with its
message. The cross-field rules agree with sloline's own validation (`parse_pipeline`)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from sloline.spec import PipelineError, parse_pipeline

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load(
    (ROOT / "helm" / "sloline-crds" / "files" / "predictionpipelines.sloline.dev.yaml").read_text()
)
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = sorted(ROOT.glob("examples/*/pipeline.yaml")) + sorted(
    ROOT.glob("manifests/examples/*.yaml")
)
CEL = celpy.Environment()


def openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI 3.0 `nullable` -> JSON Schema `type: [T, "null"]`; draft 4 reads the rest
    (boolean exclusiveMinimum included) and ignores the x-kubernetes-* keys."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


VALIDATOR = jsonschema.Draft4Validator(openapi_to_jsonschema(SCHEMA))


def schema_errors(doc: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)
    ]


def rules_at(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[tuple[str, dict, Any]]:
    """(path, rule, self) for every CEL rule that applies to `value`, the way the API
    server binds `self`: the object at the schema node that declares the rule."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule, value
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                yield from rules_at(sub, value[key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from rules_at(schema["items"], item, f"{path}[{i}]")


def failed_rules(doc: dict[str, Any]) -> list[str]:
    """The message of every CEL rule that does not evaluate to true on `doc`."""
    failed = []
    for path, rule, value in rules_at(SCHEMA, doc):
        program = CEL.program(CEL.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if result is not True and result != celpy.celtypes.BoolType(True):
            failed.append(f"{path}: {rule['message']}")
    return failed


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def test_there_are_examples_to_check() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_passes_schema_and_every_rule(path: Path) -> None:
    doc = load(path)
    assert schema_errors(doc) == []
    assert list(rules_at(SCHEMA, doc)), "no CEL rule applied: the walk is broken"
    assert failed_rules(doc) == []


def test_every_rule_compiles_and_uses_bounded_lists() -> None:
    """The API server rejects a CRD whose rules' estimated cost is unbounded: every list
    and string a rule iterates or compares must carry maxItems / maxLength."""
    spec = SCHEMA["properties"]["spec"]
    for _, rule, _ in rules_at(SCHEMA, {"spec": {"stages": [{}], "workload": {}}}):
        CEL.compile(rule["rule"])
    stage = spec["properties"]["stages"]["items"]
    for array in (spec["properties"]["stages"], spec["properties"]["inputs"]):
        assert array["maxItems"] <= 64
    for array in (stage["properties"]["inputs"], stage["properties"]["outputs"]):
        assert array["maxItems"] <= 32
    assert stage["properties"]["name"]["maxLength"] <= 63
    assert spec["properties"]["inputs"]["items"]["properties"]["name"]["maxLength"] <= 128
    assert stage["properties"]["inputs"]["items"]["properties"]["from"]["maxLength"] <= 256


def _break_output(doc: dict[str, Any]) -> None:
    doc["spec"]["output"] = "ghost"


def _duplicate_stage(doc: dict[str, Any]) -> None:
    stages = doc["spec"]["stages"]
    stages.append(copy.deepcopy(stages[-1]))


def _dangling_from(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][-1]["inputs"][0]["from"] = "ghost.probabilities"


def _unknown_input(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][0]["inputs"][0]["from"] = "no_such_input"


def _replica_bounds(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][1].update(minReplicas=3, maxReplicas=2)


def _two_workloads(doc: dict[str, Any]) -> None:
    doc["spec"]["workload"]["trace"] = [0.0, 0.1]


def _stage_named_like_an_input(doc: dict[str, Any]) -> None:
    doc["spec"]["inputs"].append({"name": "fast", "datatype": "FP32", "shape": [1]})


def _duplicate_stage_input(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][3]["inputs"].append({"name": "fast", "from": "fast.probabilities"})


def _duplicate_output(doc: dict[str, Any]) -> None:
    outputs = doc["spec"]["stages"][3]["outputs"]
    outputs.append(copy.deepcopy(outputs[-1]))


def _reads_itself(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][1]["inputs"][0]["from"] = "fast.probabilities"


def _optional_onnx_input(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][1]["inputs"][0]["optional"] = True


def _python_without_entrypoint(doc: dict[str, Any]) -> None:
    del doc["spec"]["stages"][0]["model"]["entrypoint"]


def _python_with_uri(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][0]["model"]["uri"] = "models/pre.onnx"


def _python_with_storage_uri(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][0]["model"]["storageUri"] = "s3://models/pre.onnx"


def _onnx_without_file(doc: dict[str, Any]) -> None:
    del doc["spec"]["stages"][1]["model"]["uri"]


def _onnx_with_entrypoint(doc: dict[str, Any]) -> None:
    doc["spec"]["stages"][1]["model"]["entrypoint"] = "stages:fast"


def _too_many_arrivals(doc: dict[str, Any]) -> None:
    doc["spec"]["workload"].update(rateRps=50_000, durationS=60)


BROKEN = [
    (_break_output, ".spec: output must name one of the stages"),
    (_duplicate_stage, ".spec: stage names must be unique"),
    (_dangling_from, ".spec: every stage input's `from` must name a pipeline input"),
    (_unknown_input, ".spec: every stage input's `from` must name a pipeline input"),
    (_replica_bounds, ".spec.stages[1]: minReplicas must not exceed maxReplicas"),
    (_two_workloads, ".spec.workload: give exactly one of rateRps, trace or traceUri"),
    (_stage_named_like_an_input, ".spec: a stage must not share its name with a pipeline input"),
    (_duplicate_stage_input, ".spec.stages[3]: a stage's input names must be unique"),
    (_duplicate_output, ".spec.stages[3]: a stage's output names must be unique"),
    (_reads_itself, ".spec.stages[1]: a stage cannot read its own output"),
    (_optional_onnx_input, ".spec.stages[1]: optional inputs are only for python stages"),
    (_python_without_entrypoint, ".spec.stages[0]: python stages need model.entrypoint"),
    (_python_with_uri, ".spec.stages[0]: python stages take model.entrypoint, not model.uri"),
    (_python_with_storage_uri, ".spec.stages[0]: python stages load from the model directory"),
    (_onnx_without_file, ".spec.stages[1]: onnx and torchscript stages need a model file"),
    (_onnx_with_entrypoint, ".spec.stages[1]: model.entrypoint is only for python stages"),
    (_too_many_arrivals, ".spec.workload: rateRps x durationS must be at most 2,000,000"),
]


@pytest.mark.parametrize(("breaker", "message"), BROKEN, ids=[b.__name__[1:] for b, _ in BROKEN])
def test_broken_resource_fails_its_rule_with_its_message(breaker: Any, message: str) -> None:
    doc = load(ROOT / "examples" / "digits-cascade" / "pipeline.yaml")
    breaker(doc)
    assert schema_errors(doc) == []  # only CEL can tell
    failed = failed_rules(doc)
    assert len(failed) == 1 and failed[0].startswith(message), failed
    with pytest.raises(PipelineError):  # sloline's own validation agrees
        parse_pipeline(doc)


def test_from_naming_a_pipeline_input_with_a_dot_is_accepted() -> None:
    """Tensor names may contain dots; `from` resolves to a pipeline input first."""
    doc = load(ROOT / "examples" / "digits-cascade" / "pipeline.yaml")
    doc["spec"]["inputs"][0]["name"] = "raw.pixels"
    doc["spec"]["stages"][0]["inputs"][0]["from"] = "raw.pixels"
    assert failed_rules(doc) == []
    parse_pipeline(doc)


def test_status_schema_accepts_the_documented_status_and_rejects_a_bad_phase() -> None:
    doc = load(ROOT / "examples" / "digits-cascade" / "pipeline.yaml")
    doc["status"] = {
        "phase": "Ready",
        "observedGeneration": 3,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "WorkersReady",
                "message": "every stage has its replicas",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 3,
            }
        ],
        "plan": {
            "stages": [{"name": "fast", "hardware": "cpu-1", "maxBatch": 8, "replicas": 2}],
            "estimatedP99Ms": 41.5,
            "costPerHour": 0.25,
            "rho": 0.8,
        },
        "endpoints": {"http": "digits-cascade-router:8000", "grpc": "digits-cascade-router:8001"},
        "attainment": "99.52%",
    }
    assert schema_errors(doc) == []
    doc["status"]["phase"] = "Happy"
    doc["status"]["conditions"][0]["status"] = "Yes"
    doc["status"]["attainment"] = 0.995
    assert sorted(e.split(":")[0] for e in schema_errors(doc)) == [
        "status/attainment",
        "status/conditions/0/status",
        "status/phase",
    ]


def test_crd_metadata_matches_the_kubernetes_contract() -> None:
    """docs/kubernetes.md: short name, status subresource, printer columns."""
    assert CRD["spec"]["names"]["shortNames"] == ["slp"]
    assert VERSION["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns == {
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "URL": ".status.url",
        "Phase": ".status.phase",
        "SLO": ".spec.slo.latencyMs",
        "Est-P99": ".status.plan.estimatedP99Ms",
        "Cost/h": ".status.plan.costPerHour",
        "Attainment": ".status.attainment",
        "Age": ".metadata.creationTimestamp",
    }
