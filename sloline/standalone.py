"""The router on its own (`sloline router`): the Kubernetes mode's data plane.

The operator renders a Deployment that runs this with the pipeline and its plan from a
ConfigMap; worker pods dial its worker port with the pipeline's worker token
(docs/kubernetes.md). It is the embedded mode's
`RouterApp` without the local backend and the tuner: max batch per stage comes from the
plan (a stage's `maxBatch` pin wins; without a plan: the pin, else 1), and the router
knows no desired replica count, so it reports only what it sees: connected workers, and
their cost at the plan's price per replica. Its peers (`--peers`, the other routers'
metrics ports) add their counts to its Triton statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from sloline.planner.plan import Plan
from sloline.serving.app import RouterApp
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.spec import Issue, LoadedPipeline, PipelineError


def load_plan(path: str | Path) -> Plan:
    """Read a plan written by `sloline plan --out` (JSON or YAML)."""
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise PipelineError([Issue("(file)", f"cannot read: {exc.strerror}")], source) from None
    except yaml.YAMLError as exc:
        raise PipelineError([Issue("(file)", f"not JSON or YAML: {exc}")], source) from None
    try:
        return Plan.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(
            [
                Issue(
                    "(document)",
                    f"not a plan ({type(exc).__name__}: {exc}); write one "
                    "with `sloline plan PIPELINE --out plan.json`",
                )
            ],
            source,
        ) from None


def check_plan(loaded: LoadedPipeline, plan: Plan) -> None:
    """The plan must be for this pipeline and name exactly its stages."""
    issues = []
    if plan.pipeline != loaded.name:
        issues.append(Issue("pipeline", f"the plan is for {plan.pipeline!r}, not {loaded.name!r}"))
    planned = {s.name for s in plan.stages}
    stages = set(loaded.graph.stages)
    if planned != stages:
        issues.append(
            Issue(
                "stages",
                f"the plan has stages {sorted(planned)} but the pipeline has {sorted(stages)}; "
                "re-plan after changing the stages",
            )
        )
    if issues:
        raise PipelineError(issues, "plan")


def max_batches(loaded: LoadedPipeline, plan: Plan | None) -> dict[str, int]:
    """Max batch per stage: the spec's `maxBatch` pin, else the plan's, else 1."""
    planned = {s.name: s.max_batch for s in plan.stages} if plan else {}
    return {s.name: s.max_batch or planned.get(s.name, 1) for s in loaded.pipeline.spec.stages}


def replica_prices(plan: Plan | None) -> dict[str, float]:
    """Price per replica-hour of each stage's planned hardware class."""
    if plan is None:
        return {}
    return {s.name: s.cost_per_hour / s.replicas for s in plan.stages if s.replicas}


def standalone_router(
    loaded: LoadedPipeline,
    plan: Plan | None,
    *,
    server: ServerSettings,
    router: RouterSettings,
    drain_s: float = 5.0,
) -> RouterApp:
    """The router of `sloline router`; it starts no workers."""
    if plan is not None:
        check_plan(loaded, plan)
    prices = replica_prices(plan)
    app: RouterApp

    def cost_per_hour() -> Mapping[str, float]:
        ready = app.router.ready_replicas()
        return {n: price * ready[n] for n, price in prices.items()}

    app = RouterApp(
        loaded,
        max_batch=max_batches(loaded, plan),
        server=server,
        router=router,
        plan_envelope=plan.envelope if plan else None,
        cost_per_hour=cost_per_hour,
        drain_s=drain_s,
    )
    return app


def describe(app: RouterApp, plan: Plan | None) -> str:
    """The start-up banner: what is served where."""
    loaded = app.loaded
    lines = [f"router for pipeline {loaded.name!r} ({'planned' if plan else 'no plan'})"]
    for name, queue in app.router.queues.items():
        lines.append(f"  stage {name}: max batch {queue.max_batch}")
    s = app.settings
    scheme = "https" if s.tls else "http"
    doors = ("TLS" + (" + client certificates" if s.tls_client_ca else "")) if s.tls else "plain"
    if s.auth_tokens:
        doors += f", bearer token ({len(s.auth_tokens)} accepted)"
    workers = "token required" if s.worker_token else "UNAUTHENTICATED (--insecure-workers)"
    lines += [
        f"  HTTP    {scheme}://{app.http_url}/v2/models/{loaded.name}/infer",
        f"  gRPC    {app.grpc_url}  (clients; {doors})",
        f"  workers {app.worker_url}  ({workers})",
        f"  metrics http://{app.metrics_url}/metrics",
    ]
    if s.stats_peers:
        lines.append(f"  peers   {', '.join(s.stats_peers)}  (Triton statistics add their counts)")
    return "\n".join(lines)
