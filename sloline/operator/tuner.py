"""The per-pipeline tuner daemon: InferLine's tuner (§5) with Prometheus in, Deployments out.

The policy is the embedded mode's (`sloline.tuner.policy.decide`, run by
`sloline.tuner.sources.Tuner`); only the edges differ. Observations come from the
routers' metrics in Prometheus (`PrometheusSource`: the routers' envelopes summed, compared
with the planning trace split over as many routers), and the actuator sets worker
Deployments' replicas through the `/scale` subresource and reads their ready pods. The
daemon follows the deployed plan (`plan.json` in `<p>-config`): a new plan means a new
tuner, with the plan's envelope, rates and bounds.

Each decision is applied, counted (`sloline_tuner_decisions_total`), and posted as a
Normal Event with its reason. The operator exports the desired replicas it owns
(`sloline_stage_replicas{state="desired"}`) and writes `status.attainment`, the fraction
of requests within the SLO over the last 5 minutes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from sloline.operator import kube
from sloline.operator.kube import KubeApi
from sloline.operator.metrics import OperatorMetrics
from sloline.operator.naming import config_map_name, router_name, worker_name
from sloline.operator.settings import OperatorSettings
from sloline.planner.plan import Plan
from sloline.planner.workload import trace_for_workload
from sloline.spec import PipelineGraph, parse_pipeline
from sloline.tuner.policy import Decision, TunerSettings
from sloline.tuner.sources import (
    GetJson,
    PrometheusSource,
    StageTuning,
    Tuner,
    pipeline_selector,
    router_tuning,
    stage_tunings,
    urllib_get_json,
)

_LOG = logging.getLogger(__name__)
ATTAINMENT_EVERY_S = 30.0

EventFn = Callable[[str, str, str], None]
StatusFn = Callable[[str], Awaitable[None]]


def tuning_for(
    plan: Plan, graph: PipelineGraph, settings: OperatorSettings
) -> tuple[list[StageTuning], TunerSettings]:
    """Per-stage tuning parameters from the plan (as the embedded mode's tuner): stages
    whose replicas the spec pins are left alone; bounds from the spec, else 1 and
    `tuner.maxReplicas`; rho_m made effective for stages planned at their floor."""
    stages = stage_tunings(
        plan, graph.pipeline.spec.stages, max_replicas=settings.tuner.max_replicas
    )
    windows = plan.envelope.windows_s
    return stages, settings.tuner.tuner_settings(windows[0], windows[-1])


class DeploymentActuator:
    """Replica counts of worker Deployments and of the router Deployment: `spec.replicas`
    through `/scale`, and `status.readyReplicas`. Blocking API calls run in worker
    threads."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        pipeline: str,
        on_desired: Callable[[str, int], None] = lambda _s, _n: None,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._pipeline = pipeline
        self._on_desired = on_desired

    async def scale(self, stage: str, replicas: int) -> None:
        await self._scale(worker_name(self._pipeline, stage), replicas)
        self._on_desired(stage, replicas)

    async def replicas(self, stage: str) -> tuple[int, int]:
        desired, ready = await self._replicas(worker_name(self._pipeline, stage))
        self._on_desired(stage, desired)
        return desired, ready

    async def scale_routers(self, routers: int) -> None:
        await self._scale(router_name(self._pipeline), routers)

    async def routers(self) -> tuple[int, int]:
        return await self._replicas(router_name(self._pipeline))

    async def _scale(self, name: str, replicas: int) -> None:
        body = {"spec": {"replicas": replicas}}
        await asyncio.to_thread(
            self._api.patch, kube.DEPLOYMENTS, self._namespace, name, body, subresource="scale"
        )

    async def _replicas(self, name: str) -> tuple[int, int]:
        found = await asyncio.to_thread(self._api.get, kube.DEPLOYMENTS, self._namespace, name)
        if found is None:
            raise LookupError(f"Deployment {self._namespace}/{name} does not exist (yet)")
        desired = int((found.get("spec") or {}).get("replicas") or 0)
        ready = int((found.get("status") or {}).get("readyReplicas") or 0)
        return desired, ready


def attainment_query(namespace: str, pipeline: str, window: str = "5m") -> str:
    selector = pipeline_selector(namespace, pipeline)
    return (
        f"1 - sum(increase(sloline_slo_miss_total{{{selector}}}[{window}])) / "
        f"sum(increase(sloline_requests_total{{{selector}}}[{window}]))"
    )


def format_attainment(value: float) -> str | None:
    """`99.52%`, or None where there is no traffic (NaN) to measure."""
    if not math.isfinite(value):
        return None
    return f"{max(0.0, min(1.0, value)) * 100:.2f}%"


@dataclass(frozen=True, slots=True)
class DaemonContext:
    """What one pipeline's daemon needs; the handlers build it."""

    api: KubeApi
    settings: OperatorSettings
    metrics: OperatorMetrics
    namespace: str
    pipeline: str
    event: EventFn
    set_attainment: StatusFn
    get_json: GetJson = urllib_get_json
    clock: Callable[[], float] = time.monotonic


class TunerDaemon:
    """The loop of one pipeline's daemon; `step` is one tick (tests call it directly)."""

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx
        self._plan_text: str | None = None
        self._tuner: Tuner | None = None
        self._stages: list[str] = []
        self._last_attainment_s = -math.inf

    def _desired(self, stage: str, replicas: int) -> None:
        self.ctx.metrics.desired(self.ctx.namespace, self.ctx.pipeline, stage, replicas)

    def _rebuild(self, deployed: Mapping[str, str]) -> None:
        """A tuner for the deployed pipeline file and plan (they always belong together;
        the live spec may already be newer and still being profiled)."""
        ctx = self.ctx
        ctx.metrics.forget(ctx.namespace, ctx.pipeline, self._stages)
        plan_text = deployed.get("plan.json")
        self._plan_text, self._tuner, self._stages = plan_text, None, []
        if plan_text is None or "pipeline.yaml" not in deployed:
            return
        plan = Plan.from_dict(json.loads(plan_text))
        graph = parse_pipeline(yaml.safe_load(deployed["pipeline.yaml"]), "pipeline.yaml")
        stages, settings = tuning_for(plan, graph, ctx.settings)
        source = PrometheusSource(
            ctx.settings.prometheus_url,
            ctx.namespace,
            ctx.pipeline,
            windows_s=settings.windows_s,
            lookback_s=settings.envelope_lookback_s,
            lambda_window_s=settings.lambda_window_s,
            lambda_lookback_s=settings.lambda_lookback_s,
            lambda_rate_window_s=ctx.settings.tuner.lambda_rate_window_s,
            get_json=ctx.get_json,
        )
        actuator = DeploymentActuator(ctx.api, ctx.namespace, ctx.pipeline, self._desired)
        self._stages = [s.name for s in stages]
        self._tuner = Tuner(
            stages=stages,
            planning_envelope=plan.envelope,
            planning_rate_rps=plan.rate_rps,
            # The trace the plan was made for (the operator plans on the same workload):
            # the routers' envelopes sum, and are compared with it split as many ways.
            planning_sample_s=trace_for_workload(graph.pipeline.spec.workload),
            source=source,
            actuator=actuator,
            settings=settings,
            clock=ctx.clock,
            logger=_LOG,
            on_decision=self._decided(
                ctx.metrics.tuner.recorder(ctx.pipeline, self._stages, namespace=ctx.namespace)
            ),
            routers=router_tuning(
                plan,
                graph.pipeline.spec.stages,
                max_routers=ctx.settings.tuner.max_replicas,
                min_routers=ctx.settings.router.replicas,
            ),
            router_actuator=actuator,
        )
        _LOG.info("%s/%s: tuning %s", ctx.namespace, ctx.pipeline, self._stages)

    def _decided(self, record: Callable[[Decision], None]) -> Callable[[Decision], None]:
        def on_decision(decision: Decision) -> None:
            record(decision)
            direction = "up" if decision.is_scale_up else "down"
            self.ctx.event(
                "Normal",
                "ScaledUp" if direction == "up" else "ScaledDown",
                f"stage {decision.stage}: {decision.reason}",
            )

        return on_decision

    async def step(self) -> tuple[Decision, ...]:
        """Follow the deployed plan, run one tuner tick, refresh the attainment."""
        ctx = self.ctx
        found = await asyncio.to_thread(
            ctx.api.get, kube.CONFIG_MAPS, ctx.namespace, config_map_name(ctx.pipeline)
        )
        deployed: Mapping[str, str] = (found or {}).get("data") or {}
        if deployed.get("plan.json") != self._plan_text:
            self._rebuild(deployed)
        decisions: tuple[Decision, ...] = ()
        if self._tuner is not None:
            decisions = (await self._tuner.step()).decisions
        now = self.ctx.clock()
        if now - self._last_attainment_s >= ATTAINMENT_EVERY_S and await self._attainment():
            self._last_attainment_s = now
        return decisions

    async def _attainment(self) -> bool:
        """Write the attainment; False while Prometheus has no requests to measure."""
        ctx = self.ctx
        url = ctx.settings.prometheus_url.rstrip("/") + "/api/v1/query"
        body: Mapping[str, Any] = await asyncio.to_thread(
            ctx.get_json, url, {"query": attainment_query(ctx.namespace, ctx.pipeline)}
        )
        result = (body.get("data") or {}).get("result") or []
        text = format_attainment(float(result[0]["value"][1])) if result else None
        if text is None:
            return False
        await ctx.set_attainment(text)
        return True

    async def run(self, stopped: Any) -> None:
        """Tick every `tuner.intervalS` until kopf's `stopped` flag is set; a failed tick
        (Prometheus down, a Deployment not created yet) is logged and retried."""
        interval_s = self.ctx.settings.tuner.interval_s
        try:
            while not stopped:
                try:
                    await self.step()
                except Exception as exc:
                    _LOG.warning(
                        "%s/%s: tuner tick failed: %s", self.ctx.namespace, self.ctx.pipeline, exc
                    )
                await stopped.wait(interval_s)
        finally:
            self.ctx.metrics.forget(self.ctx.namespace, self.ctx.pipeline, self._stages)
