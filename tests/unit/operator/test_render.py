"""Rendering: every object is valid Kubernetes (kubernetes-validate --strict), names fit,
re-rendering is deterministic, the contract of docs/kubernetes.md holds, and a change to
one stage rolls only that stage (plus the ConfigMap and the router that read the spec)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sloline.operator.naming import MAX_NAME, Target, object_name
from sloline.operator.planning import catalog_file, profile_tasks
from sloline.operator.pods import Manifest, render_profiling_job
from sloline.operator.render import pipeline_file, render, render_profiles_cache
from sloline.operator.settings import OperatorSettings
from tests.unit.operator.helpers import DIGITS, NOOP, gpu_settings, make_plan, pipeline_object

TOKEN = "test-worker-token"  # noqa: S105
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LONG = "p" + "x" * 62  # a 63-character pipeline name, the longest the spec allows


def everything(t: Target, settings: OperatorSettings, hardware: str) -> list[Manifest]:
    """Every object the operator renders for `t`: serving objects, Jobs, the cache."""
    objects = render(
        t,
        make_plan(t, hardware),
        settings,
        worker_token=TOKEN,
        plan_inputs="d",
        service_monitor=True,
    )
    objects += [
        render_profiling_job(t, settings, task.stage, task.hardware, task.key)
        for task in profile_tasks(t, settings)
    ]
    files = {"pipeline.yaml": pipeline_file(t.graph), "catalog.yaml": catalog_file(settings)}
    objects.append(render_profiles_cache(t, files, {"a.b.c": "{}"}))
    return objects


CASES = {
    "noop-defaults": (NOOP, {}, OperatorSettings, "cpu-1"),
    "digits-gpu": (DIGITS, {}, gpu_settings, "gpu-l4"),
    "long-names": (NOOP, {"name": LONG}, OperatorSettings, "cpu-2"),
}


def render_case(name: str, reorder: bool = False) -> tuple[Target, list[Manifest]]:
    path, meta, make_settings, hardware = CASES[name]
    doc = pipeline_object(path, **meta)
    if reorder:  # the same object with every mapping's keys in reverse order
        doc = json.loads(json.dumps(doc), object_hook=lambda d: dict(reversed(d.items())))
    t = Target.of(doc)
    return t, everything(t, make_settings(), hardware)


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_builtin_object_validates_strictly(case: str) -> None:
    _, objects = render_case(case)
    builtin = [o for o in objects if o["kind"] != "ServiceMonitor"]
    assert {o["kind"] for o in builtin} == {
        "ConfigMap",
        "Deployment",
        "Service",
        "Job",
        "Secret",
        "NetworkPolicy",
        "PodDisruptionBudget",
    }
    for obj in builtin:
        kubernetes_validate.validate(obj, "1.37", strict=True)


def test_names_are_dns_labels_and_unique(case: str) -> None:
    _, objects = render_case(case)
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(set(names)) == len(names)
    for _, name in names:
        assert len(name) <= MAX_NAME and DNS_LABEL.match(name), name
    for obj in objects:
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= MAX_NAME


def test_every_object_is_owned_and_labelled(case: str) -> None:
    t, objects = render_case(case)
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "sloline.dev/v1alpha1",
                "kind": "PredictionPipeline",
                "name": t.name,
                "uid": t.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "sloline"
        assert labels["app.kubernetes.io/instance"] == t.name
        assert labels["app.kubernetes.io/managed-by"] == "sloline-operator"
        assert labels["sloline.dev/pipeline"] == t.name
        if obj["kind"] in ("Deployment", "Job") and labels["app.kubernetes.io/component"] in (
            "worker",
            "profiler",
        ):
            assert {"sloline.dev/stage", "sloline.dev/hardware"} <= set(labels)


def test_rendering_is_deterministic(case: str) -> None:
    _, first = render_case(case)
    _, again = render_case(case)
    _, reordered = render_case(case, reorder=True)
    assert json.dumps(again) == json.dumps(first)
    assert json.dumps(reordered) == json.dumps(first)


def by_name(objects: list[Manifest]) -> dict[str, str]:
    return {f"{o['kind']}/{o['metadata']['name']}": json.dumps(o, sort_keys=True) for o in objects}


def changed(before: list[Manifest], after: list[Manifest]) -> set[str]:
    old, new = by_name(before), by_name(after)
    assert old.keys() == new.keys()
    return {k for k in old if old[k] != new[k]}


def serving(doc: dict[str, Any]) -> list[Manifest]:
    t = Target.of(doc)
    return render(t, make_plan(t), OperatorSettings(), worker_token=TOKEN)


def test_one_stage_change_rolls_only_that_stage() -> None:
    doc = pipeline_object(NOOP)
    changed_doc = copy.deepcopy(doc)
    changed_doc["spec"]["stages"][2]["model"]["entrypoint"] = "noop_stages:crash_on_negative"
    assert changed(serving(doc), serving(changed_doc)) == {
        "ConfigMap/noop-config",
        "Deployment/noop-router",
        "Deployment/noop-s3",
    }


def test_slo_change_rolls_only_the_router() -> None:
    doc = pipeline_object(NOOP)
    changed_doc = copy.deepcopy(doc)
    changed_doc["spec"]["slo"]["latencyMs"] = 250
    assert changed(serving(doc), serving(changed_doc)) == {
        "ConfigMap/noop-config",
        "Deployment/noop-router",
    }


def test_labels_and_annotations_of_the_pipeline_roll_nothing() -> None:
    doc = pipeline_object(NOOP, labels={"team": "a"}, annotations={"note": "x"})
    assert changed(serving(pipeline_object(NOOP)), serving(doc)) == set()


def containers(obj: Manifest) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_contract_commands_ports_and_mounts() -> None:
    t = Target.of(pipeline_object(NOOP))
    objects = everything(t, OperatorSettings(), "cpu-1")
    (router,) = containers(find(objects, "Deployment", "noop-router"))
    assert router["command"] == ["sloline"]
    assert " ".join(router["args"]) == (
        "router --pipeline /etc/sloline/pipeline.yaml --plan /etc/sloline/plan.json "
        "--host $(POD_IP) --port 8000 --grpc-port 8001 --metrics-port 8002 --worker-port 8003 "
        "--grpc-max-age-s 10 --drain-s 15 --peers noop-router-workers:8002"
    )
    assert router["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert router["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    service = find(objects, "Service", "noop-router")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("http", 8000),
        ("grpc", 8001),
        ("metrics", 8002),
    ]
    workers = find(objects, "Service", "noop-router-workers")
    assert [(p["name"], p["port"]) for p in workers["spec"]["ports"]] == [("worker", 8003)]
    assert workers["spec"]["selector"] == service["spec"]["selector"]
    worker_deployment = find(objects, "Deployment", "noop-s2")
    (worker,) = containers(worker_deployment)
    assert " ".join(worker["args"]) == (
        "worker --pipeline /etc/sloline/pipeline.yaml --stage s2 --router noop-router-workers:8003 "
        "--threads 1 --hardware cpu-1 --health-host $(POD_IP) --health-port 8080"
    )
    assert worker["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "health"}
    assert worker["livenessProbe"]["httpGet"] == {"path": "/live", "port": "health"}
    assert worker_deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    assert worker_deployment["spec"]["replicas"] == 2
    env = {e["name"]: e for e in worker["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {"POD_NAME", "POD_NAMESPACE"} <= set(env)
    assert env["SLOLINE_MODEL_DIR"]["value"] == "/models/noop"
    assert worker["volumeMounts"] == [
        {"name": "config", "mountPath": "/etc/sloline", "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    job = find(objects, "Job", "noop-profile-s1-cpu-2")
    (profiler,) = containers(job)
    assert " ".join(profiler["args"]) == (
        "profile-job --pipeline /etc/sloline/pipeline.yaml --stage s1 --hardware cpu-2 "
        "--catalog /etc/sloline/catalog.yaml --cap 32 --repeats 20 --budget-s 2"
    )
    assert job["spec"]["backoffLimit"] == 1
    assert job["spec"]["activeDeadlineSeconds"] == 900
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    config = find(objects, "ConfigMap", "noop-config")
    assert set(config["data"]) == {"pipeline.yaml", "plan.json"}
    assert json.loads(config["data"]["plan.json"])["pipeline"] == "noop"


def test_many_routers_roll_one_at_a_time_behind_ready_only_services() -> None:
    """N routers: a rolling update that adds a router before removing one, a preStop
    pause inside the grace period, one voluntary eviction at a time, the clients' Service
    with ready routers only, and the workers' Service headless over every router."""
    t = Target.of(pipeline_object(NOOP))
    settings = OperatorSettings.model_validate({"router": {"replicas": 3}})
    objects = everything(t, settings, "cpu-1")
    deployment = find(objects, "Deployment", "noop-router")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["metadata"]["annotations"]["sloline.dev/planned-replicas"] == "3"
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    (router,) = pod["containers"]
    assert router["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    pause = router["lifecycle"]["preStop"]["sleep"]["seconds"]
    args = router["args"]
    drain_s = float(args[args.index("--drain-s") + 1])
    age_s = float(args[args.index("--grpc-max-age-s") + 1])
    # The drain waits for gRPC connections to reach their age (+ 10 % jitter + 0.5 s),
    # and has time left for the calls in flight; the servers then take up to 2 s to stop.
    assert age_s * 1.1 + 0.5 + 2 <= drain_s
    assert pause >= 1 and pause + drain_s + 2 < pod["terminationGracePeriodSeconds"]
    budget = find(objects, "PodDisruptionBudget", "noop-router")
    assert budget["spec"] == {
        "maxUnavailable": 1,
        "selector": deployment["spec"]["selector"],
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    clients = find(objects, "Service", "noop-router")
    assert "publishNotReadyAddresses" not in clients["spec"]
    assert "clusterIP" not in clients["spec"]
    workers = find(objects, "Service", "noop-router-workers")
    assert workers["spec"]["clusterIP"] == "None"
    assert workers["spec"]["publishNotReadyAddresses"] is True
    for service in (clients, workers):
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (worker,) = containers(find(objects, "Deployment", "noop-s2"))
    assert worker["args"][worker["args"].index("--router") + 1] == "noop-router-workers:8003"
    # Each router finds the others (for Triton's statistics) the way workers find them:
    # by the headless name, on their metrics ports.
    assert args[args.index("--peers") + 1] == "noop-router-workers:8002"
    # The NetworkPolicy still admits only the pipeline's workers to the worker port.
    policy = find(objects, "NetworkPolicy", "noop-router")["spec"]
    assert policy["podSelector"] == deployment["spec"]["selector"]
    worker_rule = next(r for r in policy["ingress"] if "from" in r)
    assert worker_rule["ports"] == [{"protocol": "TCP", "port": 8003}]
    assert worker_rule["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "sloline.dev/pipeline": "noop",
                    "app.kubernetes.io/component": "worker",
                }
            }
        }
    ]
    assert all("from" not in r and 8003 not in {p["port"] for p in r["ports"]}
               for r in policy["ingress"] if r is not worker_rule)  # fmt: skip
    # ... and lets the routers reach each other's metrics port.
    assert any(
        8002 in {p["port"] for p in r["ports"]} for r in policy["ingress"] if "from" not in r
    )
    one = find(everything(t, OperatorSettings(), "cpu-1"), "Deployment", "noop-router")
    assert one["spec"]["replicas"] == 1


def test_a_fixed_hop_setting_skips_the_jobs_hop_probe() -> None:
    """With `profiling.hopS` set the planner never reads the Jobs' measured hop, so they
    do not spend their loopback probe on it; the flag parses with the real CLI."""
    from sloline.cli.parser import build_parser

    t = Target.of(pipeline_object(NOOP))
    settings = OperatorSettings.model_validate({"profiling": {"hopS": 0.001}})
    (profiler,) = containers(render_profiling_job(t, settings, "s1", "cpu-1", "k"))
    assert profiler["args"][-2:] == ["--hop-requests", "0"]
    assert build_parser().parse_args(profiler["args"]).hop_requests == 0


def test_hardware_class_placement_and_models_volume() -> None:
    from sloline.cli.parser import build_parser

    settings = gpu_settings()
    t = Target.of(pipeline_object(DIGITS, annotations={"sloline.dev/model-dir": "shared/d"}))
    objects = everything(t, settings, "gpu-l4")
    deployment = find(objects, "Deployment", "digits-cascade-fast")
    pod = deployment["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert worker["args"][-2:] == ["--cuda-device", "0"]
    # The profiling Job times the stage on the GPU it is placed with, not on its CPU.
    (profiler,) = containers(find(objects, "Job", "digits-cascade-profile-fast-gpu-l4"))
    assert build_parser().parse_args(profiler["args"]).cuda_device == 0
    assert worker["image"] == settings.runtime_image
    assert worker["imagePullPolicy"] == "Always"
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["SLOLINE_MODEL_DIR"] == "/srv/models/shared/d"
    assert env["OMP_NUM_THREADS"] == "4"
    assert {"name": "models", "mountPath": "/srv/models", "readOnly": True} in worker[
        "volumeMounts"
    ]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "m"}} in pod["volumes"]
    (router,) = containers(find(objects, "Deployment", "digits-cascade-router"))
    assert router["resources"] == {"requests": {"cpu": "500m", "memory": "512Mi"}}
    monitor = find(objects, "ServiceMonitor", "digits-cascade")
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "1s"}
    ]


PART = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", fullmatch=True)


@given(st.lists(PART, min_size=1, max_size=4))
def test_object_names_always_fit(parts: list[str]) -> None:
    name = object_name("p", *parts)
    assert len(name) <= MAX_NAME
    assert re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", name)
    if len("-".join(["p", *parts])) <= MAX_NAME:
        assert name == "-".join(["p", *parts])
    assert object_name("p", *parts) == name


def test_every_rendered_command_parses_with_the_real_cli(case: str) -> None:
    """The flags the operator renders are the flags `sloline` accepts (no drift)."""
    from sloline.cli.parser import build_parser

    _, objects = render_case(case)
    parser = build_parser()
    commands = {}
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            (container,) = containers(obj)
            assert container["command"] == ["sloline"]
            args = [a.replace("$(POD_IP)", "10.0.0.7") for a in container["args"]]
            commands[args[0]] = parser.parse_args(args)
    assert set(commands) == {"router", "worker", "profile-job"}
    assert commands["worker"].health_port == 8080
    assert commands["router"].metrics_port == 8002
    assert commands["profile-job"].catalog == "/etc/sloline/catalog.yaml"


def test_front_door_secrets_from_the_pipelines_annotations() -> None:
    """`sloline.dev/tls-secret`, `client-ca-secret` and `auth-secret` mount those Secrets
    read-only into the router pod and turn on the flags that read them; with TLS the
    kubelet probes the plain metrics port. Workers are untouched."""
    from sloline.cli.parser import build_parser

    annotations = {
        "sloline.dev/tls-secret": "noop-tls",
        "sloline.dev/client-ca-secret": "clients-ca",
        "sloline.dev/auth-secret": "noop-tokens",
    }
    t = Target.of(pipeline_object(NOOP, annotations=annotations))
    objects = everything(t, OperatorSettings(), "cpu-1")
    deployment = find(objects, "Deployment", "noop-router")
    kubernetes_validate.validate(deployment, "1.37", strict=True)
    pod = deployment["spec"]["template"]["spec"]
    (router,) = pod["containers"]
    args = build_parser().parse_args([a.replace("$(POD_IP)", "10.0.0.7") for a in router["args"]])
    assert (args.tls_cert, args.tls_key) == (
        "/var/run/sloline/tls/tls.crt",
        "/var/run/sloline/tls/tls.key",
    )
    assert args.tls_client_ca == "/var/run/sloline/client-ca/ca.crt"
    assert args.auth_token_file == "/var/run/sloline/auth/tokens"  # noqa: S105
    secrets = {v["secret"]["secretName"]: v["name"] for v in pod["volumes"] if "secret" in v}
    assert set(secrets) == {"noop-tls", "clients-ca", "noop-tokens"}
    mounted = {m["name"]: m for m in router["volumeMounts"]}
    assert all(mounted[name]["readOnly"] for name in secrets.values())
    assert router["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert router["livenessProbe"]["httpGet"]["port"] == "metrics"
    (worker,) = containers(find(objects, "Deployment", "noop-s1"))
    assert not any("tls" in a or "auth" in a for a in worker["args"])
    # Bearer tokens alone: the health paths stay open on the HTTP port.
    t = Target.of(pipeline_object(NOOP, annotations={"sloline.dev/auth-secret": "noop-tokens"}))
    (router,) = containers(
        find(everything(t, OperatorSettings(), "cpu-1"), "Deployment", "noop-router")
    )
    assert router["readinessProbe"]["httpGet"]["port"] == "http"


def test_observability_settings_reach_every_pipeline_pod() -> None:
    from sloline.cli.parser import build_parser
    from sloline.operator.settings import parse_settings

    t = Target.of(pipeline_object(DIGITS))
    plain = everything(t, OperatorSettings(), "cpu-1")
    for manifest in plain:
        for container in containers(manifest) if manifest["kind"] in ("Deployment", "Job") else ():
            names = {e["name"] for e in container.get("env", ())}
            assert not names & {"SLOLINE_LOG_FORMAT", "OTEL_EXPORTER_OTLP_ENDPOINT"}
    settings = parse_settings(
        {"observability": {"logFormat": "json", "accessLogSample": 0.1,
                           "otlpEndpoint": "http://otel-collector.monitoring:4317"}}
    )  # fmt: skip
    objects = everything(t, settings, "cpu-1")
    for name in ("digits-cascade-router", "digits-cascade-fast"):
        (container,) = containers(find(objects, "Deployment", name))
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SLOLINE_LOG_FORMAT"] == "json"
        assert env["SLOLINE_ACCESS_LOG_SAMPLE"] == "0.1"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4317"
        assert env["OTEL_SERVICE_NAME"] == "digits-cascade"
    (router,) = containers(find(objects, "Deployment", "digits-cascade-router"))
    assert build_parser().parse_args(router["args"]).command == "router"
    with pytest.raises(ValueError, match="logFormat"):
        parse_settings({"observability": {"logFormat": "xml"}})


def test_the_plans_router_count_is_rendered_with_the_setting_as_a_floor() -> None:
    t = Target.of(pipeline_object(NOOP))
    plan = dataclasses.replace(make_plan(t), routers=3)

    def routers(settings: OperatorSettings) -> int:
        objects = render(t, plan, settings, worker_token=TOKEN)
        return int(find(objects, "Deployment", "noop-router")["spec"]["replicas"])

    assert routers(OperatorSettings()) == 3
    assert routers(OperatorSettings.model_validate({"router": {"replicas": 5}})) == 5
