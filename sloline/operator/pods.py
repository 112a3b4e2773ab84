"""The pods that run sloline on Kubernetes: the router and worker Deployments and the
profiling Jobs. Pure functions, like the rest of rendering (`sloline.operator.render`).

Every pod passes the Pod Security Standard `restricted` (`_pod_security`): non-root,
no privilege escalation, no capabilities, the runtime's default seccomp profile, a
read-only root filesystem with an emptyDir at /tmp (the images' HOME and caches), and no
service-account token (none of them calls the API). The router and the workers read the
worker token from `<p>-worker-token` through the environment (`_env`).

Each pod is then shaped (`_shape`): the operator settings' `pods`, the spec's
`podTemplate` and the pod's own template (the router's, the stage's, the profiling one)
are merged over it in that order (`sloline.spec.shaping`), and the result must still pass
`restricted` unless the pipeline opts out, and no template may override what the operator
relies on; otherwise rendering raises `TemplateError`.

Each pod template carries `sloline.dev/config-hash`, a digest of exactly the ConfigMap
content that pod reads: the router's covers the whole pipeline file and the plan, a
worker's only its own stage (its spec and the tensors it receives). The ConfigMap is
mounted, so without the hash a spec change would restart nothing; with it, a change to
one stage rolls that stage's Deployment and the router, nothing else.
"""

from __future__ import annotations

import copy
import functools
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sloline.operator.naming import (
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_PLANNED_REPLICAS,
    ANNOTATION_PROFILE_KEY,
    CATALOG_FILE,
    CONFIG_DIR,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    PIPELINE_FILE,
    PLAN_FILE,
    ROUTER_DRAIN_S,
    ROUTER_GRACE_S,
    ROUTER_GRPC_MAX_AGE_S,
    ROUTER_PRESTOP_S,
    SECRETS_DIR,
    STORAGE_INITIALIZER,
    TMP_DIR,
    WORKER_GRACE_S,
    WORKER_HEALTH_PORT,
    WORKER_PORT,
    WORKER_TOKEN_KEY,
    Target,
    config_map_name,
    digest,
    job_name,
    labels,
    profiles_name,
    router_name,
    selector,
    worker_name,
    worker_secret_name,
    worker_service_name,
)
from sloline.operator.settings import OperatorSettings
from sloline.serving.auth import WORKER_TOKEN_ENV
from sloline.spec import HardwareClass, Issue, PipelineGraph
from sloline.spec.models import STAGE_KUBERNETES_ONLY, PodTemplate
from sloline.spec.shaping import (
    ANNOTATION_ALLOW_UNRESTRICTED,
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    Problems,
    apply_templates,
    restricted_violations,
)

Manifest = dict[str, Any]


class TemplateError(ValueError):
    """Pod templates that would replace what the operator relies on, or break Pod
    Security `restricted`: `problems` lists each as (field path, reason)."""

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {reason}" for path, reason in problems))


def stage_inputs(graph: PipelineGraph, stage: str) -> list[dict[str, Any]]:
    """What a stage's worker reads from the pipeline file besides its own spec: the
    tensors feeding each model input (a pipeline input or an upstream output)."""
    node = graph.stages[stage]
    pipeline_inputs = {t.name: t for t in graph.inputs}
    out = []
    for name, ref, _optional in node.input_refs:
        if ref.stage:
            spec = next(t for t in graph.stages[ref.stage].spec.outputs if t.name == ref.tensor)
        else:
            spec = pipeline_inputs[ref.tensor]
        out.append({"input": name, **spec.model_dump(mode="json", by_alias=True)})
    return out


def worker_config_hash(graph: PipelineGraph, stage: str) -> str:
    spec = graph.stages[stage].spec.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude=STAGE_KUBERNETES_ONLY
    )
    return digest({"stage": spec, "inputs": stage_inputs(graph, stage)})


def router_config_hash(config_data: Mapping[str, str]) -> str:
    return digest(dict(config_data))


# --- pod parts ---------------------------------------------------------------------------


def _env(
    target: Target, settings: OperatorSettings, threads: int | None, *, token: bool = False
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in (
            ("POD_IP", "status.podIP"),
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        )
    ]
    env.append({"name": "SLOLINE_MODEL_DIR", "value": target.model_dir(settings)})
    env += settings.observability.env(target.name)
    if threads is not None:
        env += [
            {"name": "OMP_NUM_THREADS", "value": str(threads)},
            {"name": "MKL_NUM_THREADS", "value": str(threads)},
        ]
    if token:  # the worker token, from the Secret: never in args (the pod spec shows them)
        ref = {"name": worker_secret_name(target.name), "key": WORKER_TOKEN_KEY}
        env.append({"name": WORKER_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}})
    return env


def _volumes(
    settings: OperatorSettings, config_map: str, items: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts): the config at /etc/sloline, an emptyDir at /tmp (the only
    writable path: HOME, caches, worker logs of a profiling probe), the models at
    models.root."""
    source: dict[str, Any] = {"name": config_map}
    if items:
        source["items"] = [{"key": key, "path": key} for key in items]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": source},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TMP_DIR},
    ]
    if settings.models.volume:
        volumes.append({"name": "models", **settings.models.volume})
        mounts.append({"name": "models", "mountPath": settings.models.root, "readOnly": True})
    return volumes, mounts


def _placement(hw: HardwareClass) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if hw.kubernetes.node_selector:
        out["nodeSelector"] = dict(sorted(hw.kubernetes.node_selector.items()))
    if hw.kubernetes.tolerations:
        out["tolerations"] = [dict(t) for t in hw.kubernetes.tolerations]
    return out


def _http_probe(path: str, port: str, period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "failureThreshold": failures,
    }


def _flags(command: str, flags: Mapping[str, object]) -> list[str]:
    """`command --flag value ...` as container args, in the order given."""
    return [command, *(part for flag, value in flags.items() for part in (flag, str(value)))]


def _container(
    name: str, settings: OperatorSettings, args: list[str], **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "image": settings.runtime_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["sloline"],
        "args": args,
        "securityContext": copy.deepcopy(dict(RESTRICTED_CONTAINER_SECURITY)),
        **extra,
    }


def _pod_security() -> dict[str, Any]:
    """Pod-level settings of Pod Security `restricted`; the container's are in `_container`."""
    return {
        "securityContext": copy.deepcopy(dict(RESTRICTED_POD_SECURITY)),
        "automountServiceAccountToken": False,
    }


def _port(name: str, number: int) -> dict[str, Any]:
    return {"name": name, "containerPort": number, "protocol": "TCP"}


def _resources(hw: HardwareClass) -> dict[str, Any]:
    resources = hw.kubernetes.resources
    return {"resources": {k: dict(v) for k, v in resources.items()}} if resources else {}


def _pod_template(
    pod_labels: Mapping[str, str],
    annotations: Mapping[str, str],
    container: Mapping[str, Any],
    volumes: list[dict[str, Any]],
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"labels": dict(pod_labels), "annotations": dict(annotations)},
        "spec": {"containers": [dict(container)], "volumes": volumes, **_pod_security(), **spec},
    }


MODEL_CACHE_DIR = "/var/cache/sloline/models"
MODEL_SOURCE_DIR = (
    "/var/cache/sloline/source"  # pvc:// claims (`<dir>/<claim>`), for the initializer
)
ANNOTATION_STORAGE_SECRET = "sloline.dev/storage-secret"  # noqa: S105 (a name, not a secret)


def _with_model_storage(
    template: dict[str, Any], target: Target, settings: OperatorSettings, stages: Sequence[str]
) -> dict[str, Any]:
    """`template` with a `storage-initializer` init container when a model of `stages`
    comes from storage: it runs `sloline fetch-models` into an emptyDir that the pod's
    container reads as its model cache (a worker fetches its stage's model, a profiling
    pod every stage's: it runs the whole pipeline on the samples). Credentials
    (AWS_ACCESS_KEY_ID, ...) come from the Secret named by the pipeline's
    `sloline.dev/storage-secret` annotation; a `pvc://` claim is mounted read-only into
    the init container, which copies from it."""
    models = [(s, target.graph.stages[s].spec.model) for s in stages]
    fetched = [(s, m.storage_uri, m.sha256) for s, m in models if m.storage_uri is not None]
    if not fetched:
        return template
    args = ["fetch-models", "--into", MODEL_CACHE_DIR]
    mount = {"name": "model-cache", "mountPath": MODEL_CACHE_DIR}
    mounts: list[dict[str, Any]] = [mount, {"name": "tmp", "mountPath": TMP_DIR}]
    volumes: list[dict[str, Any]] = [{"name": "model-cache", "emptyDir": {}}]
    claims: list[str] = []
    for stage, uri, sha256 in fetched:
        args += ["--model", f"{stage}={uri}"]
        if sha256:
            args += ["--sha256", f"{stage}={sha256}"]
        claim = urllib.parse.urlsplit(uri)
        if claim.scheme == "pvc":  # mount the claim; the initializer copies the file from it
            if claim.netloc not in claims:
                claims.append(claim.netloc)
                name, path = f"model-source-{len(claims)}", f"{MODEL_SOURCE_DIR}/{claim.netloc}"
                source = {"claimName": claim.netloc, "readOnly": True}
                volumes.append({"name": name, "persistentVolumeClaim": source})
                mounts.append({"name": name, "mountPath": path, "readOnly": True})
            args += ["--source", f"{stage}=file://{MODEL_SOURCE_DIR}/{claim.netloc}{claim.path}"]
    extra: dict[str, Any] = {}
    secret = target.graph.pipeline.metadata.annotations.get(ANNOTATION_STORAGE_SECRET)
    if secret:
        extra["envFrom"] = [{"secretRef": {"name": secret}}]
    init = _container(
        STORAGE_INITIALIZER,
        settings,
        args,
        volumeMounts=mounts,
        # fetch-models writes its one-line reason there; a crash leaves the log's tail
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="FallbackToLogsOnError",
        **extra,
    )
    spec = template["spec"]
    container = spec["containers"][0]
    container["env"] = [
        *container.get("env", []),
        {"name": "SLOLINE_MODEL_CACHE", "value": MODEL_CACHE_DIR},
    ]
    container["volumeMounts"] = [*container.get("volumeMounts", []), {**mount, "readOnly": True}]
    spec["volumes"] = [*spec["volumes"], *volumes]
    spec["initContainers"] = [*spec.get("initContainers", []), init]
    return template


def _shape(
    template: dict[str, Any],
    target: Target,
    settings: OperatorSettings,
    pod: str,
    *layers: tuple[str, PodTemplate | None],
) -> dict[str, Any]:
    """`template` with the settings' pods, the spec's podTemplate and `layers` merged over
    it; raises `TemplateError` when the templates make the pod break Pod Security
    `restricted` (unless the pipeline allows it) or override what the operator relies on.
    What the operator itself renders from the chart's settings (a hostPath `models.root`
    on a single-node cluster) is the administrator's choice and is not judged here."""
    spec = target.graph.pipeline.spec
    given = (("settings.pods", settings.pods), ("spec.podTemplate", spec.pod_template), *layers)
    present = [(where, layer) for where, layer in given if layer is not None]
    rendered = set(restricted_violations(template["spec"]))
    template, found = apply_templates(template, present)
    violations = [v for v in restricted_violations(template["spec"]) if v not in rendered]
    if violations and not target.allow_unrestricted_pods:
        reason = (
            f"the {pod} pod would not pass Pod Security restricted: {'; '.join(violations)} "
            f'(annotation {ANNOTATION_ALLOW_UNRESTRICTED}: "true" allows it)'
        )
        found.append((present[-1][0] if present else "spec", reason))
    if found:
        raise TemplateError(found)
    return template


def _stage_layer(target: Target, stage: str) -> tuple[str, PodTemplate | None]:
    """The stage's podTemplate, named by its path in the spec."""
    index = [s.name for s in target.graph.pipeline.spec.stages].index(stage)
    return f"spec.stages[{index}].podTemplate", target.graph.stages[stage].spec.pod_template


# --- workloads -----------------------------------------------------------------------------


def render_router(
    target: Target, settings: OperatorSettings, config_data: Mapping[str, str], replicas: int
) -> Manifest:
    """The router Deployment: `replicas` routers, each with its own stage queues and every
    worker connected to all of them. A rollout adds a router before it removes one
    (`maxUnavailable: 0`); a removed router keeps serving for `ROUTER_PRESTOP_S` while the
    client Service drops it, then drains on SIGTERM (gRPC clients leave as their
    connections reach `ROUTER_GRPC_MAX_AGE_S`). `replicas` is set like a worker
    Deployment's (`sloline.dev/planned-replicas`). Its Services, NetworkPolicy and
    PodDisruptionBudget are in `sloline.operator.render`."""
    name = router_name(target.name)
    pod_labels = labels(target.name, "router")
    volumes, mounts = _volumes(settings, config_map_name(target.name))
    args = _flags(
        "router",
        {
            "--pipeline": PIPELINE_FILE,
            "--plan": PLAN_FILE,
            "--host": "$(POD_IP)",
            "--port": HTTP_PORT,
            "--grpc-port": GRPC_PORT,
            "--metrics-port": METRICS_PORT,
            "--worker-port": WORKER_PORT,
            "--grpc-max-age-s": ROUTER_GRPC_MAX_AGE_S,
            "--drain-s": ROUTER_DRAIN_S,
            # The headless Service's name resolves to every router pod: each router adds
            # the others' Triton statistics (on their metrics ports) to its own.
            "--peers": f"{worker_service_name(target.name)}:{METRICS_PORT}",
        },
    )
    args += _front_door_args(target, volumes, mounts)
    # With TLS the kubelet's probes (no client certificate) go to the plain metrics port,
    # which also answers the health paths.
    probe_port = "metrics" if target.tls_secret else "http"
    container = _container(
        "router",
        settings,
        args,
        env=_env(target, settings, None, token=True),
        ports=[
            _port("http", HTTP_PORT),
            _port("grpc", GRPC_PORT),
            _port("metrics", METRICS_PORT),
            _port("worker", WORKER_PORT),
        ],
        # Ready: a worker of every stage connected, not draining, not wedged.
        readinessProbe=_http_probe("/v2/health/ready", probe_port, 2, 3),
        livenessProbe=_http_probe("/v2/health/live", probe_port, 10, 6),
        lifecycle={"preStop": {"sleep": {"seconds": ROUTER_PRESTOP_S}}},
        volumeMounts=mounts,
    )
    if settings.router.resources:
        container["resources"] = {
            k: {r: str(q) for r, q in v.items()} for k, v in settings.router.resources.items()
        }
    template = _pod_template(
        pod_labels,
        {ANNOTATION_CONFIG_HASH: router_config_hash(config_data)},
        container,
        volumes,
        terminationGracePeriodSeconds=ROUTER_GRACE_S,
    )
    spec = target.graph.pipeline.spec
    template = _shape(
        template, target, settings, "router", ("spec.routerPodTemplate", spec.router_pod_template)
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": target.metadata(name, pod_labels, {ANNOTATION_PLANNED_REPLICAS: str(replicas)}),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(target.name, "router")},
            # A new router is ready once workers of every stage have connected to it; only
            # then does an old one go, so a rollout never drops below `replicas` ready.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": template,
        },
    }


def _front_door_args(
    target: Target, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> list[str]:
    """The router's TLS and bearer-token flags, each file from a Secret the pipeline's
    annotations name (`sloline.dev/tls-secret`, `client-ca-secret`, `auth-secret`),
    mounted read-only under /var/run/sloline; appends the volumes and mounts."""
    args: list[str] = []
    for secret, folder, flags in (
        (target.tls_secret, "tls", (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key"))),
        (target.client_ca_secret, "client-ca", (("--tls-client-ca", "ca.crt"),)),
        (target.auth_secret, "auth", (("--auth-token-file", "tokens"),)),
    ):
        if not secret:
            continue
        volume = f"front-door-{folder}"
        items = [{"key": key, "path": key} for _, key in flags]
        volumes.append({"name": volume, "secret": {"secretName": secret, "items": items}})
        path = f"{SECRETS_DIR}/{folder}"
        mounts.append({"name": volume, "mountPath": path, "readOnly": True})
        for flag, key in flags:
            args += [flag, f"{path}/{key}"]
    return args


def render_worker(
    target: Target, settings: OperatorSettings, stage: str, hardware: str, replicas: int
) -> Manifest:
    """`<p>-<stage>`: the stage's workers on its planned hardware class. `replicas` is the
    plan's count; apply sets it at creation and when the plan's count changes, and the
    tuner owns it in between (the `sloline.dev/planned-replicas` annotation remembers it)."""
    hw = settings.catalog.get(hardware)
    pod_labels = labels(target.name, "worker", stage, hardware)
    volumes, mounts = _volumes(settings, config_map_name(target.name))
    args = _flags(
        "worker",
        {
            "--pipeline": PIPELINE_FILE,
            "--stage": stage,
            "--router": f"{worker_service_name(target.name)}:{WORKER_PORT}",
            "--threads": hw.embedded.threads,
            "--hardware": hardware,
            "--health-host": "$(POD_IP)",
            "--health-port": WORKER_HEALTH_PORT,
        },
    )
    if hw.accelerator == "gpu":
        args += ["--cuda-device", "0"]  # the device plugin shows the pod its GPU as 0
    container = _container(
        "worker",
        settings,
        args,
        env=_env(target, settings, hw.embedded.threads, token=True),
        ports=[_port("health", WORKER_HEALTH_PORT)],
        readinessProbe=_http_probe("/ready", "health", 2, 3),
        livenessProbe=_http_probe("/live", "health", 10, 6),
        volumeMounts=mounts,
        **_resources(hw),
    )
    template = _pod_template(
        pod_labels,
        {ANNOTATION_CONFIG_HASH: worker_config_hash(target.graph, stage)},
        container,
        volumes,
        terminationGracePeriodSeconds=WORKER_GRACE_S,
        **_placement(hw),
    )
    template = _with_model_storage(template, target, settings, [stage])
    template = _shape(template, target, settings, f"{stage} worker", _stage_layer(target, stage))
    meta = target.metadata(
        worker_name(target.name, stage), pod_labels, {ANNOTATION_PLANNED_REPLICAS: str(replicas)}
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(target.name, "worker", stage)},
            "template": template,
        },
    }


def render_profiling_job(
    target: Target, settings: OperatorSettings, stage: str, hardware: str, key: str
) -> Manifest:
    """`<p>-profile-<stage>-<hw>`: one pod on that hardware class measures the stage and
    writes its profile to the termination message. The cache key it will fill is on the
    Job and its pod, so a result is never filed under another spec's key."""
    hw = settings.catalog.get(hardware)
    pod_labels = labels(target.name, "profiler", stage, hardware)
    volumes, mounts = _volumes(
        settings, profiles_name(target.name), items=("pipeline.yaml", "catalog.yaml")
    )
    profiling = settings.profiling
    flags: dict[str, object] = {
        "--pipeline": PIPELINE_FILE,
        "--stage": stage,
        "--hardware": hardware,
        "--catalog": CATALOG_FILE,
        "--cap": profiling.cap,
        "--repeats": profiling.repeats,
        "--budget-s": f"{profiling.budget_s:g}",
    }
    if profiling.hop_s is not None:  # the planner takes the setting: no probe to run
        flags["--hop-requests"] = 0
    args = _flags("profile-job", flags)
    if hw.accelerator == "gpu":
        args += ["--cuda-device", "0"]  # as the worker's: the device plugin's one GPU
    container = _container(
        "profiler",
        settings,
        args,
        env=_env(target, settings, hw.embedded.threads),
        volumeMounts=mounts,
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="File",
        **_resources(hw),
    )
    annotations = {ANNOTATION_PROFILE_KEY: key}
    template = _pod_template(
        pod_labels, annotations, container, volumes, restartPolicy="Never", **_placement(hw)
    )
    template = _with_model_storage(template, target, settings, target.graph.order)
    template = _shape(
        template,
        target,
        settings,
        f"{stage} profiling",
        _stage_layer(target, stage),
        ("spec.profilingPodTemplate", target.graph.pipeline.spec.profiling_pod_template),
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": target.metadata(
            job_name(target.name, stage, hardware), pod_labels, annotations
        ),
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": profiling.active_deadline_s,
            "template": template,
        },
    }


def pod_issues(target: Target, settings: OperatorSettings) -> list[Issue]:
    """What keeps the pipeline's pods from rendering: a pod template that overrides what
    the operator relies on, or that breaks Pod Security `restricted` over the settings'
    `pods` (each stage checked on its first allowed hardware class)."""
    spec = target.graph.pipeline.spec
    allowed = spec.hardware or settings.catalog.names()
    renders: list[Callable[[], object]] = [lambda: render_router(target, settings, {}, 1)]
    for stage in target.graph.order:
        hardware = target.graph.stages[stage].spec.hardware or allowed[0]
        renders += [
            functools.partial(render_worker, target, settings, stage, hardware, 1),
            functools.partial(render_profiling_job, target, settings, stage, hardware, ""),
        ]
    issues: list[Issue] = []
    for render in renders:
        try:
            render()
        except TemplateError as exc:
            issues += [Issue(*p) for p in exc.problems if Issue(*p) not in issues]
    return issues
