"""The checked-in CRD is exactly what the spec models generate."""

from __future__ import annotations

from pathlib import Path

import yaml

from sloline.spec.crd import crd_manifest

ROOT = Path(__file__).resolve().parents[3]
CRD = "helm/sloline-crds/files/predictionpipelines.sloline.dev.yaml"  # the repository's one copy


def test_crd_in_sync_with_models() -> None:
    checked_in = yaml.safe_load((ROOT / CRD).read_text())
    assert checked_in == crd_manifest(), f"{CRD} is stale: regenerate with `sloline crd > {CRD}`"


def _walk(node: object) -> list[dict[str, object]]:
    if isinstance(node, dict):
        return [node, *[n for v in node.values() for n in _walk(v)]]
    if isinstance(node, list):
        return [n for v in node for n in _walk(v)]
    return []


def test_schema_is_structural() -> None:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "const" not in node
        if "properties" in node:
            assert node.get("type") == "object"
            assert "additionalProperties" not in node


def test_spec_reference_doc_in_sync() -> None:
    from sloline.spec.reference import reference_markdown

    assert (ROOT / "docs" / "spec-reference.md").read_text() == reference_markdown(), (
        "docs/spec-reference.md is stale: regenerate with `sloline crd --reference`"
    )


def test_from_rule_fits_the_apiservers_cost_budget() -> None:
    """The `from` rule's estimated cost grows with stages x inputs per stage x (pipeline
    inputs + stages). kube-apiserver v1.37.2 (`make cluster-up`) refused the CRD at 64 x 32
    x (64 + 64), 1.338816x its budget; keep a quarter of the budget spare."""
    spec = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    spec = spec["spec"]["properties"]
    stages = spec["stages"]["maxItems"]
    stage_inputs = spec["stages"]["items"]["properties"]["inputs"]["maxItems"]
    inputs = spec["inputs"]["maxItems"]
    budget = 64 * 32 * (64 + 64) / 1.338816
    assert stages * stage_inputs * (inputs + stages) <= 0.75 * budget


def _undescribed(node: dict[str, object], path: str) -> list[str]:
    """Paths of the properties under `node` (itself included) without a description; an
    array's items are explained by the array's own description, their fields are not."""
    missing = [] if node.get("description") else [path]
    items = node.get("items")
    fields = (items if isinstance(items, dict) else node).get("properties")
    if isinstance(fields, dict):
        for name, child in fields.items():
            missing += _undescribed(child, f"{path}.{name}")
    return missing


def test_every_spec_and_status_field_has_a_description() -> None:
    """What `kubectl explain predictionpipeline.spec` (and `.status`) shows."""
    root = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing = _undescribed(root["properties"]["spec"], "spec")
    missing += _undescribed(root["properties"]["status"], "status")
    assert missing == []
