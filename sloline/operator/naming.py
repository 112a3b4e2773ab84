"""Names, labels and annotations of the objects the operator creates (docs/kubernetes.md).

Shared by rendering (what to create), apply (what to prune) and the handlers (what to
read back), so the three never disagree on a name or a selector.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final

from sloline.operator.settings import OperatorSettings
from sloline.spec import PipelineGraph, parse_pipeline
from sloline.spec.models import API_VERSION, KIND
from sloline.spec.shaping import ANNOTATION_ALLOW_UNRESTRICTED

MAX_NAME: Final = 63
CONFIG_DIR: Final = "/etc/sloline"
PIPELINE_FILE: Final = f"{CONFIG_DIR}/pipeline.yaml"
PLAN_FILE: Final = f"{CONFIG_DIR}/plan.json"
CATALOG_FILE: Final = f"{CONFIG_DIR}/catalog.yaml"
HTTP_PORT: Final = 8000
GRPC_PORT: Final = 8001
METRICS_PORT: Final = 8002
WORKER_PORT: Final = 8003  # the router's WorkerService: workers only (NetworkPolicy, token)
WORKER_HEALTH_PORT: Final = 8080
WORKER_GRACE_S: Final = 30
# A deleted router keeps serving this long before its SIGTERM, while the cluster takes it
# out of the client Service's endpoints (kube-proxies, load balancers); then it drains
# (`sloline router --drain-s`) and exits, within its grace period: preStop + drain + the
# servers' stop (2 s) < grace.
ROUTER_PRESTOP_S: Final = 5
ROUTER_GRACE_S: Final = 30
# Router gRPC connections are closed (gracefully: GOAWAY, calls in flight served) at this
# age, so gRPC clients spread over new routers and leave a draining one without a
# cancelled call; its drain waits for them (age + 10 % jitter + 0.5 s: 11.5 s) within ...
ROUTER_GRPC_MAX_AGE_S: Final = 10
# ... this bound (`--drain-s`).
ROUTER_DRAIN_S: Final = 15
WORKER_TOKEN_KEY: Final = "token"  # noqa: S105 - the key in `<p>-worker-token`
TMP_DIR: Final = "/tmp"  # noqa: S108 - the one writable path of a read-only root: an emptyDir
# The init container that fetches a stage's model from storage (its `storageUri`).
STORAGE_INITIALIZER: Final = "storage-initializer"

MANAGER: Final = "sloline-operator"
LABEL_PIPELINE: Final = "sloline.dev/pipeline"
LABEL_STAGE: Final = "sloline.dev/stage"
LABEL_HARDWARE: Final = "sloline.dev/hardware"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
ANNOTATION_CONFIG_HASH: Final = "sloline.dev/config-hash"
ANNOTATION_PLANNED_REPLICAS: Final = "sloline.dev/planned-replicas"
ANNOTATION_PROFILE_KEY: Final = "sloline.dev/profile-key"
ANNOTATION_MODEL_DIR: Final = "sloline.dev/model-dir"
ANNOTATION_PLAN_INPUTS: Final = "sloline.dev/plan-inputs"
# The client front doors (docs/operations.md, "Security and threat model"): names of
# Secrets in the pipeline's namespace that the router pod mounts.
ANNOTATION_TLS_SECRET: Final = "sloline.dev/tls-secret"  # noqa: S105 - tls.crt, tls.key
ANNOTATION_CLIENT_CA_SECRET: Final = "sloline.dev/client-ca-secret"  # noqa: S105 - ca.crt
ANNOTATION_AUTH_SECRET: Final = "sloline.dev/auth-secret"  # noqa: S105 - tokens
SECRETS_DIR: Final = "/var/run/sloline"


def object_name(*parts: str) -> str:
    """`-`-joined parts; past 63 characters cut and suffixed with a hash of the full name,
    so long names stay unique, valid DNS labels and stable across renders."""
    name = "-".join(parts)
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9].rstrip('-')}-{digest}"


def config_map_name(pipeline: str) -> str:
    return object_name(pipeline, "config")


def profiles_name(pipeline: str) -> str:
    return object_name(pipeline, "profiles")


def router_name(pipeline: str) -> str:
    return object_name(pipeline, "router")


def worker_service_name(pipeline: str) -> str:
    """The headless Service that carries only the router's worker port: its name resolves
    to every router pod, ready or not."""
    return object_name(pipeline, "router-workers")


def worker_secret_name(pipeline: str) -> str:
    return object_name(pipeline, "worker-token")


def worker_name(pipeline: str, stage: str) -> str:
    return object_name(pipeline, stage)


def job_name(pipeline: str, stage: str, hardware: str) -> str:
    return object_name(pipeline, "profile", stage, hardware)


def labels(
    pipeline: str, component: str, stage: str | None = None, hardware: str | None = None
) -> dict[str, str]:
    """The labels of docs/kubernetes.md; selectors use a stable subset (`selector`)."""
    out = {
        "app.kubernetes.io/name": "sloline",
        "app.kubernetes.io/instance": pipeline,
        LABEL_COMPONENT: component,
        "app.kubernetes.io/managed-by": MANAGER,
        LABEL_PIPELINE: pipeline,
    }
    if stage is not None:
        out[LABEL_STAGE] = stage
    if hardware is not None:
        out[LABEL_HARDWARE] = hardware
    return out


def selector(pipeline: str, component: str, stage: str | None = None) -> dict[str, str]:
    """Pod selector labels: never the hardware class (a Deployment's selector is immutable
    and a re-plan may move a stage to another class)."""
    out = {LABEL_PIPELINE: pipeline, LABEL_COMPONENT: component}
    if stage is not None:
        out[LABEL_STAGE] = stage
    return out


def managed_selector(pipeline: str) -> str:
    """Label selector of everything the operator created for `pipeline`."""
    return f"{LABEL_PIPELINE}={pipeline},app.kubernetes.io/managed-by={MANAGER}"


@dataclass(frozen=True, slots=True)
class Target:
    """The pipeline being rendered: its identity and validated DAG."""

    name: str
    namespace: str
    uid: str
    graph: PipelineGraph
    model_dir_annotation: str | None = None
    tls_secret: str | None = None  # the router's TLS certificate and key
    client_ca_secret: str | None = None  # require client certificates signed by its ca.crt
    auth_secret: str | None = None  # bearer tokens (key `tokens`, one per line)
    allow_unrestricted_pods: bool = False  # pod templates may break Pod Security restricted

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Target:
        """From a PredictionPipeline object as the API returns it (raises `PipelineError`
        when the spec is invalid)."""
        meta = obj.get("metadata", {})
        annotations = meta.get("annotations") or {}
        return cls(
            name=str(meta["name"]),
            namespace=str(meta.get("namespace") or "default"),
            uid=str(meta.get("uid", "")),
            graph=parse_pipeline(pipeline_document(obj), f"{meta.get('namespace')}/{meta['name']}"),
            model_dir_annotation=annotations.get(ANNOTATION_MODEL_DIR),
            tls_secret=annotations.get(ANNOTATION_TLS_SECRET) or None,
            client_ca_secret=annotations.get(ANNOTATION_CLIENT_CA_SECRET) or None,
            auth_secret=annotations.get(ANNOTATION_AUTH_SECRET) or None,
            allow_unrestricted_pods=annotations.get(ANNOTATION_ALLOW_UNRESTRICTED) == "true",
        )

    def model_dir(self, settings: OperatorSettings) -> str:
        """`SLOLINE_MODEL_DIR`: `<models.root>/<p>`, or the `sloline.dev/model-dir`
        annotation (relative to `models.root`, or absolute inside it); raises
        `ValueError` for an annotation `model_dir_problem` rejects."""
        root = settings.models.root.rstrip("/")
        given = self.model_dir_annotation
        if given is None:
            return f"{root}/{self.name}"
        problem = model_dir_problem(given, settings.models.root)
        if problem:
            raise ValueError(f"annotation {ANNOTATION_MODEL_DIR}: {problem}")
        path = PurePosixPath(given)
        return str(path) if path.is_absolute() else f"{root}/{path}"

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(
        self, name: str, object_labels: Mapping[str, str], annotations: Mapping[str, str]
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": dict(object_labels),
            "ownerReferences": [self.owner_reference()],
        }
        if annotations:
            meta["annotations"] = dict(annotations)
        return meta


def model_dir_problem(given: str, root: str) -> str | None:
    """Why the `sloline.dev/model-dir` annotation `given` may not be used with the models
    root `root`, or None: it must name a directory under the root (relative to it, or
    absolute inside it), without `..` or empty components. Checked on the text: the
    operator does not see the models volume (the pods check symlinks inside it)."""
    root_path = PurePosixPath(root)
    if not given or given != given.strip() or "\x00" in given:
        return f"{given!r} is not a directory path"
    path = PurePosixPath(given)
    parts = given.split("/")
    if ".." in parts or "." in parts or "\\" in given:
        return f"{given!r} contains '..', '.' or a backslash; name a directory under {root}"
    if path.is_absolute():
        if path == root_path or not path.is_relative_to(root_path):
            return (
                f"{given!r} is not under the operator's models root {root} "
                "(models.root); give a directory under it, e.g. relative to it"
            )
    elif "" in parts[:-1]:
        return f"{given!r} has an empty path component"
    return None


def pipeline_document(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a PredictionPipeline object the spec models read (the API adds uid,
    resourceVersion, status ... which the strict metadata model would reject)."""
    meta = obj.get("metadata", {})
    doc_meta = {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if meta.get(k)}
    return {
        "apiVersion": obj.get("apiVersion", API_VERSION),
        "kind": obj.get("kind", KIND),
        "metadata": doc_meta,
        "spec": obj.get("spec"),
    }


def digest(value: Any, length: int = 16) -> str:
    """A short, stable digest of JSON-able data."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]
