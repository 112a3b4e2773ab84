"""Where the tuner's inputs come from and where its decisions go: the I/O edge (§5).

The pure policy (:mod:`sloline.tuner.policy`) needs an observed traffic envelope, recent
arrival rates and replica counts. A :class:`MetricSource` supplies the first two —
:class:`StreamingSource` from the router's in-process :class:`StreamingEnvelope`
(embedded ``sloline run``, simulator), :class:`PrometheusSource` from the router's gauges
(Kubernetes). An :class:`Actuator` (a backend: local processes, Deployments) reports and
sets replica counts; a :class:`RouterActuator` (where the backend can change it: the
router Deployment on Kubernetes) the router count. :class:`Tuner` is the thin async loop
that joins them: observe, build a :class:`TunerContext`, call :func:`decide`, apply, log
each decision's reason.

Prometheus series read (exported by the router; every query selects the pipeline's
``namespace``, the scrape's target label on Kubernetes, as well as its ``pipeline``):

- ``sloline_arrival_envelope_requests_per_second{pipeline, window}``: gauge, max arrival
  rate per window over the router's recent look-back, and
  ``sloline_arrival_envelope_window_seconds{pipeline, window}``, each window's size
  (``window`` is the window's index, ``"0"`` the shortest);
- ``sloline_requests_total{pipeline, code}``: counter of all requests, any outcome;
- ``sloline_stage_replicas{pipeline, stage, state="desired|ready"}``: gauge.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy.typing as npt

from sloline.common.envelope import Envelope, StreamingEnvelope
from sloline.tuner.policy import (
    Decision,
    RouterState,
    StageState,
    TunerContext,
    TunerOutcome,
    TunerSettings,
    decide,
    effective_rates,
    effective_rhos,
)
from sloline.tuner.reference import PlanningReference

if TYPE_CHECKING:
    from sloline.planner.plan import Plan
    from sloline.spec.models import StageSpec

__all__ = [
    "Actuator",
    "GetJson",
    "MetricSnapshot",
    "MetricSource",
    "PrometheusError",
    "PrometheusSource",
    "RouterActuator",
    "RouterTuning",
    "StageTuning",
    "StreamingSource",
    "Tuner",
    "device_caps",
    "pipeline_selector",
    "router_tuning",
    "stage_tunings",
    "urllib_get_json",
]

_LOG = logging.getLogger(__name__)
_MATCH_TOL = 1e-4  # window sizes pass through Prometheus' float formatting

GetJson = Callable[[str, Mapping[str, str]], Mapping[str, Any]]
"""``get_json(url, params) -> decoded JSON body``: the injectable HTTP GET."""


@dataclass(frozen=True, slots=True)
class MetricSnapshot:
    """What a metric source saw: the observed envelope, λ series, ready replicas."""

    observed_envelope: Envelope
    recent_lambdas_rps: tuple[float, ...]
    """Rates of the recent λ windows (5 s each over the last 30 s), oldest first."""
    ready_replicas: Mapping[str, int] = field(default_factory=dict)
    """Ready replicas per stage where the source knows them (the :class:`Tuner` uses the
    actuator's counts, which do not lag a scrape; this is for status and dashboards)."""
    streams: int = 1
    """How many routers' envelopes ``observed_envelope`` sums (1: one process saw every
    arrival); the :class:`Tuner` compares it with the planning trace split as many ways
    (:mod:`sloline.tuner.reference`)."""


class MetricSource(Protocol):
    """Supplies observations of the live arrival process (§5)."""

    async def observe(self, now_s: float) -> MetricSnapshot:
        """Observe at ``now_s`` (the tuner's monotonic clock)."""
        ...


class Actuator(Protocol):
    """Reads and sets a stage's replica count (a backend: processes or Deployments)."""

    async def scale(self, stage: str, replicas: int) -> None:
        """Set the desired replica count of ``stage``."""
        ...

    async def replicas(self, stage: str) -> tuple[int, int]:
        """``(desired, ready)`` replicas of ``stage``."""
        ...


class RouterActuator(Protocol):
    """Reads and sets how many routers serve the pipeline (a backend that can change it)."""

    async def scale_routers(self, routers: int) -> None:
        """Set the desired router count."""
        ...

    async def routers(self) -> tuple[int, int]:
        """``(desired, ready)`` routers."""
        ...


class StreamingSource:
    """Observations from an in-process :class:`StreamingEnvelope` (embedded mode), which
    sees every arrival of the pipeline (one stream).

    ``delay_s``: arrivals reach the envelope up to this late (router 0 merges the other
    routers' arrivals in time order after a hold), so it is read as of ``now - delay_s``,
    where its λ windows are complete. Call it on the event loop that feeds the envelope:
    the envelope is not thread-safe.
    """

    def __init__(
        self, envelope: StreamingEnvelope, *, lookback_s: float | None = None, delay_s: float = 0.0
    ) -> None:
        self._envelope = envelope
        self._lookback_s = lookback_s
        self._delay_s = delay_s

    async def observe(self, now_s: float) -> MetricSnapshot:
        """The envelope over the look-back and the completed λ windows at ``now_s``."""
        at_s = now_s - self._delay_s
        return MetricSnapshot(
            self._envelope.envelope(at_s, self._lookback_s), self._envelope.lambdas(at_s)
        )


class PrometheusError(RuntimeError):
    """Prometheus answered with an error or an unexpected body."""


def urllib_get_json(url: str, params: Mapping[str, str], timeout_s: float = 5.0) -> Any:
    """GET ``url?params`` and decode the JSON body (stdlib only; blocking)."""
    if urllib.parse.urlsplit(url).scheme not in {"http", "https"}:
        raise ValueError(f"Prometheus URL must be http(s)://..., got {url!r}")
    query = urllib.parse.urlencode(dict(params))
    # The scheme is checked above, so urlopen cannot be pointed at file:// and the like.
    with urllib.request.urlopen(f"{url}?{query}", timeout=timeout_s) as response:
        return json.load(response)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def pipeline_selector(namespace: str, pipeline: str) -> str:
    """The PromQL label matchers of one pipeline's series: its namespace and its name
    (pipelines of the same name in two namespaces are two pipelines)."""
    return f'namespace="{_label(namespace)}", pipeline="{_label(pipeline)}"'


def _duration(seconds: float) -> str:
    millis = max(1, round(seconds * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


class PrometheusSource:
    """Observations from a Prometheus server's HTTP API (``/api/v1/query``), §5.

    - envelope: ``max_over_time(sloline_arrival_envelope_requests_per_second{namespace,
      pipeline}[lookback])``, one series per router and window, summed per window here;
      the routers that saw arrivals are the snapshot's ``streams`` (the sum is compared
      with the planning trace split as many ways, :mod:`sloline.tuner.reference`); and
      each window's size, ``max by (window)
      (sloline_arrival_envelope_window_seconds{namespace, pipeline})``;
    - λ series: ``sum(rate(sloline_requests_total{namespace, pipeline}[rate_window]))
      [lambda_lookback:lambda_window]`` — one value per λ window. ``rate`` needs two
      samples in ``rate_window``: scrape the router at least every ``rate_window / 2``
      (1 s scrapes for the 5 s default) or pass a longer ``lambda_rate_window_s``;
    - ready replicas: ``max by (stage) (sloline_stage_replicas{namespace, pipeline,
      state="ready"})``.

    ``get_json`` is the HTTP client (blocking; run in a worker thread), injectable for
    tests. A window the router does not export reads as 0 rps; if the router exports
    windows but none of ``windows_s``, the window bases disagree and ``observe`` raises.
    """

    def __init__(
        self,
        base_url: str,
        namespace: str,
        pipeline: str,
        *,
        windows_s: Sequence[float],
        lookback_s: float = 60.0,
        lambda_window_s: float = 5.0,
        lambda_lookback_s: float = 30.0,
        lambda_rate_window_s: float | None = None,
        get_json: GetJson = urllib_get_json,
    ) -> None:
        self._url = base_url.rstrip("/") + "/api/v1/query"
        self._windows_s = tuple(float(w) for w in windows_s)
        self._get_json = get_json
        selector = pipeline_selector(namespace, pipeline)
        rate_window = lambda_window_s if lambda_rate_window_s is None else lambda_rate_window_s
        self.envelope_query = (
            "max_over_time("
            f"sloline_arrival_envelope_requests_per_second{{{selector}}}"
            f"[{_duration(lookback_s)}])"
        )
        self.windows_query = (
            f"max by (window) (sloline_arrival_envelope_window_seconds{{{selector}}})"
        )
        self.lambda_query = (
            f"sum(rate(sloline_requests_total{{{selector}}}[{_duration(rate_window)}]))"
            f"[{_duration(lambda_lookback_s)}:{_duration(lambda_window_s)}]"
        )
        self.ready_query = f'max by (stage) (sloline_stage_replicas{{{selector}, state="ready"}})'

    async def observe(self, now_s: float) -> MetricSnapshot:
        """Run the four queries (Prometheus evaluates them at its own current time)."""
        del now_s  # Prometheus time is wall-clock; the tuner's clock is monotonic
        envelope, windows, lambdas, ready = await asyncio.gather(
            asyncio.to_thread(self._query, self.envelope_query),
            asyncio.to_thread(self._query, self.windows_query),
            asyncio.to_thread(self._query, self.lambda_query),
            asyncio.to_thread(self._query, self.ready_query),
        )
        observed, streams = self._envelope(envelope, windows)
        return MetricSnapshot(
            observed,
            self._lambdas(lambdas),
            {s["metric"].get("stage", ""): int(float(s["value"][1])) for s in ready},
            streams=max(1, streams),
        )

    def _query(self, promql: str) -> list[dict[str, Any]]:
        body = self._get_json(self._url, {"query": promql})
        if body.get("status") != "success":
            raise PrometheusError(
                f"Prometheus query failed ({body.get('errorType', 'unknown')}): "
                f"{body.get('error', body)}; query: {promql}"
            )
        try:
            result: list[dict[str, Any]] = body["data"]["result"]
        except (KeyError, TypeError) as exc:
            raise PrometheusError(f"unexpected Prometheus response to {promql}: {body}") from exc
        return result

    def _envelope(
        self, series: list[dict[str, Any]], windows: list[dict[str, Any]]
    ) -> tuple[Envelope, int]:
        """The routers' envelopes summed per window, and how many routers saw arrivals
        (a router is a series' labels other than ``window``)."""
        rates = [0.0] * len(self._windows_s)
        sizes = {s["metric"].get("window", ""): float(s["value"][1]) for s in windows}
        exported = sorted(sizes.values())
        routers: set[tuple[tuple[str, str], ...]] = set()
        for item in series:
            labels = dict(item["metric"])
            window = sizes.get(labels.pop("window", ""))
            if window is None:  # its size is no longer exported: a window of an old plan
                continue
            rate = _finite(item["value"][1])
            for i, ours in enumerate(self._windows_s):
                if math.isclose(window, ours, rel_tol=_MATCH_TOL):
                    rates[i] += rate
                    if rate > 0.0:
                        routers.add(tuple(sorted(labels.items())))
        if exported and not any(
            math.isclose(w, ours, rel_tol=_MATCH_TOL) for w in exported for ours in self._windows_s
        ):
            raise ValueError(
                f"the router exports envelope windows {exported} but the tuner "
                f"expects {self._windows_s}; both must use the plan's window base T_s"
            )
        return Envelope(self._windows_s, tuple(rates)), len(routers)

    @staticmethod
    def _lambdas(series: list[dict[str, Any]]) -> tuple[float, ...]:
        if not series:
            return ()
        return tuple(_finite(value) for _, value in series[0]["values"])


def _finite(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) and value > 0.0 else 0.0


@dataclass(frozen=True, slots=True)
class StageTuning:
    """A stage's tuning parameters from the plan (§5 Initialization)."""

    name: str
    min_replicas: int
    max_replicas: int
    scale_factor: float
    throughput_rps: float
    max_provisioning_ratio: float


def stage_tunings(
    plan: Plan,
    stages: Sequence[StageSpec],
    *,
    max_replicas: int,
    pinned: Collection[str] = (),
) -> list[StageTuning]:
    """Per-stage tuning parameters from the plan, for the embedded and Kubernetes tuners
    alike: stages whose replicas the spec (or `pinned`) fixes are left alone; bounds are
    the spec's min/max replicas, else 1 and `max_replicas`, and on a class with a device
    bound no more than :func:`device_caps` allows; rho_m and mu_m are made effective for
    stages planned at their floor."""
    spec = {s.name: s for s in stages}
    devices = device_caps(plan)
    floors = [spec[s.name].min_replicas or 1 for s in plan.stages]
    at_floor = [s.replicas <= floor for s, floor in zip(plan.stages, floors, strict=True)]
    rhos, mus = effective_rates(plan.stages, at_floor)
    return [
        StageTuning(
            name=s.name,
            min_replicas=floor,
            max_replicas=min(
                spec[s.name].max_replicas or max_replicas, devices.get(s.name, max_replicas)
            ),
            scale_factor=s.scale_factor,
            throughput_rps=mu,
            max_provisioning_ratio=rho,
        )
        for s, floor, rho, mu in zip(plan.stages, floors, rhos, mus, strict=True)
        if s.name not in pinned and spec[s.name].replicas is None
    ]


def device_caps(plan: Plan) -> dict[str, int]:
    """The most replicas the tuner may give each stage on a class with a device bound
    (``plan.devices``): its planned replicas and its share of the devices the plan leaves
    free on the class. A stage alone on its class may take all the class's devices; the
    stages that share a class split the free ones evenly (earlier stages get the
    remainder), so that, each scaled on its own, together they never hold more replicas
    than the class has devices."""
    caps: dict[str, int] = {}
    for hw, devices in plan.devices.items():
        sharing = [s for s in plan.stages if s.hardware == hw]
        free = max(0, devices - sum(s.replicas for s in sharing))
        for i, s in enumerate(sharing):
            caps[s.name] = s.replicas + free // len(sharing) + (i < free % len(sharing))
    return caps


@dataclass(frozen=True, slots=True)
class RouterTuning:
    """The routers' tuning parameters from the plan: bounds, μ_router and their rho."""

    min_routers: int
    max_routers: int
    throughput_rps: float
    max_provisioning_ratio: float


def router_tuning(
    plan: Plan, stages: Sequence[StageSpec], *, max_routers: int, min_routers: int = 1
) -> RouterTuning | None:
    """The routers' tuning parameters from the plan, or None where the plan does not
    model the router's CPU (no μ_router). Bounds: ``min_routers`` and ``max_routers``
    (at least the planned count). A plan at one router left them at their floor, and
    their rho is made effective as a floor stage's (:func:`effective_rhos`, beside the stages')."""
    if plan.router_throughput_rps <= 0.0:
        return None
    spec = {s.name: s for s in stages}
    floors = [spec[s.name].min_replicas or 1 for s in plan.stages]
    rhos = effective_rhos(
        [*(s.rho for s in plan.stages), plan.router_rho],
        [*(s.replicas <= f for s, f in zip(plan.stages, floors, strict=True)), plan.routers <= 1],
    )
    top = max(max_routers, plan.routers, min_routers)
    return RouterTuning(min_routers, top, plan.router_throughput_rps, rhos[-1])


class Tuner:
    """The live loop: every ``settings.interval_s`` observe, :func:`decide`, apply (§5).

    All policy lives in :func:`decide`; this shell owns the only state (the last-change
    time), the clock and the I/O. The plan's deployment counts as the first change, so
    nothing scales down in the first ``stabilization_s``. With ``routers`` and a
    ``router_actuator`` it scales the routers too. ``on_decision`` is called with each
    applied stage decision (e.g. :meth:`TunerMetrics.recorder
    <sloline.serving.metrics.TunerMetrics.recorder>`, the decisions counter).

    ``planning_sample_s``, the planning trace, is needed where the source sums several
    routers' envelopes (:class:`PrometheusSource`): each tick compares the observation
    with the trace split as many ways as it sums (:mod:`sloline.tuner.reference`).
    """

    def __init__(
        self,
        *,
        stages: Sequence[StageTuning],
        planning_envelope: Envelope,
        planning_rate_rps: float | None = None,
        planning_sample_s: npt.ArrayLike | None = None,
        source: MetricSource,
        actuator: Actuator,
        settings: TunerSettings,
        clock: Callable[[], float] = time.monotonic,
        last_change_s: float | None = None,
        logger: logging.Logger = _LOG,
        on_decision: Callable[[Decision], None] | None = None,
        routers: RouterTuning | None = None,
        router_actuator: RouterActuator | None = None,
    ) -> None:
        self._stages = tuple(stages)
        self._routers = routers
        self._router_actuator = router_actuator
        self._planning = PlanningReference(planning_envelope, planning_sample_s)
        self._planning_rate_rps = planning_rate_rps
        self._source = source
        self._actuator = actuator
        self._settings = settings
        self._clock = clock
        self._log = logger
        self._on_decision = on_decision
        self.last_change_s = clock() if last_change_s is None else last_change_s
        self.history: collections.deque[tuple[float, Decision]] = collections.deque(maxlen=50)

    def adopt(
        self,
        stages: Sequence[StageTuning],
        planning_envelope: Envelope,
        planning_rate_rps: float | None,
        routers: RouterTuning | None = None,
    ) -> None:
        """Tune a new plan from now on (a re-plan: :mod:`sloline.tuner.replan`, embedded,
        where one envelope sees every arrival), its routers with ``routers`` (None: not
        tuned); adopting it is a change, so nothing scales down in the next
        ``stabilization_s``."""
        self._stages = tuple(stages)
        self._routers = routers
        self._planning = PlanningReference(planning_envelope)
        self._planning_rate_rps = planning_rate_rps
        self.last_change_s = self._clock()

    async def step(self) -> TunerOutcome:
        """One tick: observe, decide, apply the decisions, log their reasons."""
        now_s = self._clock()
        observation = await self._source.observe(now_s)
        states = []
        for plan in self._stages:
            desired, ready = await self._actuator.replicas(plan.name)
            states.append(
                StageState(
                    plan.name,
                    desired,
                    ready,
                    plan.min_replicas,
                    plan.max_replicas,
                    plan.scale_factor,
                    plan.throughput_rps,
                    plan.max_provisioning_ratio,
                )
            )
        context = TunerContext(
            now_s=now_s,
            stages=tuple(states),
            planning_envelope=self._planning.for_streams(observation.streams),
            observed_envelope=observation.observed_envelope,
            recent_lambdas_rps=observation.recent_lambdas_rps,
            last_change_s=self.last_change_s,
            planning_rate_rps=self._planning_rate_rps,
            routers=await self._router_state(),
        )
        outcome = decide(context, self._settings)
        for decision in outcome.decisions:
            self._log.info("tuner: stage %s: %s", decision.stage, decision.reason)
            self.history.append((now_s, decision))
            await self._actuator.scale(decision.stage, decision.to_replicas)
            if self._on_decision is not None:
                self._on_decision(decision)
        if outcome.routers is not None and self._router_actuator is not None:
            self._log.info("tuner: routers: %s", outcome.routers.reason)
            self.history.append((now_s, outcome.routers))
            await self._router_actuator.scale_routers(outcome.routers.to_replicas)
        self.last_change_s = outcome.last_change_s
        return outcome

    async def _router_state(self) -> RouterState | None:
        tuning, actuator = self._routers, self._router_actuator
        if tuning is None or actuator is None:
            return None
        desired, ready = await actuator.routers()
        return RouterState(
            desired,
            ready,
            tuning.min_routers,
            tuning.max_routers,
            tuning.throughput_rps,
            tuning.max_provisioning_ratio,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Tick on a fixed cadence until ``stop`` is set; a failed tick is logged, not fatal."""
        next_s = self._clock()
        while not stop.is_set():
            try:
                await self.step()
            except Exception:
                self._log.exception(
                    "tuner: tick failed; retrying in %g s", self._settings.interval_s
                )
            next_s = max(next_s + self._settings.interval_s, self._clock())
            try:
                await asyncio.wait_for(stop.wait(), timeout=next_s - self._clock())
            except TimeoutError:
                continue
