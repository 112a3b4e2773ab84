"""Models from storage on Kubernetes: the storage-initializer init container, and the
`sloline fetch-models` command it runs."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from sloline.operator.naming import Target
from sloline.operator.pods import (
    MODEL_CACHE_DIR,
    MODEL_SOURCE_DIR,
    render_profiling_job,
    render_worker,
)
from sloline.operator.settings import OperatorSettings
from sloline.spec.shaping import restricted_violations
from sloline.spec.storage import cached_path
from tests.unit.operator.helpers import DIGITS, pipeline_object
from tests.unit.operator.test_pod_security import hardening_violations

SHA = "ab" * 32


def storage_target(tmp_path: Path, **meta: Any) -> Target:
    doc = yaml.safe_load(DIGITS.read_text())
    doc["spec"]["storageUri"] = "s3://models/digits"
    doc["spec"]["stages"][1]["model"]["sha256"] = SHA
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return Target.of(pipeline_object(path, **meta))


def test_worker_and_profiling_pods_fetch_their_model_first(tmp_path: Path) -> None:
    t = storage_target(tmp_path, annotations={"sloline.dev/storage-secret": "s3-creds"})
    settings = OperatorSettings()
    for pod in (
        render_worker(t, settings, "fast", "cpu-1", 1)["spec"]["template"]["spec"],
        render_profiling_job(t, settings, "fast", "cpu-1", "k")["spec"]["template"]["spec"],
    ):
        (init,) = pod["initContainers"]
        assert init["name"] == "storage-initializer"
        assert init["command"] == ["sloline"]
        assert init["args"] == [
            "fetch-models",
            "--uri",
            "s3://models/digits/models/fast.onnx",
            "--into",
            MODEL_CACHE_DIR,
            "--sha256",
            SHA,
        ]
        assert init["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
        (main,) = pod["containers"]
        assert {"name": "SLOLINE_MODEL_CACHE", "value": MODEL_CACHE_DIR} in main["env"]
        assert {"name": "model-cache", "mountPath": MODEL_CACHE_DIR, "readOnly": True} in main[
            "volumeMounts"
        ]
        assert {"name": "model-cache", "emptyDir": {}} in pod["volumes"]
        assert restricted_violations(pod) == []
        assert hardening_violations(pod) == []


def test_stages_without_storage_get_no_init_container(tmp_path: Path) -> None:
    t = storage_target(tmp_path)
    pod = render_worker(t, OperatorSettings(), "preprocess", "cpu-1", 1)["spec"]["template"]
    assert "initContainers" not in pod["spec"]
    assert "envFrom" not in str(pod)


def test_pvc_claims_are_mounted_into_the_initializer(tmp_path: Path) -> None:
    t = storage_target(tmp_path)
    doc = t.graph.pipeline.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["storageUri"] = None
    doc["spec"]["stages"][1]["model"]["storageUri"] = "pvc://models/digits/fast.onnx"
    path = tmp_path / "pvc.yaml"
    path.write_text(yaml.safe_dump(doc))
    pod = render_worker(Target.of(pipeline_object(path)), OperatorSettings(), "fast", "cpu-1", 1)
    spec = pod["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["args"][-2:] == ["--source", f"file://{MODEL_SOURCE_DIR}/digits/fast.onnx"]
    assert {
        "name": "model-source",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    } in spec["volumes"]
    assert {"name": "model-source", "mountPath": MODEL_SOURCE_DIR, "readOnly": True} in init[
        "volumeMounts"
    ]
    assert restricted_violations(spec) == []


def test_fetch_models_reads_a_source_keeping_the_uris_place(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(b"from the claim")
    uri = "pvc://models/m.onnx"
    done = fetch_models("--uri", uri, "--source", f"file://{source}", "--into", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert cached_path(tmp_path, uri, None).read_bytes() == b"from the claim"


def fetch_models(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sloline", "fetch-models", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_fetch_models_fills_the_cache_the_worker_reads(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(b"model bytes")
    sha = hashlib.sha256(b"model bytes").hexdigest()
    uri = f"file://{source}"
    done = fetch_models("--uri", uri, "--sha256", sha, "--into", str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    assert cached_path(tmp_path / "cache", uri, sha).read_bytes() == b"model bytes"


def test_fetch_models_checksum_mismatch_is_one_clear_line(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(b"model bytes")
    done = fetch_models("--uri", f"file://{source}", "--sha256", SHA, "--into", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"sloline fetch-models: checksum mismatch for file://{source}: sha256 is "
        f"{hashlib.sha256(b'model bytes').hexdigest()}, the spec says {SHA}"
    ]
