"""The operator end to end: kopf (`KopfRunner`) against the Kubernetes API emulator
(tests/support/kube), with profiling Jobs run for real by a stand-in kubelet
(tests/support/profile_jobs.py: `sloline profile-job`'s body on the files the Job mounts),
a real Prometheus for the tuner daemon and the real kubectl.

The emulator runs no controllers, so the tests do their part: run Jobs, and report
Deployments' ready replicas."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import pytest
import yaml
from kopf.testing import KopfRunner
from prometheus_client import CollectorRegistry

from sloline.operator.handlers import build_registry, kopf_settings
from sloline.operator.kube import KubeApi
from sloline.operator.metrics import OperatorMetrics
from sloline.operator.reconcile import OperatorContext, reconcile
from sloline.operator.settings import OperatorSettings, parse_settings
from sloline.planner.plan import Plan
from tests.support.kube import KubeEmulator
from tests.support.net import free_port
from tests.support.profile_jobs import finish_job, run_job
from tests.support.prometheus import Prometheus
from tests.support.serve import build_example
from tests.support.synthetic_router import SyntheticRouter

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "helm" / "sloline-crds" / "files" / "predictionpipelines.sloline.dev.yaml"
NOOP_DIR = ROOT / "tests" / "support" / "pipelines" / "noop"
NS = "default"
PIPELINE = "predictionpipelines"
T = TypeVar("T")

pytestmark = pytest.mark.timeout(180)


def fast_settings(**overrides: Any) -> OperatorSettings:
    """The defaults, with the operator polling Jobs and ticking the tuner quickly."""
    data: dict[str, Any] = {"profiling": {"pollS": 0.2}, "tuner": {"intervalS": 0.5}}
    data.update(overrides)
    return parse_settings(data)


@contextlib.contextmanager
def operator(
    kube: KubeEmulator, settings: OperatorSettings, metrics: OperatorMetrics | None = None
) -> Iterator[KopfRunner]:
    """`sloline operator` as kopf runs it, in a thread, for the block."""
    context = OperatorContext(
        KubeApi.connect(str(kube.kubeconfig_path)),
        settings,
        metrics=metrics or OperatorMetrics(CollectorRegistry()),
    )
    registry = build_registry(context)
    args = ["run", "--standalone", "--namespace", NS]
    with KopfRunner(args, registry=registry, settings=kopf_settings(quick=True)) as runner:
        yield runner
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None


@pytest.fixture
def cluster(kube: KubeEmulator) -> KubeEmulator:
    kube.register_crd(CRD)
    return kube


def wait(check: Callable[[], T], what: str, timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def noop_pipeline(**spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((NOOP_DIR / "pipeline.yaml").read_text())
    doc["spec"].update(spec)
    return doc


def status(kube: KubeEmulator, name: str = "noop") -> dict[str, Any]:
    return kube.get(PIPELINE, NS, name).get("status") or {}


def conditions(kube: KubeEmulator, name: str = "noop") -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status(kube, name).get("conditions", [])}


def jobs(kube: KubeEmulator, count: int) -> list[dict[str, Any]]:
    """Wait for exactly `count` profiling Jobs."""

    def found() -> list[dict[str, Any]] | None:
        listed = kube.list("jobs", NS)
        return listed if len(listed) == count else None

    return wait(found, f"{count} profiling Jobs")


def run_all_jobs(kube: KubeEmulator, count: int, model_dir: Path = NOOP_DIR) -> None:
    for job in jobs(kube, count):
        run_job(kube, job, model_dir)


def deployed(kube: KubeEmulator, generation: int, name: str = "noop") -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found = status(kube, name)
        planned = conditions(kube, name).get("Planned", {})
        done = planned.get("status") == "True" and planned.get("observedGeneration") == generation
        return found if done else None

    return wait(check, f"generation {generation} deployed")


def mark_ready(kube: KubeEmulator) -> None:
    """What the Deployment controller and kubelets would report: every replica ready."""
    for deployment in kube.list("deployments", NS):
        replicas = deployment["spec"]["replicas"]
        ready = {"status": {"replicas": replicas, "readyReplicas": replicas}}
        kube.patch("deployments", NS, deployment["metadata"]["name"], ready, subresource="status")


def versions(kube: KubeEmulator) -> dict[str, str]:
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
        for kind in ("deployments", "services", "configmaps", "jobs")
        for o in kube.list(kind, NS)
    }


def events(kube: KubeEmulator, name: str = "noop") -> list[dict[str, Any]]:
    return kube.list("events", NS, fields=f"involvedObject.name={name}")


def reasons(kube: KubeEmulator, name: str = "noop") -> list[str]:
    return [e["reason"] for e in events(kube, name)]


def posted(kube: KubeEmulator, reason: str) -> None:
    """Wait for an event with this reason: kopf posts events from a queue of its own, so
    one can arrive after the status patch of the same handler run."""
    wait(lambda: reason in reasons(kube), f"a {reason} event")


def check_status_schema(found: dict[str, Any]) -> None:
    """The status fits the CRD's status schema, and the API server would prune nothing."""
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    jsonschema.validate(found, schema)
    assert set(found) <= set(schema["properties"])
    for item in found.get("conditions", []):
        assert set(item) <= set(schema["properties"]["conditions"]["items"]["properties"])


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def test_lifecycle_create_profile_plan_deploy_change_delete(cluster: KubeEmulator) -> None:
    kube = cluster
    with operator(kube, fast_settings()):
        uid = kube.create(noop_pipeline())["metadata"]["uid"]
        created = jobs(kube, 6)  # 3 stages x 2 hardware classes
        assert {j["metadata"]["name"] for j in created} == {
            f"noop-profile-{s}-{hw}" for s in ("s1", "s2", "s3") for hw in ("cpu-1", "cpu-2")
        }
        wait(lambda: status(kube).get("phase") == "Profiling", "phase Profiling")
        posted(kube, "Profiling")
        run_all_jobs(kube, 6)
        deployed(kube, 1)

        # Objects: contents, owners, labels; the Jobs are gone, their profiles cached.
        owned = [
            kube.get("configmaps", NS, "noop-config"),
            kube.get("services", NS, "noop-router"),
            *kube.list("deployments", NS),
        ]
        assert sorted(o["metadata"]["name"] for o in owned[2:]) == [
            "noop-router",
            "noop-s1",
            "noop-s2",
            "noop-s3",
        ]
        for obj in owned:
            (owner,) = obj["metadata"]["ownerReferences"]
            assert (owner["uid"], owner["controller"]) == (uid, True)
            assert obj["metadata"]["labels"]["sloline.dev/pipeline"] == "noop"
        # The worker channel (its token Secret, headless Service and NetworkPolicy) and
        # the routers' PodDisruptionBudget, owned (GC'd).
        for kind, name in (
            ("secrets", "noop-worker-token"),
            ("services", "noop-router-workers"),
            ("networkpolicies", "noop-router"),
            ("poddisruptionbudgets", "noop-router"),
        ):
            (owner,) = kube.get(kind, NS, name)["metadata"]["ownerReferences"]
            assert (owner["uid"], owner["controller"]) == (uid, True)
        config = owned[0]["data"]
        assert yaml.safe_load(config["pipeline.yaml"])["spec"]["output"] == "s3"
        plan = Plan.from_dict(json.loads(config["plan.json"]))
        assert [s.name for s in plan.stages] == ["s1", "s2", "s3"]
        worker = kube.get("deployments", NS, "noop-s2")
        assert worker["spec"]["replicas"] == plan.stage("s2").replicas
        args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:6] == [
            "worker",
            "--pipeline",
            "/etc/sloline/pipeline.yaml",
            "--stage",
            "s2",
            "--router",
        ]
        assert kube.list("jobs", NS) == [] and kube.list("pods", NS) == []
        cache = kube.get("configmaps", NS, "noop-profiles")["data"]
        assert len([k for k in cache if k.count(".") == 2 and k[:2] in ("s1", "s2", "s3")]) == 6

        # Status: conditions, plan summary, endpoints; Ready once the pods are.
        found = status(kube)
        assert found["phase"] == "Deploying"
        assert {t: c["status"] for t, c in conditions(kube).items()} == {
            "Valid": "True",
            "Profiled": "True",
            "Planned": "True",
            "Ready": "False",
        }
        assert found["plan"]["costPerHour"] == pytest.approx(plan.cost_per_hour)
        assert found["plan"]["stages"][0] == {
            "name": "s1",
            "hardware": plan.stage("s1").hardware,
            "maxBatch": plan.stage("s1").max_batch,
            "replicas": plan.stage("s1").replicas,
        }
        assert found["endpoints"]["http"] == "http://noop-router.default.svc:8000"
        check_status_schema(found)
        posted(kube, "Planned")
        mark_ready(kube)
        wait(lambda: status(kube).get("phase") == "Ready", "phase Ready")
        ready_since = conditions(kube)["Ready"]["lastTransitionTime"]

        # An SLO change re-plans without profiling; only the router reads the SLO.
        before = versions(kube)
        kube.patch(PIPELINE, NS, "noop", {"spec": {"slo": {"latencyMs": 150}}})
        deployed(kube, 2)
        assert changed(before, versions(kube)) == {
            "ConfigMap/noop-config",
            "Deployment/noop-router",
        }
        spec = yaml.safe_load(kube.get("configmaps", NS, "noop-config")["data"]["pipeline.yaml"])
        assert spec["spec"]["slo"]["latencyMs"] == 150

        # One stage's model changes: only that stage is profiled again and rolled.
        before = versions(kube)
        stages = copy.deepcopy(kube.get(PIPELINE, NS, "noop")["spec"]["stages"])
        stages[2]["model"]["entrypoint"] = "noop_stages:crash_on_negative"
        kube.patch(PIPELINE, NS, "noop", {"spec": {"stages": stages}})
        reprofiled = jobs(kube, 2)
        assert {j["metadata"]["labels"]["sloline.dev/stage"] for j in reprofiled} == {"s3"}
        wait(lambda: status(kube).get("phase") == "Profiling", "phase Profiling again")
        assert conditions(kube)["Ready"]["status"] == "True"  # the old plan keeps serving
        run_all_jobs(kube, 2)
        deployed(kube, 3)
        assert changed(before, versions(kube)) == {
            "ConfigMap/noop-config",
            "ConfigMap/noop-profiles",
            "Deployment/noop-router",
            "Deployment/noop-s3",
        }
        s3 = kube.get("deployments", NS, "noop-s3")
        assert "crash_on_negative" not in json.dumps(s3)  # the spec is in the ConfigMap
        assert kube.list("jobs", NS) == []
        mark_ready(kube)
        wait(lambda: status(kube).get("phase") == "Ready", "phase Ready again")
        assert conditions(kube)["Ready"]["lastTransitionTime"] >= ready_since

        # Delete: everything goes with its owner.
        kube.delete(PIPELINE, NS, "noop")
        for kind, name in [
            ("deployments", "noop-router"),
            ("deployments", "noop-s1"),
            ("services", "noop-router"),
            ("configmaps", "noop-config"),
            ("configmaps", "noop-profiles"),
        ]:
            kube.wait_gone(kind, NS, name)
        assert kube.list("deployments", NS) == []


def test_reconciling_twice_writes_nothing(cluster: KubeEmulator) -> None:
    """Another pass over a deployed pipeline (an operator restart, a retry) only reads:
    the emulator's one global resourceVersion does not move between two probes."""
    kube = cluster
    settings = fast_settings()
    with operator(kube, settings):
        kube.create(noop_pipeline())
        run_all_jobs(kube, 6)
        deployed(kube, 1)
        mark_ready(kube)
        wait(lambda: status(kube).get("phase") == "Ready", "phase Ready")
    context = OperatorContext(KubeApi.connect(str(kube.kubeconfig_path)), settings)
    posted: list[tuple[str, str, str]] = []

    def probe(name: str) -> int:
        created = kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}})
        return int(created["metadata"]["resourceVersion"])

    token = kube.get("secrets", NS, "noop-worker-token")["data"]["token"]
    before = probe("before")
    report = reconcile(context, kube.get(PIPELINE, NS, "noop"), lambda *e: posted.append(e))
    assert probe("after") == before + 1, "the second reconcile wrote something"
    assert not report.changed and len(report.unchanged) == 10
    assert posted == []
    # The worker token was made once and is kept; a Secret that lost it gets a new one.
    assert kube.get("secrets", NS, "noop-worker-token")["data"]["token"] == token
    assert len(base64.b64decode(token)) >= 40
    kube.patch("secrets", NS, "noop-worker-token", {"data": {"token": None}})
    report = reconcile(context, kube.get(PIPELINE, NS, "noop"), lambda *e: posted.append(e))
    assert report.patched == ["Secret/noop-worker-token"]
    fresh = kube.get("secrets", NS, "noop-worker-token")["data"]["token"]
    assert fresh != token and len(base64.b64decode(fresh)) >= 40


def test_invalid_spec_reports_the_field_and_creates_nothing(cluster: KubeEmulator) -> None:
    kube = cluster
    with operator(kube, fast_settings()):
        kube.create(noop_pipeline(output="missing"))
        wait(lambda: status(kube).get("phase") == "Failed", "phase Failed")
        valid = conditions(kube)["Valid"]
        assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
        assert "spec.output: no stage named 'missing'" in valid["message"]
        assert valid["observedGeneration"] == 1
        warning = wait(
            lambda: [e for e in events(kube) if e["reason"] == "InvalidSpec"], "a Warning Event"
        )[0]
        assert warning["type"] == "Warning" and "spec.output" in warning["message"]
        for kind in ("jobs", "deployments", "services", "configmaps"):
            assert kube.list(kind, NS) == [], kind
        # Fixing the spec resumes the work.
        kube.patch(PIPELINE, NS, "noop", {"spec": {"output": "s3"}})
        jobs(kube, 6)
        wait(lambda: conditions(kube)["Valid"]["status"] == "True", "Valid=True")


def test_operator_restart_mid_profiling_duplicates_nothing(cluster: KubeEmulator) -> None:
    kube = cluster
    with operator(kube, fast_settings()):
        kube.create(noop_pipeline())
        first = jobs(kube, 6)
    uids = {j["metadata"]["name"]: j["metadata"]["uid"] for j in first}
    run_job(kube, first[0], NOOP_DIR)  # a Job finishes while no operator runs
    with operator(kube, fast_settings()):
        wait(
            lambda: "1/6 profiles measured" in conditions(kube)["Profiled"]["message"],
            "the new operator to harvest the finished Job",
        )
        remaining = kube.list("jobs", NS)
        assert {j["metadata"]["name"]: j["metadata"]["uid"] for j in remaining} == {
            name: uid for name, uid in uids.items() if name != first[0]["metadata"]["name"]
        }
        for job in remaining:
            run_job(kube, job, NOOP_DIR)
        deployed(kube, 1)
        assert len(kube.list("deployments", NS)) == 4
        assert len(kube.list("services", NS)) == 2  # the clients' and the workers'
        assert [e["reason"] for e in events(kube)].count("Planned") == 1


def test_failed_profiling_job_fails_the_pipeline_with_its_message(cluster: KubeEmulator) -> None:
    kube = cluster
    with operator(kube, fast_settings()):
        kube.create(noop_pipeline())
        job = jobs(kube, 6)[0]
        finish_job(kube, job, "error: ModelError: cannot load noop_stages", exit_code=1)
        wait(lambda: status(kube).get("phase") == "Failed", "phase Failed")
        profiled = conditions(kube)["Profiled"]
        assert profiled["reason"] == "ProfilingFailed"
        assert "cannot load noop_stages" in profiled["message"]
        posted(kube, "ProfilingFailed")
        assert kube.find("jobs", NS, job["metadata"]["name"]) is None  # retried on the next change


def test_a_succeeded_job_whose_pods_are_gone_is_measured_again(cluster: KubeEmulator) -> None:
    """A Job that reports success while none of its pods is left (garbage-collected, or
    deleted by hand) has lost its message: the operator replaces it rather than failing."""
    kube = cluster
    with operator(kube, fast_settings()):
        kube.create(noop_pipeline())
        job = jobs(kube, 6)[0]
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        done = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
        kube.patch("jobs", NS, name, {"status": done}, subresource="status")
        wait(
            lambda: (
                (kube.find("jobs", NS, name) or {"metadata": {"uid": uid}})["metadata"]["uid"]
                != uid
            ),
            "a new Job in place of the one without pods",
        )
        assert conditions(kube)["Profiled"]["reason"] == "Profiling"
        assert status(kube).get("phase") != "Failed"


def test_a_job_past_its_deadline_fails_the_pipeline_saying_so(cluster: KubeEmulator) -> None:
    kube = cluster
    with operator(kube, fast_settings()):
        kube.create(noop_pipeline())
        job = jobs(kube, 6)[0]
        failed = {
            "type": "Failed",
            "status": "True",
            "reason": "DeadlineExceeded",
            "message": "Job was active longer than specified deadline",
        }
        patch = {"status": {"failed": 1, "conditions": [failed]}}
        kube.patch("jobs", NS, job["metadata"]["name"], patch, subresource="status")
        wait(lambda: status(kube).get("phase") == "Failed", "phase Failed")
        message = conditions(kube)["Profiled"]["message"]
        assert "DeadlineExceeded: Job was active longer than specified deadline" in message


def test_kubectl_applies_the_example_and_reads_the_printer_columns(cluster: KubeEmulator) -> None:
    """`kubectl apply` the example manifest, the operator profiles, plans and deploys it,
    and kubectl reads the CRD's printer columns (the emulator serves no Table output, so
    they are asked for as custom columns with the CRD's own JSONPaths)."""
    kube = cluster
    model_dir = build_example("digits-cascade").parent
    one_class = {"catalog": {"classes": [{"name": "cpu-1", "costPerHour": 0.05}]}}
    manifest = ROOT / "manifests" / "examples" / "digits-cascade.yaml"
    with operator(kube, fast_settings(**one_class)):
        kube.kubectl("apply", "--validate=false", "-n", NS, "-f", str(manifest))
        run_all_jobs(kube, 4, model_dir)
        deployed(kube, 1, "digits-cascade")
        crd = yaml.safe_load(CRD.read_text())
        paths = [c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
        spec = ",".join(f"C{i}:{path}" for i, path in enumerate([".metadata.name", *paths]))
        table = kube.kubectl("get", "slp", "-n", NS, "-o", f"custom-columns={spec}").stdout
    header, row = table.strip().splitlines()
    assert header.split() == [f"C{i}" for i in range(len(paths) + 1)]
    values = dict(zip([".metadata.name", *paths], row.split(), strict=True))
    found = status(kube, "digits-cascade")
    assert values[".metadata.name"] == "digits-cascade"
    assert values[".status.phase"] == "Deploying"
    assert values[".spec.slo.latencyMs"] == "50"
    assert float(values[".status.plan.estimatedP99Ms"]) == found["plan"]["estimatedP99Ms"]
    assert float(values[".status.plan.costPerHour"]) == found["plan"]["costPerHour"]


def scaled_workers(kube: KubeEmulator, plan: Plan) -> list[dict[str, Any]]:
    """Worker Deployments with more replicas than the plan gave them."""
    found = []
    for deployment in kube.list("deployments", NS):
        stage = deployment["metadata"]["labels"].get("sloline.dev/stage")
        if stage and deployment["spec"]["replicas"] > plan.stage(stage).replicas:
            found.append(deployment)
    return found


def scrape_job(namespace: str, port: int) -> dict[str, Any]:
    """A scrape of a router in `namespace`, labelled as Kubernetes service discovery does."""
    return {
        "job_name": f"router-{namespace}",
        "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": namespace}}],
    }


def test_tuner_daemon_scales_a_worker_on_a_burst(cluster: KubeEmulator, tmp_path: Path) -> None:
    kube = cluster
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    port = free_port()
    settings = fast_settings(prometheusUrl=f"http://127.0.0.1:{port}")
    with operator(kube, settings, metrics):
        kube.create(noop_pipeline())
        run_all_jobs(kube, 6)
        deployed(kube, 1)
        mark_ready(kube)
        plan = Plan.from_dict(
            json.loads(kube.get("configmaps", NS, "noop-config")["data"]["plan.json"])
        )
        windows = plan.envelope.windows_s
        with SyntheticRouter("noop", ["s1", "s2", "s3"], windows) as router:
            prometheus = Prometheus(
                tmp_path, [], port, scrape_configs=[scrape_job(NS, router.port)]
            )
            try:
                prometheus.wait_ready()
                # A burst: ten times the planned envelope at every window.
                router.rate_rps = 10 * plan.rate_rps
                router.envelope = {
                    w: 10 * r for w, r in zip(windows, plan.envelope.rates_rps, strict=True)
                }
                scaled = wait(lambda: scaled_workers(kube, plan), "a worker scaled up", 60)
                attained = wait(lambda: status(kube).get("attainment"), "the attainment", 30)
            finally:
                prometheus.stop()
        scaled_up = wait(
            lambda: [e for e in events(kube) if e["reason"] == "ScaledUp"], "a ScaledUp Event"
        )
        assert attained == "100.00%"  # every synthetic request was within the SLO
        check_status_schema(status(kube))
        assert "scale up (Alg. 3)" in scaled_up[0]["message"]
        assert scaled_up[0]["type"] == "Normal"
        stage = scaled[0]["metadata"]["labels"]["sloline.dev/stage"]
        up = registry.get_sample_value(
            "sloline_tuner_decisions_total",
            {"namespace": NS, "pipeline": "noop", "stage": stage, "direction": "up"},
        )
        assert up is not None and up >= 1
        desired = registry.get_sample_value(
            "sloline_stage_replicas",
            {"namespace": NS, "pipeline": "noop", "stage": stage, "state": "desired"},
        )
        assert desired == kube.get("deployments", NS, f"noop-{stage}")["spec"]["replicas"]
        # The reconciles that profiled, planned and deployed it, counted in its namespace.
        get = registry.get_sample_value
        jobs = {"namespace": NS, "result": "succeeded"}
        assert get("sloline_operator_profiling_jobs_started_total", {"namespace": NS}) == 6
        assert get("sloline_operator_profiling_jobs_finished_total", jobs) == 6
        assert get("sloline_operator_plan_duration_seconds_count", {"namespace": NS}) == 1
        ok = {"namespace": NS, "result": "ok"}
        assert (get("sloline_operator_reconciles_total", ok) or 0) >= 1
        assert kube.get(PIPELINE, NS, "noop")["metadata"]["finalizers"] == ["sloline.dev/operator"]
        kube.delete(PIPELINE, NS, "noop")  # the daemon stops, kopf releases the pipeline
        kube.wait_gone(PIPELINE, NS, "noop", timeout_s=20)


def test_sloline_operator_command_runs_against_the_cluster(
    cluster: KubeEmulator, tmp_path: Path
) -> None:
    """`sloline operator` as the chart runs it: settings file, kubeconfig, metrics and
    liveness ports; it serves pipelines and exits cleanly on SIGTERM."""
    kube = cluster
    config = tmp_path / "config.yaml"
    config.write_text("profiling: {pollS: 0.2}\nserviceMonitor: never\n")
    metrics_port, health_port = free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "sloline",
        "operator",
        "--config",
        str(config),
        "--standalone",
        "--namespace",
        NS,
        "--metrics-port",
        str(metrics_port),
        "--liveness",
        f"http://127.0.0.1:{health_port}/healthz",
    ]
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig_path)}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        kube.create(noop_pipeline())
        jobs(kube, 6)
        wait(lambda: status(kube).get("phase") == "Profiling", "phase Profiling")
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=5) as r:
            assert r.status == 200

        def scrape() -> str:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                return str(r.read().decode())

        def value(text: str, sample: str) -> float:
            m = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
            return float(m.group(1)) if m else 0.0

        waiting = f'sloline_operator_reconciles_total{{namespace="{NS}",result="waiting"}}'

        def counted() -> str:
            text = scrape()
            return text if value(text, waiting) >= 1 else ""

        exported = wait(counted, waiting)
        assert "# TYPE sloline_tuner_decisions_total counter" in exported
        assert "# TYPE sloline_stage_replicas gauge" in exported
        started = f'sloline_operator_profiling_jobs_started_total{{namespace="{NS}"}}'
        assert value(exported, started) == 6
        duration = (
            "sloline_operator_reconcile_duration_seconds_count"
            f'{{namespace="{NS}",result="waiting"}}'
        )
        assert value(exported, duration) >= 1
        assert re.search(r"^process_cpu_seconds_total \S+$", exported, re.M)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
