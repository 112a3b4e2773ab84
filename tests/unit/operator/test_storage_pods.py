"""Models from storage on Kubernetes: the storage-initializer init container, and the
`sloline fetch-models` command it runs."""

from __future__ import annotations

import hashlib
import os
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


def test_worker_and_profiling_pods_fetch_their_models_first(tmp_path: Path) -> None:
    """A worker fetches its stage's model; a profiling pod every stage's (it runs the
    whole pipeline on the samples), whichever stage it profiles."""
    t = storage_target(tmp_path, annotations={"sloline.dev/storage-secret": "s3-creds"})
    settings = OperatorSettings()
    fast = ["--model", "fast=s3://models/digits/models/fast.onnx", "--sha256", f"fast={SHA}"]
    accurate = ["--model", "accurate=s3://models/digits/models/accurate.onnx"]
    for pod, models in (
        (render_worker(t, settings, "fast", "cpu-1", 1)["spec"]["template"]["spec"], fast),
        (
            render_profiling_job(t, settings, "preprocess", "cpu-1", "k")["spec"]["template"][
                "spec"
            ],
            fast + accurate,
        ),
    ):
        (init,) = pod["initContainers"]
        assert init["name"] == "storage-initializer"
        assert init["command"] == ["sloline"]
        assert init["args"] == ["fetch-models", "--into", MODEL_CACHE_DIR, *models]
        assert init["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
        assert init["terminationMessagePath"] == "/dev/termination-log"
        assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
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
    assert init["args"][-2:] == [
        "--source",
        f"fast=file://{MODEL_SOURCE_DIR}/models/digits/fast.onnx",
    ]
    assert {
        "name": "model-source-1",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    } in spec["volumes"]
    mount = {"name": "model-source-1", "mountPath": f"{MODEL_SOURCE_DIR}/models", "readOnly": True}
    assert mount in init["volumeMounts"]
    assert restricted_violations(spec) == []


def test_fetch_models_reads_a_source_keeping_the_uris_place(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(b"from the claim")
    uri = "pvc://models/m.onnx"
    done = fetch_models(
        "--model", f"m={uri}", "--source", f"m=file://{source}", "--into", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert cached_path(tmp_path, uri, None).read_bytes() == b"from the claim"


def fetch_models(*args: str, log: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLOLINE_TERMINATION_LOG": str(log)} if log else None
    return subprocess.run(
        [sys.executable, "-m", "sloline", "fetch-models", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_fetch_models_fills_the_cache_the_worker_reads(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(b"model bytes")
    sha = hashlib.sha256(b"model bytes").hexdigest()
    uri = f"file://{source}"
    other = tmp_path / "o.onnx"
    other.write_bytes(b"other bytes")
    done = fetch_models(
        "--model", f"a={uri}", "--sha256", f"a={sha}", "--model", f"b=file://{other}",
        "--into", str(tmp_path / "cache"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert cached_path(tmp_path / "cache", uri, sha).read_bytes() == b"model bytes"
    assert cached_path(tmp_path / "cache", f"file://{other}", None).read_bytes() == b"other bytes"


def test_fetch_models_checksum_mismatch_is_one_clear_line(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(b"model bytes")
    log = tmp_path / "termination-log"
    done = fetch_models(
        "--model", f"fast=file://{source}", "--sha256", f"fast={SHA}", "--into", str(tmp_path),
        log=log,
    )  # fmt: skip
    assert done.returncode == 1
    what = (
        f"stage fast: checksum mismatch for file://{source}: sha256 is "
        f"{hashlib.sha256(b'model bytes').hexdigest()}, the spec says {SHA}"
    )
    assert done.stderr.strip().splitlines() == [f"sloline fetch-models: {what}"]
    assert log.read_text() == f"ChecksumMismatch: {what}"  # what the operator reads


def test_fetch_models_names_a_failed_fetch(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    missing = tmp_path / "absent.onnx"
    done = fetch_models("--model", f"fast=file://{missing}", "--into", str(tmp_path), log=log)
    assert done.returncode == 1
    assert log.read_text().startswith(f"FetchFailed: stage fast: cannot fetch file://{missing}: ")
    assert "\n" not in log.read_text()


def test_fetch_models_refuses_checksums_of_stages_it_does_not_fetch(tmp_path: Path) -> None:
    done = fetch_models(
        "--model", "a=file:///m.onnx", "--sha256", f"b={SHA}", "--into", str(tmp_path)
    )
    assert done.returncode == 2
    assert "names stages without --model: b" in done.stderr
    assert "Traceback" not in done.stderr
