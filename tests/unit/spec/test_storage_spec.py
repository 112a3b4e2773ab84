"""`storageUri` in the spec: the pipeline default fills stages, bad URIs are named."""

from __future__ import annotations

from typing import Any

import pytest

from sloline.spec import PipelineError, parse_pipeline


def doc(storage: str | None, stage_model: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "slo": {"latencyMs": 100},
        "workload": {"rateRps": 10},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "stages": [
            {
                "name": "m",
                "model": stage_model,
                "inputs": [{"name": "x", "from": "x"}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}],
            }
        ],
        "output": "m",
    }
    if storage is not None:
        spec["storageUri"] = storage
    return {
        "apiVersion": "sloline.dev/v1alpha1",
        "kind": "PredictionPipeline",
        "metadata": {"name": "p"},
        "spec": spec,
    }


def test_pipeline_default_joins_the_stage_uri() -> None:
    graph = parse_pipeline(doc("s3://bucket/models/", {"runtime": "onnx", "uri": "a/m.onnx"}))
    assert graph.pipeline.spec.stages[0].model.storage_uri == "s3://bucket/models/a/m.onnx"


def test_stage_storage_uri_wins_over_the_default() -> None:
    model = {"runtime": "onnx", "uri": "m.onnx", "storageUri": "https://h/x.onnx"}
    graph = parse_pipeline(doc("s3://bucket", model))
    assert graph.pipeline.spec.stages[0].model.storage_uri == "https://h/x.onnx"


@pytest.mark.parametrize(
    ("storage", "model", "field", "reason"),
    [
        (None, {"runtime": "onnx", "storageUri": "ftp://h/m"}, "stages[0].model.storageUri", "ftp"),
        (None, {"runtime": "onnx", "storageUri": "s3:///key"}, "storageUri", "no host or bucket"),
        (None, {"runtime": "onnx", "storageUri": "file://rel/m"}, "storageUri", "absolute"),
        ("s3://b", {"runtime": "onnx", "uri": "../m.onnx"}, "model.uri", "'..'"),
    ],
)
def test_bad_storage_uris_are_named(
    storage: str | None, model: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(doc(storage, model))
    assert field in str(caught.value) and reason in str(caught.value)


def test_storage_uri_alone_is_enough_and_python_stages_refuse_it() -> None:
    parse_pipeline(doc(None, {"runtime": "onnx", "storageUri": "https://h/m.onnx"}))
    model = {"runtime": "python", "entrypoint": "m:f", "storageUri": "https://h/m.onnx"}
    with pytest.raises(PipelineError, match="storageUri is for onnx and torchscript"):
        parse_pipeline(doc(None, model))


def test_bad_checksum_is_rejected() -> None:
    model = {"runtime": "onnx", "storageUri": "https://h/m.onnx", "sha256": "abc"}
    with pytest.raises(PipelineError, match="sha256"):
        parse_pipeline(doc(None, model))
