"""Model files fetched from storage: a stage's `model.storageUri` (or the pipeline's
`storageUri` joined with the stage's `model.uri`), optionally checked against
`model.sha256`.

Schemes: `file:///abs/path`, `http://`, `https://`, `s3://bucket/key` (any S3-compatible
endpoint: `AWS_ENDPOINT_URL` or `S3_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, as KServe reads them; needs boto3) and `gs://bucket/object`
(needs google-cloud-storage). `pvc://` names a claim that Kubernetes mounts; it cannot
be fetched outside a cluster.

Every file lands in the cache directory (`$SLOLINE_MODEL_CACHE`, else
`~/.cache/sloline/models`) at `<key>/<name>`: `key` is a hash of the URI and checksum,
`name` the URI's last path component when it is a plain file name, else `model`. No
part of a URI ever becomes a directory, so nothing a URI says can leave the cache.
A file is fetched once: a later run finds it (and checks it again when a checksum is
given).

On Kubernetes the storage initializer (`sloline fetch-models`) reports a failure in its
termination message as one line, `<reason>: stage <stage>: <what happened>`, with the reason
`ChecksumMismatch` or `FetchFailed` (`termination_message`); the operator reads it back
with `read_termination_message` to set the pipeline's `ModelsReady` condition.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

SCHEMES = ("file", "http", "https", "s3", "gs", "pvc")
SHA256_PATTERN = r"^[0-9a-f]{64}$"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_CHUNK = 1 << 20


CHECKSUM_MISMATCH = "ChecksumMismatch"
FETCH_FAILED = "FetchFailed"


class StorageError(ValueError):
    """A model file could not be fetched, or its checksum did not match."""

    reason = FETCH_FAILED


class ChecksumMismatch(StorageError):
    """The fetched file's SHA-256 is not the one the spec gives."""

    reason = CHECKSUM_MISMATCH


def termination_message(exc: StorageError, stage: str) -> str:
    """The storage initializer's termination message about `stage`'s model, one line:
    `<reason>: stage <stage>: <what happened>`."""
    return f"{exc.reason}: stage {stage}: " + " ".join(str(exc).split())


def read_termination_message(text: str) -> tuple[str, str]:
    """(reason, detail) of a storage initializer's termination message. Anything else
    (a crash's log tail, with `FallbackToLogsOnError`) is `FetchFailed` with its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return FETCH_FAILED, ""
    for reason in (CHECKSUM_MISMATCH, FETCH_FAILED):
        if lines[0].startswith(f"{reason}: "):
            return reason, lines[0][len(reason) + 2 :]
    return FETCH_FAILED, lines[-1]


def storage_uri_problem(uri: str) -> str | None:
    """Why `uri` cannot name a model in storage, or None."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme not in SCHEMES:
        return f"{uri!r} must start with one of " + ", ".join(f"{s}://" for s in SCHEMES)
    if "\x00" in uri:
        return "contains a NUL character"
    if parsed.scheme != "file" and not parsed.netloc:
        return f"{uri!r} names no host or bucket"
    if parsed.scheme == "pvc" and (
        ".." in parsed.path.split("/") or not parsed.path.strip("/") or parsed.query
    ):
        return f"{uri!r} must be pvc://CLAIM/path/in/the/claim, without '..'"
    if parsed.scheme == "file" and (parsed.netloc not in ("", "localhost") or not parsed.path):
        return f"{uri!r}: file URIs are absolute (file:///path/to/model.onnx)"
    return None


def cache_root() -> Path:
    """Where fetched models are kept."""
    env = os.environ.get("SLOLINE_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "sloline" / "models"


def cached_path(root: Path, uri: str, sha256: str | None) -> Path:
    """Where `uri` (with its checksum) lives in the cache `root`."""
    key = hashlib.sha256(f"{uri}\n{sha256 or ''}".encode()).hexdigest()[:32]
    name = urllib.parse.unquote(urllib.parse.urlsplit(uri).path).rsplit("/", 1)[-1]
    if not _SAFE_NAME.fullmatch(name):
        name = "model"
    return root / key / name


def fetch(
    uri: str, sha256: str | None, root: Path | None = None, source: str | None = None
) -> Path:
    """The local file holding `uri`, fetched into the cache unless it is there already;
    raises `StorageError` with the reason when it cannot be fetched or does not match
    `sha256`. `source` (a `file://` URI) is where to read it from instead, keeping the
    cache place of `uri`: a `pvc://` claim mounted by Kubernetes."""
    problem = storage_uri_problem(uri)
    if not problem and source is not None:
        problem = storage_uri_problem(source)
    if problem:
        raise StorageError(problem)
    target = cached_path(root or cache_root(), uri, sha256)
    if target.is_file():
        _verify(target, uri, sha256)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".fetch-")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            _download(source or uri, out)
        _verify(tmp, uri, sha256)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _verify(path: Path, uri: str, sha256: str | None) -> None:
    if sha256 is None:
        return
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise ChecksumMismatch(
            f"checksum mismatch for {uri}: sha256 is {digest.hexdigest()}, the spec says {sha256}"
        )


def _download(uri: str, out: IO[bytes]) -> None:
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme
    try:
        if scheme == "file":
            with open(urllib.parse.unquote(parsed.path), "rb") as src:
                shutil.copyfileobj(src, out)
        elif scheme in ("http", "https"):
            with urllib.request.urlopen(uri, timeout=60) as response:
                shutil.copyfileobj(response, out)
        elif scheme == "s3":
            _s3_client().download_fileobj(parsed.netloc, parsed.path.lstrip("/"), out)
        elif scheme == "gs":
            try:
                from google.cloud import storage as gcs  # type: ignore[import-untyped,import-not-found,unused-ignore]
            except ImportError:
                raise StorageError(
                    f"{uri}: gs:// needs google-cloud-storage (pip install google-cloud-storage)"
                ) from None
            blob = gcs.Client().bucket(parsed.netloc).blob(parsed.path.lstrip("/"))
            blob.download_to_file(out)
        else:
            raise StorageError(
                f"{uri}: pvc:// is mounted by Kubernetes; outside a cluster use file://"
            )
    except StorageError:
        raise
    except urllib.error.HTTPError as exc:
        raise StorageError(f"cannot fetch {uri}: HTTP {exc.code} {exc.reason}") from None
    except (OSError, urllib.error.URLError) as exc:
        raise StorageError(f"cannot fetch {uri}: {exc}") from None
    except Exception as exc:  # boto3 / google clients raise their own error types
        raise StorageError(f"cannot fetch {uri}: {type(exc).__name__}: {exc}") from None


def _s3_client() -> Any:
    try:
        import boto3  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise StorageError("s3:// needs boto3 (pip install 'sloline[s3]')") from None
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT")
    if endpoint and "://" not in endpoint:
        https = os.environ.get("S3_USE_HTTPS", "1") != "0"
        endpoint = ("https://" if https else "http://") + endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.client("s3", endpoint_url=endpoint, region_name=region)
