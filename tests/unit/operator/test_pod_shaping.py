"""Pod shaping: every field of a pod template reaches the router, worker and profiling pods
it is meant for, layered settings < spec.podTemplate < the pod's own template; what the
operator relies on cannot be overridden; a template that breaks Pod Security `restricted`
is refused by `sloline validate` and the operator unless the pipeline opts out."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sloline.operator.naming import Target
from sloline.operator.planning import operator_issues, profile_tasks
from sloline.operator.pods import render_profiling_job
from sloline.operator.render import pipeline_file, render
from sloline.operator.settings import OperatorSettings, parse_settings
from sloline.spec import PipelineError
from sloline.spec.models import ContainerTemplate, PodTemplate
from sloline.spec.shaping import restricted_violations
from tests.unit.operator.helpers import NOOP, make_plan, pipeline_object

EVERYWHERE: dict[str, Any] = {
    "labels": {"team": "vision"},
    "annotations": {"example.com/owner": "vision"},
    "serviceAccountName": "ml-pods",
    "imagePullSecrets": [{"name": "regcred"}],
    "priorityClassName": "ml-serving",
    "nodeSelector": {"topology.kubernetes.io/zone": "z1"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"team": "vision"}},
                    },
                }
            ]
        }
    },
    "securityContext": {"runAsUser": 1000700000, "runAsGroup": 0, "fsGroup": 1000700000},
    "volumes": [{"name": "ca-certs", "secret": {"secretName": "corp-ca"}}],
    "container": {
        "securityContext": {"runAsUser": 1000700001},
        "resources": {"limits": {"memory": "3Gi"}},
        "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "volumeMounts": [{"name": "ca-certs", "mountPath": "/etc/ca", "readOnly": True}],
    },
}
SETTINGS: dict[str, Any] = {
    "pods": {
        "imagePullSecrets": [{"name": "chart-default"}],
        "nodeSelector": {"kubernetes.io/os": "linux", "topology.kubernetes.io/zone": "z0"},
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001},
    }
}


def shaped(**templates: Any) -> dict[str, Any]:
    doc = pipeline_object()
    spec = doc["spec"]
    # A copy: callers change it (test_pod_admission), and EVERYWHERE is every test's.
    spec["podTemplate"] = copy.deepcopy(templates.get("everywhere", EVERYWHERE))
    spec["routerPodTemplate"] = {"serviceAccountName": "router", "labels": {"role": "front"}}
    spec["profilingPodTemplate"] = {
        "priorityClassName": "batch-low",
        "annotations": {"example.com/job": "profile"},
    }
    spec["stages"][0]["podTemplate"] = {
        "nodeSelector": {"pool": "fast"},
        "container": {"env": [{"name": "HTTPS_PROXY", "value": "http://s1-proxy:3128"}]},
    }
    return doc


def pods(doc: dict[str, Any], settings: OperatorSettings) -> dict[str, dict[str, Any]]:
    """`kind/name` -> pod template of every Deployment and Job rendered for `doc`."""
    t = Target.of(doc)
    objects = render(t, make_plan(t), settings, worker_token="t")  # noqa: S106
    objects += [
        render_profiling_job(t, settings, task.stage, task.hardware, task.key)
        for task in profile_tasks(t, settings)
    ]
    workloads = [o for o in objects if o["kind"] in ("Deployment", "Job")]
    for obj in workloads:
        kubernetes_validate.validate(obj, "1.37", strict=True)
    return {f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"] for o in workloads}


def test_every_override_field_reaches_every_pod() -> None:
    rendered = pods(shaped(), parse_settings(copy.deepcopy(SETTINGS)))
    assert set(rendered) == {
        "Deployment/noop-router",
        "Deployment/noop-s1",
        "Deployment/noop-s2",
        "Deployment/noop-s3",
        "Job/noop-profile-s1-cpu-1",
        "Job/noop-profile-s1-cpu-2",
        "Job/noop-profile-s2-cpu-1",
        "Job/noop-profile-s2-cpu-2",
        "Job/noop-profile-s3-cpu-1",
        "Job/noop-profile-s3-cpu-2",
    }
    for name, template in rendered.items():
        meta, spec = template["metadata"], template["spec"]
        (container,) = spec["containers"]
        router, job, s1 = "router" in name, name.startswith("Job/"), "-s1" in name
        assert restricted_violations(spec) == [], name
        # the operator's own parts are all still there
        assert meta["labels"]["sloline.dev/pipeline"] == "noop"
        assert {"config", "tmp"} <= {v["name"] for v in spec["volumes"]}
        assert "SLOLINE_MODEL_DIR" in {e["name"] for e in container["env"]}
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        # every field of spec.podTemplate, merged over the settings' pods
        assert meta["labels"]["team"] == "vision"
        assert meta["annotations"]["example.com/owner"] == "vision"
        assert spec["serviceAccountName"] == ("router" if router else "ml-pods")
        assert spec["imagePullSecrets"] == [{"name": "chart-default"}, {"name": "regcred"}]
        assert spec["priorityClassName"] == ("batch-low" if job else "ml-serving")
        selector = {"kubernetes.io/os": "linux", "topology.kubernetes.io/zone": "z1"}
        if s1 and not router:
            selector["pool"] = "fast"
        assert spec["nodeSelector"] == selector
        assert spec["tolerations"] == EVERYWHERE["tolerations"]
        assert spec["affinity"] == EVERYWHERE["affinity"]
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
            "runAsUser": 1000700000,
            "runAsGroup": 0,
            "fsGroup": 1000700000,
        }
        assert {"name": "ca-certs", "secret": {"secretName": "corp-ca"}} in spec["volumes"]
        assert container["securityContext"]["runAsUser"] == 1000700001
        assert container["resources"]["limits"]["memory"] == "3Gi"
        proxy = "http://s1-proxy:3128" if s1 and not router else "http://proxy:3128"
        assert {"name": "HTTPS_PROXY", "value": proxy} in container["env"]
        mount = {"name": "ca-certs", "mountPath": "/etc/ca", "readOnly": True}
        assert mount in container["volumeMounts"]
        # the pod's own template
        assert (meta["labels"].get("role") == "front") is router
        assert (meta["annotations"].get("example.com/job") == "profile") is job


def test_the_every_field_template_sets_every_field() -> None:
    def aliases(model: type[Any]) -> set[str]:
        return {f.alias or n for n, f in model.model_fields.items()}

    assert set(EVERYWHERE) == aliases(PodTemplate)
    assert set(EVERYWHERE["container"]) == aliases(ContainerTemplate)


def test_hardware_resources_are_kept_under_the_override() -> None:
    rendered = pods(shaped(), OperatorSettings())
    resources = rendered["Deployment/noop-s1"]["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "1000m", "memory": "1Gi"},  # the cpu-1 class's
        "limits": {"cpu": "1000m", "memory": "3Gi"},  # plus the override's memory
    }


def test_a_pod_template_neither_reprofiles_nor_reaches_the_pipeline_file() -> None:
    plain, shaped_doc = Target.of(pipeline_object()), Target.of(shaped())
    settings = OperatorSettings()
    assert pipeline_file(plain.graph) == pipeline_file(shaped_doc.graph)
    assert [t.key for t in profile_tasks(plain, settings)] == [
        t.key for t in profile_tasks(shaped_doc, settings)
    ]


def test_settings_without_a_user_leave_the_uid_to_the_platform() -> None:
    """OpenShift's restricted SCC assigns the UID: settings pods without runAsUser."""
    doc = pipeline_object()
    rendered = pods(doc, parse_settings({"pods": {}}))
    for template in rendered.values():
        assert "runAsUser" not in template["spec"]["securityContext"]
        assert restricted_violations(template["spec"]) == []
    default = pods(doc, OperatorSettings())
    for template in default.values():
        assert template["spec"]["securityContext"]["runAsUser"] == 10001


PROTECTED = {
    "labels": ({"labels": {"app.kubernetes.io/component": "x"}}, "spec.podTemplate.labels"),
    "selector label": ({"labels": {"sloline.dev/pipeline": "x"}}, "spec.podTemplate.labels"),
    "annotations": (
        {"annotations": {"sloline.dev/config-hash": "x"}},
        "spec.podTemplate.annotations",
    ),
}
OPERATORS = {
    "env": (
        {"container": {"env": [{"name": "SLOLINE_MODEL_DIR", "value": "/x"}]}},
        "spec.podTemplate.container.env[0].name",
    ),
    "volume": (
        {"volumes": [{"name": "config", "emptyDir": {}}]},
        "spec.podTemplate.volumes[0].name",
    ),
    "mount": (
        {"container": {"volumeMounts": [{"name": "x", "mountPath": "/tmp"}]}},
        "spec.podTemplate.container.volumeMounts[0].mountPath",
    ),
}


@pytest.mark.parametrize("case", sorted(PROTECTED))
def test_sloline_validate_refuses_protected_labels(case: str) -> None:
    template, path = PROTECTED[case]
    with pytest.raises(PipelineError) as info:
        Target.of(shaped(everywhere=template))
    assert [str(i) for i in info.value.issues] == [
        f"{path}: {next(iter(next(iter(template.values()))))!r} is set by the operator"
    ]


@pytest.mark.parametrize("case", sorted(OPERATORS))
def test_the_operator_refuses_overriding_its_env_volumes_and_mounts(case: str) -> None:
    template, path = OPERATORS[case]
    t = Target.of(shaped(everywhere=template))
    issues = operator_issues(t, OperatorSettings())
    assert [i.path for i in issues] == [path]
    assert "is the operator's" in issues[0].reason


BREAKING = {
    "runAsNonRoot": {"securityContext": {"runAsNonRoot": False}},
    "runAsUser must not be 0": {"securityContext": {"runAsUser": 0}},
    "privileged": {"container": {"securityContext": {"privileged": True}}},
    "allowPrivilegeEscalation": {
        "container": {"securityContext": {"allowPrivilegeEscalation": True}}
    },
    "may add only NET_BIND_SERVICE": {
        "container": {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}}
    },
    "hostPath": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]},
    "seccompProfile": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
}


@pytest.mark.parametrize("case", sorted(BREAKING))
def test_a_template_breaking_restricted_is_refused_unless_allowed(case: str) -> None:
    doc = shaped(everywhere=BREAKING[case])
    with pytest.raises(PipelineError) as info:
        Target.of(doc)
    (issue,) = info.value.issues
    assert issue.path == "spec.podTemplate"
    assert "breaks Pod Security restricted" in issue.reason and case in issue.reason
    assert "sloline.dev/allow-unrestricted-pods" in issue.reason
    doc["metadata"]["annotations"] = {"sloline.dev/allow-unrestricted-pods": "true"}
    t = Target.of(doc)
    assert operator_issues(t, OperatorSettings()) == []
    rendered = pods(doc, OperatorSettings())
    assert all(restricted_violations(p["spec"]) for p in rendered.values())


def test_the_operator_checks_its_settings_pods_under_the_templates() -> None:
    """A template that is fine alone but not over the operator's settings is refused by
    the operator, naming the pod and the rule."""
    settings = parse_settings({"pods": {"securityContext": {"runAsNonRoot": False}}})
    t = Target.of(pipeline_object())
    issues = operator_issues(t, settings)
    assert issues and all("would not pass Pod Security restricted" in i.reason for i in issues)
    assert (issues[0].path, issues[0].reason[:17]) == ("settings.pods", "the router pod wo")


def test_sloline_validate_names_each_bad_template(tmp_path: Path) -> None:
    folder = tmp_path / "noop"
    shutil.copytree(NOOP.parent, folder)
    doc = yaml.safe_load(NOOP.read_text())
    doc["spec"]["podTemplate"] = {
        "labels": {"app.kubernetes.io/component": "x", "sloline.dev/stage": "y"},
        "container": {"env": [{"value": "no name"}]},
    }
    doc["spec"]["stages"][1]["podTemplate"] = {
        "container": {"securityContext": {"privileged": True}}
    }
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [sys.executable, "-m", "sloline", "validate", str(folder / "pipeline.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is invalid (4 problem(s))" in result.stderr
    for line in (
        "spec.podTemplate.labels: 'app.kubernetes.io/component' is set by the operator",
        "spec.podTemplate.labels: 'sloline.dev/stage' is set by the operator",
        "spec.podTemplate.container.env[0]: needs a name",
    ):
        assert f"  - {line}\n" in result.stderr
    assert (
        "  - spec.stages[1].podTemplate: breaks Pod Security restricted: sloline: privileged"
        in result.stderr
    )
