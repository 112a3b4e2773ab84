"""Render a PredictionPipeline into the Kubernetes objects that serve it: pure functions.

`(pipeline, plan, settings) -> manifests`, with the names, labels, commands, ports and
mounts fixed in docs/kubernetes.md (`naming.py` holds the names). Nothing here does I/O
or reads a clock, so the same inputs always give identical objects: the operator's apply
step compares what it renders with what is live, and a re-render after a restart changes
nothing.

Every pod passes the Pod Security Standard `restricted` (`_pod_security`): non-root as
the image's user, no privilege escalation, no capabilities, the runtime's default seccomp
profile, a read-only root filesystem with an emptyDir at /tmp (the images' HOME and
caches), and no service-account token (none of them calls the API). The router's worker
port is reached through a Service of its own, only by the pipeline's worker pods (a
NetworkPolicy) and only with the pipeline's worker token (`<p>-worker-token`, a Secret
the operator creates once and keeps; `render_worker_secret`).

Each pod template carries `sloline.dev/config-hash`, a digest of exactly the ConfigMap
content that pod reads: the router's covers the whole pipeline file and the plan, a
worker's only its own stage (its spec and the tensors it receives). The ConfigMap is
mounted, so without the hash a spec change would restart nothing; with it, a change to
one stage rolls that stage's Deployment and the router, nothing else.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from sloline.operator.naming import (
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_PLAN_INPUTS,
    ANNOTATION_PLANNED_REPLICAS,
    ANNOTATION_PROFILE_KEY,
    CATALOG_FILE,
    CONFIG_DIR,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    PIPELINE_FILE,
    PLAN_FILE,
    RUN_AS_USER,
    SECRETS_DIR,
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
from sloline.planner.plan import Plan
from sloline.serving.auth import WORKER_TOKEN_ENV
from sloline.spec import HardwareClass, PipelineGraph
from sloline.spec.models import API_VERSION, KIND

Manifest = dict[str, Any]


def pipeline_file(graph: PipelineGraph) -> str:
    """`pipeline.yaml` as `sloline validate` reads it: the normalised spec, no cluster
    metadata (labels and annotations would roll pods for no reason)."""
    pipeline = graph.pipeline
    doc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": pipeline.metadata.name},
        "spec": pipeline.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    return yaml.safe_dump(doc, sort_keys=True)


def plan_file(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), sort_keys=True, indent=1) + "\n"


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
    spec = graph.stages[stage].spec.model_dump(mode="json", by_alias=True, exclude_none=True)
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
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        **extra,
    }


def _pod_security() -> dict[str, Any]:
    """Pod-level settings of Pod Security `restricted`; the container's are in `_container`."""
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
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


# --- objects -------------------------------------------------------------------------------


def render_config_map(target: Target, plan: Plan, plan_inputs: str) -> Manifest:
    """`<p>-config`: the pipeline file and the plan, the pair every serving pod reads. It
    changes only when a new plan is deployed, so a pod that restarts while a changed spec
    is being re-profiled still reads a pipeline and a plan that belong together."""
    meta = target.metadata(
        config_map_name(target.name),
        labels(target.name, "config"),
        {ANNOTATION_PLAN_INPUTS: plan_inputs},
    )
    data = {"pipeline.yaml": pipeline_file(target.graph), "plan.json": plan_file(plan)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def render_profiles_cache(
    target: Target, files: Mapping[str, str], entries: Mapping[str, str]
) -> Manifest:
    """`<p>-profiles`: what the profiling Jobs mount (`files`: `pipeline.yaml`, the spec
    being profiled, and `catalog.yaml`, the hardware classes) and one key per measured
    `<stage>.<hardware>.<digest>` holding that Job's message."""
    meta = target.metadata(profiles_name(target.name), labels(target.name, "profiler"), {})
    data = {k: files[k] for k in ("pipeline.yaml", "catalog.yaml")}
    data.update(sorted(entries.items()))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def render_router(
    target: Target, settings: OperatorSettings, config_data: Mapping[str, str]
) -> list[Manifest]:
    """The router Deployment (one replica: it holds the centralized stage queues), its
    Service with the clients' `http` and `grpc` ports and `metrics`, the Service
    `<p>-router-workers` with only the `worker` port, and the NetworkPolicy that lets only
    the pipeline's worker pods reach that port."""
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
        readinessProbe=_http_probe("/v2/health/ready", probe_port, 2, 3),
        livenessProbe=_http_probe("/v2/health/live", probe_port, 10, 6),
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
        terminationGracePeriodSeconds=WORKER_GRACE_S,
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": target.metadata(name, pod_labels, {}),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector(target.name, "router")},
            # Workers stream from one router; two at once would split the stage queues,
            # so the old router goes before the new one starts.
            "strategy": {"type": "Recreate"},
            "template": template,
        },
    }
    ports = [
        {"name": n, "port": p, "targetPort": n, "protocol": "TCP"}
        for n, p in (("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT))
    ]
    ports[1]["appProtocol"] = "grpc"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": target.metadata(name, pod_labels, {}),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(target.name, "router"),
            "ports": ports,
            # The router turns ready only once workers connect, and workers dial it
            # through this Service: with ready endpoints only, neither would ever start.
            "publishNotReadyAddresses": True,
        },
    }
    worker_service = {
        "apiVersion": "v1",
        "kind": "Service",
        # Its own component label: the ServiceMonitor selects the client Service only.
        "metadata": target.metadata(
            worker_service_name(target.name), labels(target.name, "router-workers"), {}
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(target.name, "router"),
            "ports": [
                {
                    "name": "worker",
                    "port": WORKER_PORT,
                    "targetPort": "worker",
                    "protocol": "TCP",
                    "appProtocol": "grpc",
                }
            ],
            "publishNotReadyAddresses": True,  # as above: workers make the router ready
        },
    }
    return [deployment, service, worker_service, render_network_policy(target)]


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


def render_network_policy(target: Target) -> Manifest:
    """`<p>-router`: ingress to the router pod: the worker port from this pipeline's worker
    pods only; the client ports and metrics from anywhere (the router's Service exposes
    them; a cluster may add its own policies on top)."""
    port = {"protocol": "TCP", "port": WORKER_PORT}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": target.metadata(router_name(target.name), labels(target.name, "router"), {}),
        "spec": {
            "podSelector": {"matchLabels": selector(target.name, "router")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": selector(target.name, "worker")}}],
                    "ports": [port],
                },
                {
                    "ports": [
                        {"protocol": "TCP", "port": p} for p in (HTTP_PORT, GRPC_PORT, METRICS_PORT)
                    ]
                },
            ],
        },
    }


def render_worker_secret(target: Target, token: str) -> Manifest:
    """`<p>-worker-token`: the token the router asks of workers. The caller supplies it
    (the live Secret's, or a new random one the first time), so rendering stays pure."""
    meta = target.metadata(worker_secret_name(target.name), labels(target.name, "worker-token"), {})
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {WORKER_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def secret_token(secret: Mapping[str, Any] | None) -> str | None:
    """The token in a live `<p>-worker-token`, or None when it is missing or unusable."""
    if secret is None:
        return None
    value = (secret.get("data") or {}).get(WORKER_TOKEN_KEY)
    try:
        token = base64.b64decode(value, validate=True).decode() if value else ""
    except (ValueError, UnicodeDecodeError):
        return None
    return token if token.strip() and token.isprintable() and " " not in token else None


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


def scrape_interval(settings: OperatorSettings) -> str:
    """The router's scrape interval: the tuner's λ query takes rate() over 5 s windows by
    default, which needs samples about every second (a fifth of the rate window)."""
    tuner = settings.tuner
    window_s = tuner.lambda_rate_window_s or tuner.lambda_window_s or 5.0
    millis = max(1000, round(window_s * 1000 / 5))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def render_service_monitor(target: Target, settings: OperatorSettings) -> Manifest:
    """Prometheus Operator scrape config for the router's `metrics` port."""
    endpoint = {"port": "metrics", "path": "/metrics", "interval": scrape_interval(settings)}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": target.metadata(target.name, labels(target.name, "router"), {}),
        "spec": {
            "selector": {"matchLabels": selector(target.name, "router")},
            "endpoints": [endpoint],
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


def render(
    target: Target,
    plan: Plan,
    settings: OperatorSettings,
    *,
    worker_token: str,
    plan_inputs: str = "",
    service_monitor: bool = False,
) -> list[Manifest]:
    """Everything that serves a planned pipeline: `<p>-worker-token`, `<p>-config`, the
    router Deployment, its Services and NetworkPolicy, one worker Deployment per stage, and
    the ServiceMonitor when wanted."""
    config = render_config_map(target, plan, plan_inputs)
    out = [render_worker_secret(target, worker_token), config]
    out += render_router(target, settings, config["data"])
    out += [
        render_worker(target, settings, s.name, s.hardware, s.replicas)
        for s in sorted(plan.stages, key=lambda s: s.name)
    ]
    if service_monitor:
        out.append(render_service_monitor(target, settings))
    return out
