"""Pydantic models of the `PredictionPipeline` resource (sloline.dev/v1alpha1).

These models are the single source of truth for the pipeline format: the YAML users
write, the Kubernetes CRD schema (generated from them, see `crd.py`) and what every other
part reads. Field names are camelCase on the wire (Kubernetes style) and snake_case in
Python. Structural checks that need the whole pipeline (duplicates, cycles, dangling
references, conditions) live in `validate.py` so that they can report exact field paths.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from sloline.common.trace import MAX_PLANNING_ARRIVALS, MAX_RATE_RPS

API_VERSION: Final = "sloline.dev/v1alpha1"
KIND: Final = "PredictionPipeline"

# Open Inference Protocol datatypes: fixed-width numpy arrays, and BYTES (variable-length
# elements, numpy object arrays of `bytes` in Python stages).
Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENTRYPOINT_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
URI_MAX = 1024  # paths and entrypoints (bounds the CRD's CEL rules on them)
TENSOR_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:-]*$"
_TRACE_RULES = (
    "Arrival times in seconds: finite, >= 0, non-decreasing, at least 2 distinct, at most "
    f"{MAX_PLANNING_ARRIVALS:,} of them, at a mean rate of at most {MAX_RATE_RPS:,.0f} rps."
)


class SpecModel(BaseModel):
    """Base: camelCase aliases, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class TensorSpec(SpecModel):
    """A named tensor of one request (no batch dimension); -1 marks a variable dim."""

    name: str = Field(
        pattern=TENSOR_NAME_PATTERN,
        max_length=128,
        description="Tensor name, as the model and the inference protocol call it.",
    )
    datatype: Datatype = Field(description="Open Inference Protocol datatype, e.g. `FP32`.")
    shape: list[int] = Field(
        default_factory=list,
        max_length=8,
        description="Dimensions of one request's tensor, without the batch dimension; -1 "
        "marks a variable dimension. Default: `[]` (a scalar).",
    )


class StageInput(SpecModel):
    """One input of a stage's model: `name` is the model's input name, `from` says where
    the value comes from: a pipeline input (`pixels`) or a stage output (`fast.probs`)."""

    name: str = Field(
        pattern=TENSOR_NAME_PATTERN,
        max_length=128,
        description="The model's input name that receives the value.",
    )
    from_: str = Field(
        alias="from",
        min_length=1,
        max_length=256,
        description="Where the value comes from: a pipeline input (`pixels`) or "
        "`<stage>.<output>` of another stage (`fast.probs`).",
    )
    optional: bool = Field(
        default=False,
        description="If the producing stage was skipped by its condition, run this stage "
        "without the input instead of skipping it too (Python stages only).",
    )


class ModelSpec(SpecModel):
    """How a stage's model is loaded.

    onnx / torchscript: `uri` is a file path, relative to the model directory (the
    pipeline file's directory, or `$SLOLINE_MODEL_DIR` when set, as on Kubernetes).
    python: `entrypoint` is `module:attr` (the module in the model directory); attr is
    a function, or a class that is
    instantiated once with `config` as keyword arguments and then called. `batching`
    says whether it receives stacked arrays (`stacked`) or a list of per-request dicts.
    Paths and entrypoints never leave the model directory: a path is relative, without
    `..`, and stays inside after symlinks (absolute paths are rejected, even inside it);
    `module` (`a.b` = `a/b.py` or `a/b/__init__.py`) is a file inside it, and never a
    standard-library, installed or sloline module.
    """

    runtime: Literal["onnx", "torchscript", "python"] = Field(
        description="Model runtime: `onnx`, `torchscript` or `python`."
    )
    uri: str | None = Field(
        default=None,
        max_length=URI_MAX,
        description="Model file (onnx, torchscript), relative to the model directory.",
    )
    entrypoint: str | None = Field(
        default=None,
        max_length=URI_MAX,
        pattern=ENTRYPOINT_PATTERN,
        description="`module:attr` of a python model, the module in the model directory.",
    )
    batching: Literal["stacked", "list"] = Field(
        default="stacked",
        description="How a python model receives a batch: `stacked` arrays (default) or a "
        "`list` of per-request dicts.",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for a python model class, passed once when it is "
        "instantiated. Default: `{}`.",
    )
    storage_uri: str | None = Field(
        default=None,
        max_length=URI_MAX,
        description=(
            "Fetch the model file from storage (file://, http(s)://, s3://, gs://, pvc://) "
            "instead of reading `uri` from the model directory."
        ),
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Hex SHA-256 of the fetched file; a mismatch fails the fetch.",
    )


# Kubernetes objects inside a pod template (tolerations, volumes, env entries ...) are kept
# as given; the API server checks them when the operator creates the pod.
K8sObjects = list[dict[str, Any]]
K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class ContainerTemplate(SpecModel):
    """Overrides of the pod's sloline container (Kubernetes Container field names)."""

    security_context: dict[str, Any] = Field(
        default_factory=dict,
        description="Container securityContext keys; each replaces the operator's "
        "(allowPrivilegeEscalation false, readOnlyRootFilesystem true, drop ALL).",
    )
    resources: dict[str, dict[str, str | int]] = Field(
        default_factory=dict,
        description="requests / limits / claims; each quantity replaces the hardware "
        "class's of the same resource.",
    )
    env: K8sObjects = Field(
        default_factory=list,
        max_length=256,
        description="EnvVar entries, added to the operator's (whose names are reserved).",
    )
    volume_mounts: K8sObjects = Field(
        default_factory=list,
        max_length=64,
        description="VolumeMount entries of the pod template's volumes.",
    )


class PodTemplate(SpecModel):
    """Overrides of a pod the operator renders (Kubernetes PodSpec field names)."""

    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Pod labels; the operator's own (app.kubernetes.io/*, sloline.dev/*) "
        "cannot be set.",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Pod annotations; sloline.dev/* cannot be set.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=K8S_NAME_PATTERN,
        description="The pod's ServiceAccount.",
    )
    image_pull_secrets: K8sObjects = Field(
        default_factory=list,
        max_length=16,
        description="LocalObjectReference entries ({name: regcred}), added to the defaults.",
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, description="The pod's PriorityClass."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Merged over the hardware class's nodeSelector, key by key.",
    )
    tolerations: K8sObjects = Field(
        default_factory=list,
        max_length=64,
        description="Toleration entries, added to the hardware class's.",
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict,
        description="Affinity: nodeAffinity, podAffinity, podAntiAffinity, each replacing "
        "the default's.",
    )
    security_context: dict[str, Any] = Field(
        default_factory=dict,
        description="PodSecurityContext keys; each replaces the operator's (runAsNonRoot "
        "true, seccompProfile RuntimeDefault, runAsUser/runAsGroup of the operator "
        "settings).",
    )
    volumes: K8sObjects = Field(
        default_factory=list,
        max_length=64,
        description="Volume entries, added to the operator's (whose names are reserved).",
    )
    container: ContainerTemplate | None = Field(
        default=None, description="Overrides of the pod's sloline container."
    )


class StageSpec(SpecModel):
    """One model of the pipeline, with its inputs, outputs and serving bounds."""

    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=40,
        description="Stage name, unique in the pipeline (a DNS label, at most 40 characters).",
    )
    model: ModelSpec
    # Bounded so the CRD's CEL rules stay within the API server's cost budget.
    inputs: list[StageInput] = Field(
        min_length=1, max_length=16, description="The model's inputs (1 to 16)."
    )
    outputs: list[TensorSpec] = Field(
        min_length=1,
        max_length=32,
        description="The model's outputs (1 to 32), referred to as `<stage>.<output>`.",
    )
    when: str | None = Field(
        default=None,
        max_length=1024,
        description="CEL condition over upstream outputs, e.g. "
        "`fast.probabilities[0] < 0.9 && !has(slow.score)`; the stage runs only when it is "
        "true. Supports comparisons, `&& || !`, arithmetic, indexing, `has()`, `size()` and "
        "`max min sum mean abs any all` over a tensor. At most 1024 characters and 32 levels of "
        "syntax tree; an error while evaluating it (division by zero, numpy overflow or "
        "invalid value, shape mismatch) fails that request with 500 naming the condition.",
    )
    hardware: str | None = Field(
        default=None,
        description="Pin the stage to this hardware class of the catalog; unset: the "
        "planner chooses.",
    )
    max_batch: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Pin the largest batch the stage forms (1 to 4096); unset: the planner "
        "chooses.",
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="Pin the number of replicas (0 to 1024); unset: the planner chooses.",
    )
    min_replicas: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="Lower bound on the replicas the planner and tuner choose (0 to 1024).",
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Upper bound on the replicas the planner and tuner choose (1 to 1024).",
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Overrides of this stage's worker pods (and its profiling pods), merged "
        "over spec.podTemplate (docs/kubernetes.md, Shaping pods).",
    )


class SLOSpec(SpecModel):
    """The service level objective: a latency bound at a percentile of requests."""

    latency_ms: float = Field(
        gt=0,
        le=3_600_000,
        description="End-to-end latency bound in milliseconds (at most one hour).",
    )
    percentile: float = Field(
        default=99.0,
        gt=0,
        le=100,
        description="Share of requests, in percent, that must finish within latencyMs. "
        "Default: 99.",
    )


class WorkloadSpec(SpecModel):
    """The planning workload: a rate with burstiness (gamma inter-arrivals with the given
    squared coefficient of variation) or an explicit trace of arrival times in seconds.

    The planner simulates every arrival of the planning trace for each configuration it
    tries, so the number of arrivals and their rate are bounded (`rateRps`, `trace`)."""

    rate_rps: float | None = Field(
        default=None,
        gt=0,
        le=MAX_RATE_RPS,
        description=f"Mean arrival rate; rateRps x durationS at most {MAX_PLANNING_ARRIVALS:,}.",
    )
    cv2: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description="Squared coefficient of variation of the inter-arrival times (1: "
        "Poisson, larger: burstier). Default: 1.",
    )
    duration_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="Length of the planning trace in seconds (at most one day). Default: 60.",
    )
    trace: list[float] | None = Field(default=None, description=_TRACE_RULES)
    trace_uri: str | None = Field(
        default=None,
        max_length=URI_MAX,
        description="A text file in the model directory with the trace's arrival times, one "
        "per line (`#` starts a comment); the same rules as `trace`.",
    )
    seed: int = Field(default=0, description="Random seed of the planning simulation. Default: 0.")


class SamplesSpec(SpecModel):
    """Sample requests for profiling and tests: an `.npz` file with one array per pipeline
    input (first axis = request), or a Python `module:function` returning such a dict
    (both found in the model directory, like the stages' models, with the same rules)."""

    uri: str | None = Field(
        default=None,
        max_length=URI_MAX,
        description="An `.npz` file, relative to the model directory.",
    )
    entrypoint: str | None = Field(
        default=None,
        max_length=URI_MAX,
        pattern=ENTRYPOINT_PATTERN,
        description="`module:function` in the model directory that returns the samples.",
    )


class IngressExposure(SpecModel):
    """An Ingress `<pipeline>` to the router's `http` port."""

    ingress_class_name: str | None = Field(
        default=None, max_length=253, description="Default: the operator settings' class."
    )
    host: str | None = Field(
        default=None,
        max_length=253,
        description="Default: the operator settings' host template; none = every host.",
    )
    path: str = Field(default="/", pattern=r"^/", max_length=1024, description="Path prefix.")
    tls_secret_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=K8S_NAME_PATTERN,
        description="A kubernetes.io/tls Secret for the host: TLS at the Ingress.",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Ingress annotations (e.g. the controller's), over the settings' ones.",
    )


class RouteExposure(SpecModel):
    """A Gateway API route `<pipeline>` to the router's `http` (HTTPRoute) or `grpc`
    (GRPCRoute) port."""

    parent_refs: K8sObjects = Field(
        default_factory=list,
        max_length=32,
        description="ParentReference entries (the Gateway); default: the operator settings'.",
    )
    hostnames: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Default: the operator settings' host template; none = every host.",
    )
    annotations: dict[str, str] = Field(default_factory=dict, description="Route annotations.")


class ExposureSpec(SpecModel):
    """Reaching the pipeline from outside the cluster: each key present creates that object
    (owned by the pipeline) in its namespace (docs/kubernetes.md)."""

    ingress: IngressExposure | None = Field(
        default=None, description="A networking.k8s.io Ingress."
    )
    http_route: RouteExposure | None = Field(
        default=None, description="A gateway.networking.k8s.io/v1 HTTPRoute."
    )
    grpc_route: RouteExposure | None = Field(
        default=None, description="A gateway.networking.k8s.io/v1 GRPCRoute."
    )


class PipelineSpec(SpecModel):
    """A DAG of models served under a latency SLO; the planner chooses hardware, batch
    sizes and replicas for the workload at the lowest cost."""

    slo: SLOSpec
    workload: WorkloadSpec
    hardware: list[str] = Field(
        default_factory=list,
        description="Allowed hardware classes; empty means every class of the catalog.",
    )
    inputs: list[TensorSpec] = Field(
        min_length=1, max_length=64, description="The request's tensors (1 to 64)."
    )
    stages: list[StageSpec] = Field(
        min_length=1, max_length=64, description="The pipeline's stages (1 to 64), a DAG."
    )
    output: str = Field(description="Name of the stage whose outputs are the response.")
    samples: SamplesSpec | None = Field(
        default=None,
        description="Sample requests for profiling; unset: one request of zeros in the inputs' "
        "shapes.",
    )
    storage_uri: str | None = Field(
        default=None,
        max_length=URI_MAX,
        description=(
            "Default storage location of model files: a stage with `model.uri` and no "
            "`model.storageUri` fetches `<storageUri>/<model.uri>`."
        ),
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Overrides of every pod of the pipeline: router, workers, profiling "
        "(docs/kubernetes.md, Shaping pods).",
    )
    router_pod_template: PodTemplate | None = Field(
        default=None, description="Overrides of the router pod, merged over podTemplate."
    )
    profiling_pod_template: PodTemplate | None = Field(
        default=None,
        description="Overrides of the profiling pods, merged over podTemplate and the "
        "stage's podTemplate.",
    )
    exposure: ExposureSpec | None = Field(
        default=None, description="Ingress and Gateway API routes to the router."
    )

    @model_validator(mode="before")
    @classmethod
    def _default_storage(cls, data: Any) -> Any:
        """Give each stage with a `model.uri` and no storage URI of its own the
        pipeline's `storageUri` joined with that `uri`."""
        if not isinstance(data, dict):
            return data
        base = data.get("storageUri", data.get("storage_uri"))
        stages = data.get("stages")
        if not isinstance(base, str) or not isinstance(stages, list):
            return data
        filled = []
        for stage in stages:
            model = stage.get("model") if isinstance(stage, dict) else None
            if (
                isinstance(model, dict)
                and isinstance(model.get("uri"), str)
                and model.get("storageUri", model.get("storage_uri")) is None
            ):
                model = {**model, "storageUri": f"{base.rstrip('/')}/{model['uri']}"}
                filled.append({**stage, "model": model})
            else:
                filled.append(stage)
        return {**data, "stages": filled}


# What only the operator reads (how its pods look, how the router is reached): left out of
# the pipeline file the pods read and of the digests that decide re-profiling and rolls.
KUBERNETES_ONLY: Final[dict[str, Any]] = {
    "pod_template": True,
    "router_pod_template": True,
    "profiling_pod_template": True,
    "exposure": True,
    "stages": {"__all__": {"pod_template": True}},
}
STAGE_KUBERNETES_ONLY: Final[dict[str, Any]] = {"pod_template": True}


class Metadata(SpecModel):
    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PredictionPipeline(SpecModel):
    # Kubernetes adds bookkeeping to objects it returns; only `spec` and `metadata` matter.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    api_version: Literal["sloline.dev/v1alpha1"] = API_VERSION
    kind: Literal["PredictionPipeline"] = KIND
    metadata: Metadata
    spec: PipelineSpec

    @property
    def name(self) -> str:
        return self.metadata.name
