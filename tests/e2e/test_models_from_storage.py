"""Models from storage on the stand-in cluster (docs/install.md, "Providing models"): the
digits cascade with `spec.storageUri: s3://models/digits` on a real S3-compatible server
(moto's, started by the test; the pods reach it through the Secret the pipeline names in
`sloline.dev/storage-secret`). Every worker and profiling pod of the ONNX stages starts
with the `storage-initializer` init container (`sloline fetch-models`), which the
process kubelet runs before the stage's container.

- the right checksums: the pipeline profiles, plans and serves real requests with
  `ModelsReady=True`; then the stored `fast` model is replaced and a `fast` worker pod
  restarts: its initializer fails the checksum (CrashLoopBackOff) and the pipeline says
  so (`ModelsReady=False`, `ChecksumMismatch`, the stage, the URI and both digests, and
  Ready=False with the same reason);
- a wrong `sha256` in the spec: the profiling Job's initializer fails, and the pipeline
  gets the same condition, phase Failed.

The S3 server runs on this machine, so a real cluster (`$KUBECONFIG`) cannot reach it:
these tests run on the stand-in only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_story import (
    EXAMPLE,
    NS,
    PIPELINE,
    SELECTOR,
    Story,
    Timeline,
    build_models,
)
from tests.support.cluster import ROOT, open_cluster
from tests.support.net import free_port
from tests.support.s3 import CREDENTIALS, moto_server

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(os.environ.get("KUBECONFIG")),
        reason="the S3 server runs on this machine, where a real cluster cannot reach it",
    ),
]

MODELS = ROOT / "examples" / PIPELINE / "models"
BUCKET, PREFIX, SECRET = "models", "digits", "s3-credentials"
FAST_URI = f"s3://{BUCKET}/{PREFIX}/models/fast.onnx"
# Fixed hop: the profiling Jobs skip their loopback probe (the story measures it).
VALUES = {"settings": {"profiling": {"hopS": 0.001}}}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def s3() -> Iterator[tuple[str, Any]]:
    """The S3 server's endpoint and a client; the example's ONNX files in the bucket."""
    import boto3

    with moto_server() as endpoint:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=CREDENTIALS["AWS_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket=BUCKET)
        for name in ("fast.onnx", "accurate.onnx"):
            client.upload_file(str(MODELS / name), BUCKET, f"{PREFIX}/models/{name}")
        yield endpoint, client


@pytest.fixture
def story(tmp_path: Path, record_property: Callable[[str, object], None]) -> Iterator[Story]:
    build_models()
    timeline = Timeline(record_property)
    with open_cluster("emulated", tmp_path / "cluster", free_port()) as cluster:
        timeline.mark("start the cluster")
        try:
            yield Story(cluster, tmp_path, timeline)
        finally:
            print(f"\non the {cluster.name} cluster:\n{timeline.table()}")


def from_storage(story: Story, endpoint: str, sums: dict[str, str]) -> Path:
    """The example with its ONNX stages from the bucket, checked against `sums`, and the
    Secret that tells the storage initializer where the bucket is."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["annotations"] = {"sloline.dev/storage-secret": SECRET}
    doc["spec"]["storageUri"] = f"s3://{BUCKET}/{PREFIX}"
    for stage in doc["spec"]["stages"]:
        if stage["name"] in sums:
            stage["model"]["sha256"] = sums[stage["name"]]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET},
        "stringData": {"AWS_ENDPOINT_URL": endpoint, **CREDENTIALS},
    }
    path = story.workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump_all([secret, doc]))
    return path


def good_sums() -> dict[str, str]:
    return {s: sha256((MODELS / f"{s}.onnx").read_bytes()) for s in ("fast", "accurate")}


def models_failed(story: Story) -> dict[str, Any]:
    found = story.condition("ModelsReady")
    return found if found.get("status") == "False" else {}


def test_models_from_s3_serve_and_a_changed_file_fails_its_checksum(
    story: Story, s3: tuple[str, Any]
) -> None:
    endpoint, client = s3
    sums = good_sums()
    story.install(VALUES)
    story.deploy_pipeline(manifest=from_storage(story, endpoint, sums))
    fetched = story.condition("ModelsReady")
    assert (fetched.get("status"), fetched.get("reason")) == ("True", "Fetched"), fetched
    for stage in ("fast", "accurate"):
        workers = f"{SELECTOR},app.kubernetes.io/component=worker,sloline.dev/stage={stage}"
        (pod, *_) = story.cluster.objects("pods", NS, workers)
        (init,) = pod["status"]["initContainerStatuses"]
        assert init["name"] == "storage-initializer"
        assert init["state"]["terminated"]["exitCode"] == 0, init
    story.requests()

    # The stored model changes under the same URI; a restarted pod fetches it again.
    replaced = b"not the model the spec names"
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/models/fast.onnx", Body=replaced)
    fast = f"{SELECTOR},app.kubernetes.io/component=worker,sloline.dev/stage=fast"
    for pod in story.cluster.objects("pods", NS, fast):
        story.cluster.kubectl("delete", "pod", "-n", NS, pod["metadata"]["name"], "--wait=false")
    failed = story.wait("ModelsReady turns False", lambda: models_failed(story), 60)
    assert failed["reason"] == "ChecksumMismatch", failed
    assert failed["message"] == (
        f"stage fast: checksum mismatch for {FAST_URI}: sha256 is {sha256(replaced)}, "
        f"the spec says {sums['fast']}"
    )
    ready = story.wait(
        "Ready turns False with the models' reason",
        lambda: (r := story.condition("Ready")).get("reason") == "ChecksumMismatch" and r,
        30,
    )
    assert (ready["status"], ready["message"]) == ("False", failed["message"])
    (pod, *_) = story.cluster.objects("pods", NS, fast)
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["lastState"]["terminated"]["exitCode"] == 1, init
    assert init["lastState"]["terminated"]["message"].startswith("ChecksumMismatch: ")
    story.timeline.mark("a changed model fails its checksum")


def test_a_wrong_checksum_fails_the_pipeline_with_a_clear_condition(
    story: Story, s3: tuple[str, Any]
) -> None:
    endpoint, _ = s3
    wrong = "0" * 64
    story.install(VALUES)
    manifest = from_storage(story, endpoint, {**good_sums(), "fast": wrong})
    story.cluster.kubectl("apply", "-n", NS, "-f", str(manifest))
    failed = story.wait("ModelsReady turns False", lambda: models_failed(story), 120)
    assert failed["reason"] == "ChecksumMismatch", failed
    real = sha256((MODELS / "fast.onnx").read_bytes())
    assert failed["message"] == (
        f"stage fast: checksum mismatch for {FAST_URI}: sha256 is {real}, the spec says {wrong}"
    )
    status = story.pipeline()["status"]
    assert status["phase"] == "Failed", status
    ready = story.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ChecksumMismatch"), ready
    assert ready["message"] == failed["message"]
    # Then the profiling Jobs, their initializers failed, report the same line.
    profiled = story.wait(
        "the profiling Jobs fail",
        lambda: (p := story.condition("Profiled")).get("reason") == "ProfilingFailed" and p,
        120,
    )
    # Every profiling pod fetches every stage's model: the Jobs fail with the same line.
    assert f"on cpu-1: ChecksumMismatch: {failed['message']}" in profiled["message"]
    story.timeline.mark("a wrong checksum fails the pipeline")
