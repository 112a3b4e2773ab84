"""Models fetched from storage: `s3://` on a real S3-compatible server (moto's server
mode, a separate HTTP server process implementing the S3 API) and `http://` on a local
HTTP server, served end to end in embedded mode; checksums verified."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import yaml

from sloline.embedded import check_models
from sloline.spec import PipelineError, load_pipeline
from sloline.spec.storage import StorageError, cached_path, fetch
from tests.support.s3 import CREDENTIALS, moto_server
from tests.support.serve import BackgroundPipeline, build_example


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def digits() -> Path:
    return build_example("digits-cascade").parent


@pytest.fixture
def http_models(digits: Path) -> Iterator[str]:
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(digits / "models"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with moto_server() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        for name, value in CREDENTIALS.items():
            monkeypatch.setenv(name, value)
        yield endpoint


def storage_pipeline(tmp: Path, digits: Path, uris: dict[str, str], sums: dict[str, str]) -> Path:
    """The digits cascade in `tmp`, its ONNX stages fetched from `uris`."""
    shutil.copy(digits / "digits_stages.py", tmp / "digits_stages.py")
    doc = yaml.safe_load((digits / "pipeline.yaml").read_text())
    for stage in doc["spec"]["stages"]:
        if stage["name"] in uris:
            stage["model"]["storageUri"] = uris[stage["name"]]
            stage["model"]["sha256"] = sums[stage["name"]]
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def infer_digits(bp: BackgroundPipeline, digits: Path) -> list[int]:
    import tritonclient.http as httpclient

    rows = np.asarray(
        __import__("sklearn.datasets", fromlist=["load_digits"]).load_digits().data[:8],
        dtype=np.float32,
    )
    client = httpclient.InferenceServerClient(bp.http_url.removeprefix("http://"))
    labels = []
    for row in rows:
        pixels = httpclient.InferInput("pixels", [1, 64], "FP32")
        pixels.set_data_from_numpy(row.reshape(1, 64))
        result = client.infer(bp.name, [pixels])
        labels.append(int(result.as_numpy("label").reshape(-1)[0]))
    return labels


def test_models_from_s3_and_http_served_end_to_end(
    tmp_path: Path,
    digits: Path,
    http_models: str,
    s3_server: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast model comes from s3:// (a real S3 server), the accurate one from http://;
    the pipeline serves real inferences, and the files land in the model cache."""
    import boto3

    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(
        Bucket="models"
    )
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").upload_file(
        str(digits / "models" / "fast.onnx"), "models", "digits/fast.onnx"
    )
    cache = tmp_path / "cache"
    monkeypatch.setenv("SLOLINE_MODEL_CACHE", str(cache))
    uris = {"fast": "s3://models/digits/fast.onnx", "accurate": f"{http_models}/accurate.onnx"}
    sums = {
        "fast": sha256(digits / "models" / "fast.onnx"),
        "accurate": sha256(digits / "models" / "accurate.onnx"),
    }
    (tmp_path / "spec").mkdir()
    path = storage_pipeline(tmp_path / "spec", digits, uris, sums)
    with BackgroundPipeline(path) as bp:
        labels = infer_digits(bp, digits)
    assert labels == [0, 1, 2, 3, 4, 5, 6, 7]  # load_digits' first eight labels
    for stage, uri in uris.items():
        fetched = cached_path(cache, uri, sums[stage])
        assert sha256(fetched) == sums[stage]
        assert fetched.is_relative_to(cache)


def test_checksum_mismatch_is_a_clear_error(
    tmp_path: Path, digits: Path, http_models: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOLINE_MODEL_CACHE", str(tmp_path / "cache"))
    wrong = "0" * 64
    path = storage_pipeline(
        tmp_path,
        digits,
        {"fast": f"{http_models}/fast.onnx"},
        {"fast": wrong},
    )
    with pytest.raises(PipelineError) as caught:
        check_models(load_pipeline(path))
    text = str(caught.value)
    assert "spec.stages[1].model.storageUri" in text
    assert f"checksum mismatch for {http_models}/fast.onnx" in text
    assert not list((tmp_path / "cache").rglob("fast.onnx"))  # nothing unverified is kept


def test_fetch_once_then_from_cache(tmp_path: Path, digits: Path, http_models: str) -> None:
    uri = f"{http_models}/fast.onnx"
    first = fetch(uri, None, tmp_path)
    assert first.read_bytes() == (digits / "models" / "fast.onnx").read_bytes()
    first.write_bytes(b"cached")  # a second fetch must not download again
    assert fetch(uri, None, tmp_path).read_bytes() == b"cached"


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:1/../../etc/passwd",
        "http://127.0.0.1:1/a/..%2F..%2Fescape",
        "http://127.0.0.1:1/",
    ],
)
def test_no_uri_leaves_the_cache(tmp_path: Path, uri: str) -> None:
    target = cached_path(tmp_path, uri, None)
    assert target.parent.parent == tmp_path
    assert target.name not in ("..", ".", "")


def test_unreachable_and_unknown_schemes_are_clear(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"cannot fetch http://127\.0\.0\.1:1/m\.onnx"):
        fetch("http://127.0.0.1:1/m.onnx", None, tmp_path)
    with pytest.raises(StorageError, match="must start with one of"):
        fetch("ftp://host/m.onnx", None, tmp_path)
    with pytest.raises(StorageError, match="pvc:// is mounted by Kubernetes"):
        fetch("pvc://claim/m.onnx", None, tmp_path)
