"""The whole Kubernetes story, end to end, as a user runs it (docs/e2e.md):

`helm template` the chart -> the CRDs and the operator through real kubectl -> `kubectl
apply` the digits-cascade example -> profiling Jobs run and report -> the plan in the
status -> router and worker processes start -> tritonclient requests (gRPC and HTTP)
through the router's Service -> a load burst -> the tuner daemon, reading Prometheus,
raises a stage's replicas -> more workers join -> P99 recovers -> the load drops -> scale
down after stabilisation -> (with several routers) each router pod deleted and replaced
under load -> `kubectl delete` -> every object and process is gone.

It runs unchanged on each cluster of `CLUSTERS` (`tests/support/cluster.py`): the local
stand-in (the API emulator and the process kubelet, tests/support/kube) or, with
`$KUBECONFIG` set, that cluster; and the local real control plane, namespaces enforcing
Pod Security `restricted`. Each step's duration goes to the test report
(`record_property`) and a printed table.

`test_a_broken_rendering_fails_with_a_pointer` proves the harness really runs the
manifests: the same story, with the operator's output post-processed by a mutating
admission hook of the emulator (a wrong router address in a worker's args, a workers'
Service that names ready routers only, or a worker without the worker token), fails at
once with a message naming the cause.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from tests.support.cluster import (
    CATALOG,
    CLUSTERS,
    HELM,
    ROOT,
    Cluster,
    EmulatedCluster,
    open_cluster,
)
from tests.support.load import OpenLoopLoad, Sent, windows
from tests.support.net import free_port

PIPELINE = "digits-cascade"
NS = "sloline-e2e"  # the pipeline's namespace
SYSTEM = "sloline-e2e-system"  # the chart's
EXAMPLE = ROOT / "manifests" / "examples" / f"{PIPELINE}.yaml"
SELECTOR = f"sloline.dev/pipeline={PIPELINE}"
STAGES = ("preprocess", "fast", "accurate", "combine")
# Routers per pipeline (chart value settings.router.replicas; every worker connects to
# each router). With more than one, the story deletes each router pod in turn under load
# and requests keep succeeding: the client retries what a stopping router answers with
# UNAVAILABLE, only then.
ROUTERS = 2
# What the story changes from the chart's defaults: small profiling Jobs, a quick tuner.
STORY_VALUES: dict[str, Any] = {
    # The chart's own ServiceMonitor: Prometheus scrapes the operator's tuner metrics.
    "metrics": {"serviceMonitor": {"enabled": True, "interval": "1s"}},
    "settings": {
        "catalog": CATALOG,
        "profiling": {"cap": 4, "repeats": 3, "budgetS": 0.2, "activeDeadlineS": 120, "pollS": 0.5},
        "tuner": {
            "intervalS": 1.0,
            "stabilizationS": 5.0,
            "lambdaWindowS": 1.0,
            "lambdaLookbackS": 4.0,
            "envelopeLookbackS": 6.0,
            "lambdaRateWindowS": 3.0,
            "maxReplicas": 2,
        },
        "router": {"replicas": ROUTERS},
    },
}
# The example plans for 100 rps; two shared cores serve about 180 within its 50 ms SLO
# (the router's and the workers' CPU, not the workers' count, is the limit there).
# The story starts under the plan (no scaling), bursts to 1.6x the plan, then drops.
BASE_RPS, BURST_RPS, DROP_RPS = 60.0, 160.0, 20.0

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        is_map = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if is_map else copy.deepcopy(value)
    return out


class Timeline:
    """The story's steps: how long each took, for the report and a printed table."""

    def __init__(self, record_property: Callable[[str, object], None]) -> None:
        self.record = record_property
        self.start = self.last = time.monotonic()
        self.steps: list[tuple[str, float, float]] = []
        self.notes: list[str] = []

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append((step, now - self.last, now - self.start))
        key = re.sub(r"[^a-z0-9]+", "_", step.lower()).strip("_")
        self.record(f"step_{key}_s", round(now - self.last, 2))
        self.last = now

    def note(self, text: str) -> None:
        self.notes.append(text)

    def table(self) -> str:
        rows = [f"{'step':<42} {'took':>7} {'at':>7}"]
        rows += [f"{name:<42} {took:>6.1f}s {at:>6.1f}s" for name, took, at in self.steps]
        return "\n".join(rows + self.notes)


class Story:
    """The steps, on one cluster; every wait fails with what the pods are doing."""

    def __init__(self, cluster: Cluster, workdir: Path, timeline: Timeline) -> None:
        self.cluster, self.workdir, self.timeline = cluster, workdir, timeline
        self.plan: dict[str, Any] = {}

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while not (found := check()):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not within {timeout_s:g} s\n\n{self.diagnose()}\n\n"
                    f"steps so far:\n{self.timeline.table()}"
                )
            time.sleep(0.2)
        return found

    def diagnose(self) -> str:
        """Why the pipeline is not serving: the Deployments short of ready pods with what
        their pods do, the Services, the pipeline's conditions; or else every pod."""
        lines = []
        for deployment in self.cluster.objects("deployments", NS, SELECTOR):
            name, status = deployment["metadata"]["name"], deployment.get("status") or {}
            ready, wanted = status.get("readyReplicas", 0), deployment["spec"]["replicas"]
            if ready < wanted:
                lines.append(f"Deployment {NS}/{name}: {ready}/{wanted} ready; its pods:")
                lines.append(self.cluster.explain(NS, f"{name}-"))
        lines.append(self.cluster.services(NS))
        conditions = [
            f"{c['type']}={c['status']} ({c.get('reason')}: {c.get('message', '')[:300]})"
            for c in (self.pipeline().get("status") or {}).get("conditions") or []
        ]
        lines.append("pipeline conditions: " + "; ".join(conditions))
        if len(lines) == 2:
            lines.append("pods:\n" + self.cluster.explain())
        return "\n".join(lines)

    def events(self) -> list[str]:
        """The tuner's decisions, as Events on the pipeline."""
        return [
            f"{e['reason']}: {e.get('message')}"
            for e in self.cluster.objects("events", NS)
            if e.get("reason") in ("ScaledUp", "ScaledDown")
        ]

    def pipeline(self) -> dict[str, Any]:
        found = self.cluster.objects("predictionpipelines", NS)
        return found[0] if found else {}

    def condition(self, type_: str) -> dict[str, Any]:
        conditions = (self.pipeline().get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), {})

    def workers(self) -> dict[str, dict[str, Any]]:
        """Worker Deployments by stage."""
        listed = self.cluster.objects(
            "deployments", NS, f"{SELECTOR},app.kubernetes.io/component=worker"
        )
        return {d["metadata"]["labels"]["sloline.dev/stage"]: d for d in listed}

    # -- the steps --------------------------------------------------------------------------

    def install(self, values: dict[str, Any] | None = None) -> None:
        """`helm template` the charts, then the CRD and the operator through kubectl."""
        values = merged(merged(STORY_VALUES, values or {}), self.cluster.values())
        (self.workdir / "values.yaml").write_text(yaml.safe_dump(values))
        if not HELM.exists():
            pytest.skip("helm is not installed (make .tools/bin/helm)")

        def template(release: str, *args: str) -> list[dict[str, Any]]:
            rendered = subprocess.run(
                [str(HELM), "template", release, str(ROOT / "helm" / release),
                 "--namespace", SYSTEM, *args],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            return [d for d in yaml.safe_load_all(rendered) if d]

        crds = template("sloline-crds")
        rest = template("sloline", "-f", str(self.workdir / "values.yaml"))
        labels = self.cluster.namespace_labels
        namespaces = [{"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": n, "labels": labels}}
                      for n in (SYSTEM, NS)]  # fmt: skip
        for name, docs in (("namespaces", namespaces), ("crds", crds), ("operator", rest)):
            path = self.workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump_all(docs))
            self.cluster.kubectl("apply", "-f", str(path))
        self.timeline.mark("helm template, apply CRDs + operator")

        def operator_ready() -> bool:
            found = self.cluster.objects(
                "deployments", SYSTEM, "app.kubernetes.io/component=operator"
            )
            return bool(found) and (found[0].get("status") or {}).get("readyReplicas") == 1

        self.wait("the operator's Deployment is ready", operator_ready, 90)
        self.timeline.mark("operator ready")

    def deploy_pipeline(self, ready_timeout_s: float = 120, manifest: Path = EXAMPLE) -> None:
        """`kubectl apply` the example (or `manifest`, the example changed); profiling Jobs,
        the plan, router and workers."""
        self.cluster.kubectl("apply", "-n", NS, "-f", str(manifest))
        jobs_seen: set[str] = set()

        def profiled() -> bool:
            for job in self.cluster.objects(
                "jobs", NS, f"{SELECTOR},app.kubernetes.io/component=profiler"
            ):
                jobs_seen.add(job["metadata"]["labels"]["sloline.dev/stage"])
            return self.condition("Profiled").get("status") == "True"

        self.wait("the profiling Jobs report", profiled, 180)
        cache = self.cluster.objects(
            "configmaps", NS, f"{SELECTOR},app.kubernetes.io/component=profiler"
        )
        keys = [k for k in cache[0]["data"] if k.count(".") == 2] if cache else []
        assert sorted(k.split(".")[0] for k in keys) == sorted(STAGES), cache
        assert jobs_seen == set(STAGES), f"profiling Jobs seen: {jobs_seen}"
        self.timeline.mark("profiling Jobs ran and reported")

        def planned() -> dict[str, Any]:
            status = self.pipeline().get("status") or {}
            return dict(status["plan"]) if status.get("plan") else {}

        self.plan = self.wait("the plan appears in the status", planned, 60)
        listed = json.loads(self.cluster.kubectl("get", "slp", "-n", NS, "-o", "json").stdout)
        assert listed["items"][0]["status"]["plan"] == self.plan
        assert {s["name"] for s in self.plan["stages"]} == set(STAGES), self.plan
        self.timeline.mark("plan in status")

        def serving() -> bool:
            return (self.pipeline().get("status") or {}).get("phase") == "Ready"

        self.wait("router and workers are ready", serving, ready_timeout_s)
        for stage, deployment in self.workers().items():
            assert deployment["status"]["readyReplicas"] == self.planned(stage), deployment
        self.timeline.mark("router and workers ready")

    def check_operator_metrics(self, stages: list[str]) -> None:
        """The operator's decisions counter, scraped through the chart's ServiceMonitor."""
        promql = (
            # Honored labels: the pipeline's namespace, not the operator's.
            f'sloline_tuner_decisions_total{{namespace="{NS}",service="sloline-operator-metrics",'
            f'pipeline="{PIPELINE}",direction="up"}} > 0'
        )
        if self.cluster.query(promql) is None:
            return  # no Prometheus the test can reach
        found = self.wait(
            "Prometheus has the operator's scale-up decisions",
            lambda: self.cluster.query(promql),
            20,
        )
        assert set(stages) <= {s["metric"]["stage"] for s in found}, found

    def processes_match(self, workers: dict[str, dict[str, Any]]) -> bool:
        """Where the cluster can tell: one running container process per worker pod,
        plus the routers'."""
        if not self.cluster.leaves_processes:
            return True
        pods = sum((d.get("status") or {}).get("replicas", 0) for d in workers.values())
        return len(self.cluster.leftover_processes(NS)) == pods + ROUTERS

    def routers(self) -> list[str]:
        """The router pods' names (terminating ones too)."""
        selector = f"{SELECTOR},app.kubernetes.io/component=router"
        return sorted(p["metadata"]["name"] for p in self.cluster.objects("pods", NS, selector))

    def replace_each_router(self) -> None:
        """Delete the router pods one at a time, each once its predecessor's replacement
        is ready: whichever router the load's connection reaches goes too."""
        for name in self.routers():
            self.cluster.kubectl("delete", "pod", "-n", NS, name, "--wait=false")

            def replaced(name: str = name) -> bool:
                router = self.cluster.objects(
                    "deployments", NS, f"{SELECTOR},app.kubernetes.io/component=router"
                )
                ready = (router[0].get("status") or {}).get("readyReplicas", 0) if router else 0
                pods = self.routers()
                return (
                    name not in pods
                    and len(pods) == ready == ROUTERS
                    and self.processes_match(self.workers())
                )

            self.wait(f"router pod {name} deleted and replaced", replaced, 90)

    def planned(self, stage: str) -> int:
        return int(next(s["replicas"] for s in self.plan["stages"] if s["name"] == stage))

    def requests(self) -> None:
        """Real tritonclient requests, gRPC and HTTP, through the router's Service."""
        x_test, y_test = digits()
        grpc_address = self.cluster.address(NS, f"{PIPELINE}-router", "grpc")
        http_address = self.cluster.address(NS, f"{PIPELINE}-router", "http")
        labels: dict[str, list[int]] = {}
        for proto, module, client in (
            ("grpc", grpcclient, grpcclient.InferenceServerClient(grpc_address)),
            ("http", httpclient, httpclient.InferenceServerClient(http_address)),
        ):
            assert client.is_server_ready(), proto
            labels[proto] = []
            for row in x_test[:40]:
                pixels = module.InferInput("pixels", [1, 64], "FP32")
                pixels.set_data_from_numpy(row[None].astype(np.float32))
                out = client.infer(PIPELINE, [pixels], parameters={"timeout_ms": 10_000})
                assert out.as_numpy("probabilities").shape == (1, 10)
                labels[proto].append(int(out.as_numpy("label").ravel()[0]))
                # Paced: back to back they would be a burst above the plan, which the
                # tuner (looking back 15 s) would answer during the next step.
                time.sleep(0.025)
            client.close()
        assert labels["grpc"] == labels["http"]
        accuracy = float(np.mean(np.array(labels["grpc"]) == y_test[:40]))
        assert accuracy >= 0.9, accuracy
        self.timeline.mark("tritonclient gRPC + HTTP requests")

    def burst_and_drop(self) -> list[Sent]:
        """The planned rate, a burst: the tuner scales up, workers join, P99 recovers;
        then a drop: the tuner scales down after stabilisation."""
        slo_s = self.pipeline()["spec"]["slo"]["latencyMs"] / 1000.0
        x_test, _ = digits()
        address = self.cluster.address(NS, f"{PIPELINE}-router", "grpc")
        planned = {stage: self.planned(stage) for stage in STAGES}

        def scaled_up() -> list[str]:
            return [s for s, d in self.workers().items() if d["spec"]["replicas"] > planned[s]]

        with OpenLoopLoad(address, PIPELINE, "pixels", x_test) as load:
            load.rate_rps = BASE_RPS
            # Five seconds' worth of answered requests at the planned rate, however long
            # they take here: the tuner (looking back 6 s) sees them and keeps the plan.
            before = len(load.sent)
            self.wait(
                f"{BASE_RPS * 5:g} requests answered at {BASE_RPS:g} rps",
                lambda: len(load.sent) - before >= BASE_RPS * 5,
                60,
            )
            assert not scaled_up(), f"scaled up under the planned rate: {self.events()}"
            load.rate_rps = BURST_RPS
            burst_at = time.monotonic()
            self.timeline.mark(f"{BASE_RPS:g} rps (under the plan): no scaling")
            stages = self.wait("the tuner raises a stage's replicas", scaled_up, 30)
            self.timeline.mark(f"burst {BURST_RPS:g} rps: tuner scales up")
            self.timeline.record("scaled_up_stages", ",".join(stages))

            def joined() -> bool:
                workers = self.workers()
                return all(
                    workers[s]["status"].get("readyReplicas", 0) > planned[s] for s in stages
                ) and self.processes_match(workers)

            self.wait("more worker processes join (readyReplicas rises)", joined, 60)
            joined_at = time.monotonic()
            self.timeline.mark("more workers ready")

            def recovered() -> bool:  # P99 of the last 3 s of answered sends, since joining
                now = time.monotonic()
                if now - joined_at < 4.0:
                    return False
                ((_, count, p99),) = windows(load.sent, now - 4.0, now - 1.0, width_s=3.0)
                return count > 0 and p99 <= slo_s

            try:
                self.wait(f"P99 back under the SLO ({slo_s * 1000:g} ms)", recovered, 40)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n\n{latency_table(load.sent, burst_at)}") from None
            self.timeline.mark("P99 recovered")
            peak = {s: d["spec"]["replicas"] for s, d in self.workers().items()}
            load.rate_rps = DROP_RPS
            drop_at = time.monotonic()

            def scaled_down() -> bool:
                return any(d["spec"]["replicas"] < peak[s] for s, d in self.workers().items())

            self.wait("the tuner scales down after the drop", scaled_down, 90)
            self.timeline.mark(f"drop to {DROP_RPS:g} rps: tuner scales down")

            def settled() -> bool:  # the workers scaled away have stopped
                workers = self.workers()
                return all(
                    (d.get("status") or {}).get("replicas", 0) == d["spec"]["replicas"]
                    for d in workers.values()
                ) and self.processes_match(workers)

            self.wait("the workers scaled away stop", settled, 60)
            self.timeline.mark("their processes stopped")
            replacing = (time.monotonic(), time.monotonic())
            if ROUTERS > 1:
                self.replace_each_router()
                replacing = (replacing[0], time.monotonic())
                self.timeline.mark(f"each of {ROUTERS} routers deleted, replaced")
        self.check_operator_metrics(stages)
        sent = load.sent
        failed = [s for s in sent if s.latency_s is None]
        assert sent and not failed, f"{len(failed)} of {len(sent)} failed: {failed[:3]}"
        retried = [s for s in sent if s.retries]
        elsewhere = [s for s in retried if not replacing[0] <= s.at_s <= replacing[1]]
        assert not elsewhere, f"retried while no router was being replaced: {elsewhere[:3]}"
        self.timeline.record("requests_retried", len(retried))
        burst = windows(sent, burst_at, drop_at)
        peak_ms = max(p for _, _, p in burst) * 1000
        ((_, _, after),) = windows(sent, drop_at - 3.0, drop_at, width_s=3.0)
        self.timeline.record("burst_peak_p99_ms", round(peak_ms, 1))
        self.timeline.record("p99_before_drop_ms", round(after * 1000, 1))
        self.timeline.note(
            f"{len(sent)} requests, none failed ({len(retried)} retried while routers were "
            f"replaced); P99 per second during the burst peaked at {peak_ms:.0f} ms, "
            f"{after * 1000:.0f} ms over the last 3 s before the drop; "
            f"scaled up: {', '.join(stages)}"
        )
        self.timeline.record("requests_sent", len(sent))
        return sent

    def uninstall(self) -> None:
        """Remove what `install` and the story made (the CRD stays: other releases may
        use it)."""
        for what in (["namespace", NS, SYSTEM], ["-f", str(self.workdir / "operator.yaml")]):
            self.cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *what, check=False)

    def delete(self) -> None:
        """`kubectl delete` the pipeline: every object and process of it goes."""
        self.cluster.kubectl("delete", "-n", NS, "predictionpipeline", PIPELINE, "--timeout=120s")
        resources = ("pods", "deployments", "services", "configmaps", "jobs", "servicemonitors")

        def gone() -> bool:
            return not any(self.cluster.objects(r, NS, SELECTOR) for r in resources) and not (
                self.cluster.leftover_processes(NS)
            )

        self.wait("every object and process of the pipeline is gone", gone, 90)
        assert not self.cluster.objects("pods", NS)
        self.timeline.mark("kubectl delete: all gone")


def latency_table(sent: list[Sent], since_s: float) -> str:
    """Requests and P99 per second of send time since `since_s`."""
    rows = ["second  requests  P99 ms"]
    for left, count, p99 in windows(sent, since_s, time.monotonic()):
        rows.append(f"{left - since_s:6.0f}  {count:8d}  {p99 * 1000:6.1f}")
    return "\n".join(rows)


@functools.cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """The example's test split (its own helper, loaded from the example folder)."""
    path = ROOT / "examples" / PIPELINE / "digits_stages.py"
    spec = importlib.util.spec_from_file_location("e2e_digits_stages", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x_test, y_test = module.labelled_test_split()
    return x_test, y_test


def build_models() -> None:
    """The example's ONNX files (`build.py` keeps existing ones)."""
    build = ROOT / "examples" / PIPELINE / "build.py"
    subprocess.run([sys.executable, str(build)], check=True, capture_output=True)


@pytest.fixture
def story(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> Iterator[Story]:
    """The story's steps on a cluster of `CLUSTERS` (the test's parameter; the first by
    default)."""
    build_models()
    timeline = Timeline(record_property)
    kind = getattr(request, "param", CLUSTERS[0])
    with open_cluster(kind, tmp_path / "cluster", free_port()) as cluster:
        timeline.mark("start the cluster")
        story = Story(cluster, tmp_path, timeline)
        try:
            yield story
        finally:
            print(f"\non the {cluster.name} cluster:\n{timeline.table()}")
            if cluster.shared:  # it outlives the test
                story.uninstall()


# The control plane starts in the test (10-20 s) and serves slower than the emulator.
@pytest.mark.parametrize(
    "story",
    [
        pytest.param(c, marks=[pytest.mark.timeout(600)] if c == "control-plane" else [])
        for c in CLUSTERS
    ],
    indirect=True,
)
def test_story(story: Story) -> None:
    story.install()
    story.deploy_pipeline()
    story.requests()
    story.burst_and_drop()
    story.delete()


BREAKAGES: dict[str, tuple[Callable[[str, dict[str, Any]], None], list[str]]] = {}


def breakage(name: str, *expected: str) -> Callable[[Callable[[str, dict[str, Any]], None]], None]:
    def register(fn: Callable[[str, dict[str, Any]], None]) -> None:
        BREAKAGES[name] = (fn, list(expected))

    return register


@breakage(
    "wrong-router-address",
    f"Deployment {NS}/{PIPELINE}-fast: 0/1 ready",
    "readiness probe failed: HTTP 503",
    f"router {PIPELINE}-ruoter-workers:8003 does not resolve",
)
def _misspell_the_router(kind: str, obj: dict[str, Any]) -> None:
    """The `fast` workers dial a router name that does not resolve."""
    if kind == "Deployment" and obj["metadata"]["name"] == f"{PIPELINE}-fast":
        container = obj["spec"]["template"]["spec"]["containers"][0]
        container["args"] = [
            a.replace(f"{PIPELINE}-router-workers:", f"{PIPELINE}-ruoter-workers:")
            for a in container["args"]
        ]


@breakage(
    "ready-only-worker-service",
    f"Deployment {NS}/{PIPELINE}-router: 0/{ROUTERS} ready",
    f"service {NS}/{PIPELINE}-router-workers headless: worker:8003 -> no endpoints",
    f"router {PIPELINE}-router-workers:8003 does not resolve",
)
def _publish_ready_routers_only(kind: str, obj: dict[str, Any]) -> None:
    """The workers' Service names only ready routers: a router turns ready only once
    workers have connected, so none ever does."""
    if kind == "Service" and obj["metadata"]["name"] == f"{PIPELINE}-router-workers":
        obj["spec"]["publishNotReadyAddresses"] = False


@breakage(
    "no-worker-token",
    f"Deployment {NS}/{PIPELINE}-fast: 0/1 ready",
    "refused this worker's token (UNAUTHENTICATED)",
)
def _forget_the_worker_token(kind: str, obj: dict[str, Any]) -> None:
    """The `fast` workers lose the worker token: the router refuses them."""
    if kind == "Deployment" and obj["metadata"]["name"] == f"{PIPELINE}-fast":
        container = obj["spec"]["template"]["spec"]["containers"][0]
        container["env"] = [e for e in container["env"] if e["name"] != "SLOLINE_WORKER_TOKEN"]


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_a_broken_rendering_fails_with_a_pointer(story: Story, name: str) -> None:
    if not isinstance(story.cluster, EmulatedCluster):
        pytest.skip("post-processing the operator's output needs the emulator's admission hook")
    mutate, expected = BREAKAGES[name]
    story.cluster.kube.call(lambda store: store.admission.append(mutate))
    # A fixed hop: the profiling Jobs skip their loopback probe (the story measures it).
    story.install({"settings": {"profiling": {"hopS": 0.001}}})
    with pytest.raises(AssertionError) as failure:
        story.deploy_pipeline(ready_timeout_s=12)
    message = str(failure.value)
    assert message.startswith("router and workers are ready: not within"), message
    for text in expected:
        assert text in message, f"{text!r} not in the failure message:\n{message}"
