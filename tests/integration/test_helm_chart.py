"""The Helm chart and the plain manifests, with the real helm binary (scripts/fetch_helm.sh).

helm lint / template for default and non-default values, the values schema rejecting bad
values, every rendered built-in object against Kubernetes 1.37's schemas (strict), the
PrometheusRule through `promtool check rules`, the example pipelines against the CRD's
schema, and manifests/ + the CRD copies in sync with their sources.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import sloline
from sloline.cli.parser import build_parser
from sloline.operator.settings import OperatorSettings, parse_settings
from sloline.spec.crd import crd_manifest
from sloline.spec.hardware import (
    DEFAULT_CATALOG,
    EmbeddedPlacement,
    HardwareCatalog,
    HardwareClass,
    KubernetesPlacement,
)
from sloline.spec.loader import parse_pipeline
from tests.support.prometheus import find_tool

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "bin" / "helm"
CHART = ROOT / "helm" / "sloline"
CRD_CHART = ROOT / "helm" / "sloline-crds"
CUSTOM_VALUES = ROOT / "tests" / "support" / "values-custom.yaml"
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
CRD_FILE = "predictionpipelines.sloline.dev.yaml"
CRD_PATH = CRD_CHART / "files" / CRD_FILE  # the generated CRD, the one copy
KUBERNETES_VERSION = "1.37"
# Custom resources kubernetes-validate has no schema for; checked separately below.
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}
# What `admission.webhook.enabled` adds (docs/kubernetes.md "Admission").
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration"}
ADMISSION_KINDS = ["Service", "ValidatingWebhookConfiguration", "ClusterRole", "ClusterRoleBinding"]

needs_helm = pytest.mark.skipif(
    not HELM.is_file(),
    reason=f"helm is not at {HELM.relative_to(ROOT)}: run scripts/fetch_helm.sh (make test does)",
)


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def template(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    result = helm(env, "template", "sloline", str(CHART), "-n", "sloline-system", *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def default_objects(helm_env: dict[str, str]) -> list[dict[str, Any]]:
    return template(helm_env)


@pytest.fixture(scope="module")
def custom_objects(helm_env: dict[str, str]) -> list[dict[str, Any]]:
    return template(helm_env, "-f", str(CUSTOM_VALUES))


def only(objects: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    matches = [
        o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)
    ]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, got {len(matches)}"
    return matches[0]


def operator_role(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The operator's own ClusterRole(Binding), not the admission webhook's."""
    matches = [
        o for o in objects if o["kind"] == kind and not o["metadata"]["name"].endswith("-webhook")
    ]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def settings_file(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config = next(o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o["data"])
    return yaml.safe_load(config["data"]["config.yaml"])


@pytest.mark.parametrize("chart_dir", [CHART, CRD_CHART], ids=["sloline", "sloline-crds"])
def test_chart_versions_follow_the_package(chart_dir: Path) -> None:
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == chart_dir.name
    assert chart["appVersion"] == sloline.__version__ == chart["version"]


@needs_helm
@pytest.mark.parametrize(
    ("chart_dir", "values"),
    [(CHART, None), (CHART, CUSTOM_VALUES), (CRD_CHART, None)],
    ids=["default", "custom", "sloline-crds"],
)
def test_helm_lint_passes(helm_env: dict[str, str], chart_dir: Path, values: Path | None) -> None:
    extra = ["-f", str(values)] if values else []
    result = helm(helm_env, "lint", "--strict", str(chart_dir), *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@needs_helm
def test_the_operator_chart_carries_no_crd(helm_env: dict[str, str]) -> None:
    """The CRD is the sloline-crds chart's: the operator chart has no crds/ (which Helm
    would install once and never upgrade) and renders none."""
    assert not (CHART / "crds").exists()
    objects = template(helm_env, "--include-crds")
    assert "CustomResourceDefinition" not in {o["kind"] for o in objects}


def template_crds(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    result = helm(env, "template", "sloline-crds", str(CRD_CHART), "-n", "sloline-system", *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@needs_helm
def test_the_crd_chart_renders_the_generated_crd_kept_on_uninstall(
    helm_env: dict[str, str],
) -> None:
    (crd,) = template_crds(helm_env)
    generated = crd_manifest()
    assert {k: v for k, v in crd.items() if k != "metadata"} == {
        k: v for k, v in generated.items() if k != "metadata"
    }
    assert crd["metadata"]["name"] == generated["metadata"]["name"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"] == {
        "helm.sh/chart": f"sloline-crds-{sloline.__version__}",
        "app.kubernetes.io/name": "sloline-crds",
        "app.kubernetes.io/instance": "sloline-crds",
        "app.kubernetes.io/version": sloline.__version__,
        "app.kubernetes.io/managed-by": "Helm",
        "app.kubernetes.io/part-of": "sloline",
    }
    kubernetes_validate.validate(crd, KUBERNETES_VERSION, strict=True)


@needs_helm
def test_the_crd_chart_values(helm_env: dict[str, str]) -> None:
    (crd,) = template_crds(
        helm_env, "--set", "keep=false", "--set", "labels.team=ml", "--set", "annotations.a=b"
    )
    assert crd["metadata"]["annotations"] == {"a": "b"}
    assert crd["metadata"]["labels"]["team"] == "ml"
    (crd,) = template_crds(helm_env, "--set", "keep=false")
    assert "annotations" not in crd["metadata"]
    result = helm(helm_env, "template", "x", str(CRD_CHART), "--set", "keepp=true")
    assert result.returncode != 0
    assert "additional properties 'keepp' not allowed" in result.stderr, result.stderr


@needs_helm
def test_default_install_is_cluster_wide_and_locked_down(
    default_objects: list[dict[str, Any]],
) -> None:
    kinds = sorted(o["kind"] for o in default_objects)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ConfigMap",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            *ADMISSION_KINDS,
            "NetworkPolicy",
        ]
    )
    deployment = only(default_objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    container = operator_container(default_objects)
    assert container["image"] == f"ghcr.io/sloline/sloline-operator:{sloline.__version__}"
    assert container["command"] == ["sloline"]
    assert container["args"] == [
        "operator",
        "--config",
        "/etc/sloline-operator/config.yaml",
        "--standalone",
        "--all-namespaces",
        "--liveness",
        "http://0.0.0.0:8081/healthz",
        "--metrics-port",
        "8080",
        "--webhook-port",
        "9443",
        "--webhook-dns",
        "sloline-operator-webhook.sloline-system.svc",
        "--webhook-configuration",
        "sloline-sloline-system",
    ]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081, "webhook": 9443}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/etc/sloline-operator": "config", "/tmp": "tmp"}
    for service in (o for o in default_objects if o["kind"] == "Service"):
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


@needs_helm
@pytest.mark.parametrize("values", ["default", "custom"])
def test_the_operator_cli_accepts_the_rendered_command(
    values: str, request: pytest.FixtureRequest
) -> None:
    container = operator_container(request.getfixturevalue(f"{values}_objects"))
    assert container["command"] == ["sloline"]
    args, unknown = build_parser().parse_known_args(container["args"])
    assert args.command == "operator"
    assert args.config == "/etc/sloline-operator/config.yaml"
    assert args.standalone is True
    assert args.liveness == "http://0.0.0.0:8081/healthz"
    assert args.metrics_port == 8080
    assert args.webhook_dns == ["sloline-operator-webhook.sloline-system.svc"]
    assert args.webhook_configuration == "sloline-sloline-system"
    if values == "default":
        assert args.webhook_port == 9443
        assert (args.all_namespaces, args.namespace, args.verbose) == (True, [], False)
        assert unknown == []
    else:
        assert args.webhook_port == 10443
        assert (args.all_namespaces, args.namespace) == (False, ["ml-prod", "ml-staging"])
        assert args.verbose is True
        assert unknown == ["--log-format=json"]  # operator.extraArgs, passed through


@needs_helm
def test_default_settings_file_is_the_operators_default(
    default_objects: list[dict[str, Any]],
) -> None:
    settings = settings_file(default_objects)
    assert settings["runtimeImage"] == f"ghcr.io/sloline/sloline-runtime:{sloline.__version__}"
    assert parse_settings(settings) == OperatorSettings()
    assert parse_settings(settings).catalog == DEFAULT_CATALOG


@needs_helm
def test_custom_settings_file_is_accepted_by_the_operator(
    custom_objects: list[dict[str, Any]],
) -> None:
    settings = parse_settings(settings_file(custom_objects))
    assert settings.catalog.names() == ["cpu-4", "gpu-l4"]
    assert settings.tuner.scale_down_enabled is False
    assert settings.service_monitor == "always"
    assert settings.pods.security_context == {}  # null dropped the defaults' UID and GID
    assert settings.pods.image_pull_secrets == [{"name": "regcred"}]  # the top-level ones
    assert settings.pods.service_account_name == "ml-pods"
    assert settings.exposure.enabled == ["httpRoute", "grpcRoute"]
    assert settings.exposure.parent_refs == [{"name": "public", "namespace": "gateways"}]


def test_values_schema_settings_match_the_operator_settings_model() -> None:
    """Every settings key the chart accepts is one the operator reads, and vice versa."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    chart = schema["properties"]["settings"]["properties"]

    def aliases(model: type[Any]) -> set[str]:
        return {field.alias or name for name, field in model.model_fields.items()}

    assert set(chart) | {"runtimeImage", "imagePullPolicy"} == aliases(OperatorSettings)
    for key in ("models", "profiling", "tuner", "router"):
        model = OperatorSettings.model_fields[key].annotation
        assert set(chart[key]["properties"]) == aliases(model), key
    hardware = schema["definitions"]["hardwareClass"]["properties"]
    assert set(hardware) == aliases(HardwareClass)
    assert set(hardware["embedded"]["properties"]) == aliases(EmbeddedPlacement)
    assert set(hardware["kubernetes"]["properties"]) == aliases(KubernetesPlacement)


# Values documented as one row: their insides are the operator's settings or pod fields.
OPAQUE_VALUES = {
    "resources",
    "catalog",
    "profiling",
    "tuner",
    "labels",
    "annotations",
    "pods",
    "podSecurityContext",
    "securityContext",
}


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in OPAQUE_VALUES:
            paths.extend(value_paths(value, f"{path}."))
        else:
            paths.append(path)
    return paths


def test_install_guide_documents_every_value() -> None:
    guide = (ROOT / "docs" / "install.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [p for p in value_paths(values) if f"`{p}`" not in guide]
    assert missing == [], "add these values to docs/install.md's table"


def rules_by_resource(role: dict[str, Any]) -> dict[str, set[str]]:
    return {
        f"{group}/{resource}" if group else resource: set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


@needs_helm
def test_cluster_role_grants_only_what_the_operator_uses(
    default_objects: list[dict[str, Any]],
) -> None:
    rules = rules_by_resource(operator_role(default_objects, "ClusterRole"))
    read = {"get", "list", "watch"}
    write = {"create", "patch", "delete"}  # apply = create + JSON patch; prune = delete
    assert rules == {
        "sloline.dev/predictionpipelines": read | {"patch"},
        "sloline.dev/predictionpipelines/status": {"patch"},
        "sloline.dev/predictionpipelines/finalizers": {"update"},
        "events": {"create"},
        "configmaps": read | write,
        "services": read | write,
        "pods": read,
        "secrets": {"get", "create", "patch"},  # the worker token: by name, never listed
        "networking.k8s.io/networkpolicies": {"get", "create", "patch"},
        "policy/poddisruptionbudgets": {"get", "create", "patch"},
        "apps/deployments": read | write,
        "apps/deployments/scale": {"get", "patch"},
        "batch/jobs": read | {"create", "delete"},
        "monitoring.coreos.com/servicemonitors": read | write,
        "networking.k8s.io/ingresses": {"get", "list"} | write,
        "gateway.networking.k8s.io/httproutes": {"get", "list"} | write,
        "gateway.networking.k8s.io/grpcroutes": {"get", "list"} | write,
        "apiextensions.k8s.io/customresourcedefinitions": read,
    }
    binding = operator_role(default_objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sloline-operator", "namespace": "sloline-system"}
    ]


@needs_helm
def test_custom_values_render_namespaced_rbac_and_monitoring(
    custom_objects: list[dict[str, Any]],
) -> None:
    roles = [o for o in custom_objects if o["kind"] == "Role"]
    bindings = [o for o in custom_objects if o["kind"] == "RoleBinding"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml-prod", "ml-staging"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml-prod", "ml-staging"]
    for binding in bindings:
        assert binding["subjects"][0]["name"] == "sloline-controller"
    # The only cluster-scoped grant left is read-only observation.
    cluster = rules_by_resource(operator_role(custom_objects, "ClusterRole"))
    assert cluster == {
        "apiextensions.k8s.io/customresourcedefinitions": {"get", "list", "watch"},
        "namespaces": {"get", "list", "watch"},
    }
    args = operator_container(custom_objects)["args"]
    assert "--all-namespaces" not in args
    assert args[args.index("--namespace") :][:4] == [
        "--namespace",
        "ml-prod",
        "--namespace",
        "ml-staging",
    ]
    assert args[:2] == ["--verbose", "operator"]
    assert args[-1] == "--log-format=json"

    settings = settings_file(custom_objects)
    assert settings["runtimeImage"].endswith("/ml/sloline-runtime@sha256:" + "0123456789abcdef" * 4)
    catalog = HardwareCatalog.model_validate(settings["catalog"])
    gpu = catalog.get("gpu-l4")
    assert gpu.accelerator == "gpu"
    assert gpu.kubernetes.resources["limits"]["nvidia.com/gpu"] == "1"
    assert gpu.kubernetes.tolerations[0]["key"] == "nvidia.com/gpu"
    assert settings["prometheusUrl"] == "http://prometheus-operated.monitoring.svc:9090"
    assert settings["models"]["volume"]["persistentVolumeClaim"]["claimName"] == "sloline-models"

    monitor = only(custom_objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "honorLabels": True}
    ]
    rule = only(custom_objects, "PrometheusRule")
    assert rule["spec"]["groups"], "the PrometheusRule has no rule groups"
    dashboards = next(o for o in custom_objects if o["metadata"]["name"].endswith("-dashboards"))
    assert dashboards["metadata"]["namespace"] == "monitoring"
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = sorted(p.name for p in (CHART / "files" / "dashboards").glob("*.json"))
    assert sorted(dashboards["data"]) == files
    for name, text in dashboards["data"].items():
        assert json.loads(text) == json.loads((CHART / "files" / "dashboards" / name).read_text())


def webhook_objects(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The admission webhook's objects by kind, checked against the operator's flags."""
    config = only(objects, "ValidatingWebhookConfiguration")
    service = only(objects, "Service", "-webhook")
    args = operator_container(objects)["args"]
    assert args[args.index("--webhook-configuration") + 1] == config["metadata"]["name"]
    namespace = service["metadata"]["namespace"]
    dns = f"{service['metadata']['name']}.{namespace}.svc"
    assert args[args.index("--webhook-dns") + 1] == dns
    [hook] = config["webhooks"]
    assert hook["clientConfig"] == {  # no caBundle: the operator writes it
        "service": {
            "name": service["metadata"]["name"],
            "namespace": namespace,
            "path": "/validate",
            "port": 443,
        }
    }
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    role = only(objects, "ClusterRole", "-webhook")
    assert role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": [config["metadata"]["name"]],
            "verbs": ["get", "patch"],
        }
    ]
    binding = only(objects, "ClusterRoleBinding", "-webhook")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == operator_role(objects, "ClusterRoleBinding")["subjects"]
    return {"config": config, "hook": hook, "service": service}


def ingress_ports(objects: list[dict[str, Any]]) -> list[int]:
    policy = only(objects, "NetworkPolicy")
    deployment = only(objects, "Deployment")
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert "from" not in rule  # the API server, Prometheus and the kubelet: from anywhere
    return sorted(p["port"] for p in rule["ports"])


@needs_helm
def test_the_admission_webhook_covers_pipelines_only(
    default_objects: list[dict[str, Any]],
) -> None:
    hook = webhook_objects(default_objects)["hook"]
    assert hook["name"] == "predictionpipelines.sloline.dev"
    assert hook["rules"] == [
        {
            "apiGroups": ["sloline.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["predictionpipelines"],
            "scope": "Namespaced",
        }
    ]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == (
        "Fail",
        "None",
        5,
    )
    assert hook["admissionReviewVersions"] == ["v1"]
    assert "namespaceSelector" not in hook  # every namespace, as the operator serves
    assert ingress_ports(default_objects) == [8080, 8081, 9443]


@needs_helm
def test_custom_values_shape_the_admission_webhook(
    custom_objects: list[dict[str, Any]],
) -> None:
    hook = webhook_objects(custom_objects)["hook"]
    assert hook["namespaceSelector"] == {  # only the namespaces the operator serves
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": ["ml-prod", "ml-staging"],
            }
        ]
    }
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 10)
    ports = {p["name"]: p["containerPort"] for p in operator_container(custom_objects)["ports"]}
    assert ports["webhook"] == 10443
    assert ingress_ports(custom_objects) == [8080, 8081, 10443]


@needs_helm
def test_the_webhook_and_the_network_policy_can_be_switched_off(
    helm_env: dict[str, str],
) -> None:
    objects = template(helm_env, "--set", "admission.webhook.enabled=false")
    assert not [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    assert not [o for o in objects if o["metadata"]["name"].endswith("-webhook")]
    container = operator_container(objects)
    assert not [a for a in container["args"] if a.startswith("--webhook")]
    assert "webhook" not in {p["name"] for p in container["ports"]}
    assert ingress_ports(objects) == [8080, 8081]
    objects = template(helm_env, "--set", "operator.networkPolicy.enabled=false")
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert only(objects, "ValidatingWebhookConfiguration")


@needs_helm
def test_a_settings_change_rolls_the_operator_pod(helm_env: dict[str, str]) -> None:
    def checksum(*args: str) -> str:
        deployment = only(template(helm_env, *args), "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    base = checksum()
    assert checksum("--set", "settings.prometheusUrl=http://prometheus:9090") != base
    assert checksum("--set", "image.runtime.tag=0.2.0") != base
    assert checksum("--set", "operator.podLabels.team=ml") == base


@needs_helm
@pytest.mark.parametrize("values", ["default", "custom"])
def test_rendered_objects_validate_against_kubernetes_schemas(
    values: str, request: pytest.FixtureRequest
) -> None:
    objects: list[dict[str, Any]] = request.getfixturevalue(f"{values}_objects")
    checked = 0
    for obj in objects:
        if obj["kind"] in MONITORING_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc}")
        checked += 1
    assert checked >= 6


PROMTOOL = find_tool("promtool")


@needs_helm
@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing (Debian package prometheus)")
def test_prometheus_rule_passes_promtool(
    custom_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    assert PROMTOOL is not None
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(only(custom_objects, "PrometheusRule")["spec"]))
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


BAD_VALUES = [
    pytest.param(["--set", "operator.ports.health=8o81"], "got string, want integer", id="type"),
    pytest.param(["--set", "operator.replicas=2"], "properties 'replicas' not", id="unknown"),
    pytest.param(["--set", "settngs.prometheusUrl=x"], "properties 'settngs' not", id="typo"),
    pytest.param(["--set", "settings.serviceMonitor=sometimes"], "must be one of", id="enum"),
    pytest.param(["--set", "image.runtime.pullPolicy=Sometimes"], "must be one of", id="policy"),
    pytest.param(["--set", "image.operator.tag=v1:latest"], "does not match pattern", id="tag"),
    pytest.param(["--set", "watchNamespaces[0]=ML_Prod"], "does not match pattern", id="namespace"),
    pytest.param(["--set", "settings.prometheusUrl=prometheus:9090"], "does not match", id="url"),
    pytest.param(
        [
            "--set-json",
            'settings.catalog.classes=[{"name": "gpu", "costPerHour": 1,'
            ' "kubernetes": {"resources": {"limits": {"nvidia.com/gpu": 1}}}}]',
        ],
        "got number, want string",
        id="gpu-count-unquoted",
    ),
    pytest.param(
        ["--set", "admission.webhook.failurePolicy=Sometimes"], "must be one of", id="policy"
    ),
    pytest.param(
        ["--set", "admission.webhook.timeoutSeconds=60"], "maximum: got 60", id="webhook-timeout"
    ),
]


@needs_helm
@pytest.mark.parametrize(("args", "message"), BAD_VALUES)
def test_bad_values_fail_the_schema(
    helm_env: dict[str, str], args: list[str], message: str
) -> None:
    result = helm(helm_env, "template", "sloline", str(CHART), *args)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_the_crd_is_the_generated_one_and_has_no_copies() -> None:
    assert yaml.safe_load(CRD_PATH.read_text()) == crd_manifest(), (
        f"the chart's CRD is stale: sloline crd > {CRD_PATH.relative_to(ROOT)}"
    )
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "node_modules"]
        found += [Path(folder, f).relative_to(ROOT) for f in files if f == CRD_FILE]
    assert found == [CRD_PATH.relative_to(ROOT)]


@needs_helm
def test_manifests_are_in_sync_with_the_chart() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_manifests.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "sloline.yaml").read_text()) if d]
    assert docs[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "sloline-system",
            "labels": {"app.kubernetes.io/name": "sloline", "app.kubernetes.io/part-of": "sloline"},
        },
    }
    for doc in docs[1:]:
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == "sloline-system", doc["metadata"]["name"]
    kubernetes_validate.validate(docs[0], KUBERNETES_VERSION, strict=True)


def openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI 3.0 `nullable` -> JSON Schema `type: [T, "null"]` (draft 4 reads the rest)."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@pytest.fixture(scope="module")
def crd_validator() -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema = openapi_to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def test_examples_exist_for_every_repository_example() -> None:
    assert [p.stem for p in EXAMPLES] == sorted(
        p.parent.name for p in (ROOT / "examples").glob("*/pipeline.yaml")
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_validates_against_the_crd_schema(
    path: Path, crd_validator: jsonschema.Draft4Validator
) -> None:
    doc = yaml.safe_load(path.read_text())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in crd_validator.iter_errors(doc)
    ]
    assert errors == []
    assert doc["apiVersion"] == "sloline.dev/v1alpha1" and doc["kind"] == "PredictionPipeline"
    parse_pipeline(doc, str(path))  # the operator's own validation, cross-field checks included
    # Same pipeline as the runnable example in examples/<name>/.
    assert doc == yaml.safe_load((ROOT / "examples" / path.stem / "pipeline.yaml").read_text())


def test_crd_schema_rejects_a_broken_example(crd_validator: jsonschema.Draft4Validator) -> None:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLES[0].read_text()))
    doc["spec"]["stages"][0]["outputs"][0]["datatype"] = "FLOAT"
    doc["spec"]["slo"]["latencyMs"] = 0
    del doc["spec"]["output"]
    paths = {"/".join(map(str, e.absolute_path)) for e in crd_validator.iter_errors(doc)}
    assert paths == {"spec", "spec/slo/latencyMs", "spec/stages/0/outputs/0/datatype"}


@needs_helm
def test_security_contexts_can_leave_the_uid_to_the_platform(helm_env: dict[str, str]) -> None:
    """OpenShift's restricted SCC assigns the UID: null drops a key of the operator pod's
    securityContext and of the pipeline pods' defaults, and the schema accepts it; the
    operator pod takes more volumes."""
    objects = template(
        helm_env,
        *("--set", "operator.podSecurityContext.runAsUser=null"),
        *("--set", "operator.podSecurityContext.runAsGroup=null"),
        *("--set", "operator.podSecurityContext.fsGroup=null"),
        *("--set", "operator.securityContext.runAsUser=1000650000"),
        *("--set", "settings.pods.securityContext=null"),
        *("--set", "imagePullSecrets[0].name=regcred"),
        *("--set", "operator.extraVolumes[0].name=ca"),
        *("--set", "operator.extraVolumes[0].configMap.name=corp-ca"),
        *("--set", "operator.extraVolumeMounts[0].name=ca"),
        *("--set", "operator.extraVolumeMounts[0].mountPath=/etc/ssl/corp"),
    )
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert operator_container(objects)["securityContext"]["runAsUser"] == 1000650000
    assert {"name": "ca", "configMap": {"name": "corp-ca"}} in pod["volumes"]
    mounts = operator_container(objects)["volumeMounts"]
    assert {"name": "ca", "mountPath": "/etc/ssl/corp"} in mounts
    settings = parse_settings(settings_file(objects))
    assert settings.pods.security_context == {}
    assert settings.pods.image_pull_secrets == [{"name": "regcred"}]
