"""Reactive autoscalers that the InferLine tuner is compared with, as pure functions.

Each baseline is ``step(observation, state, settings) -> (targets, state)``: a frozen
:class:`~sloline.lab.loop.Observation` and the baseline's own frozen state in, one
target replica count per stage and the new state out — no clock, no I/O. Every constant
is a setting whose default is the system's documented default (sources below). Per-stage
autoscalers (HPA, Ray Serve, Knative) scale each stage as its own deployment; the
coarse-grained AutoScale baseline scales the whole pipeline as one unit (InferLine §6).

- **Kubernetes HPA** (kubernetes.io, "Horizontal Pod Autoscaling", algorithm details;
  autoscaling/v2 ``HPAScalingRules``): every ``--horizontal-pod-autoscaler-sync-period``
  (15 s), ``desired = ceil(ready · utilisation / target)``; no change while
  ``|utilisation / target - 1| <= 0.1`` (``--horizontal-pod-autoscaler-tolerance``); when
  scaling up, pods that are not ready yet count as 0 % used and the ratio is recomputed;
  scale-down takes the highest recommendation of the last 300 s (default
  ``scaleDown.stabilizationWindowSeconds``); scale-up is limited to max(+4 pods, +100 %)
  per 15 s (default ``scaleUp.policies``). Utilisation is the replicas' busy fraction over
  the last 15 s (metrics-server's default resolution); HPA has no default target, the 70 %
  here is the project's choice (docs/tuner.md).
- **Ray Serve** (``ray.serve.config.AutoscalingConfig`` defaults and
  ``ray/serve/autoscaling_policy.py``): ``desired = total ongoing / target_ongoing_requests``
  (2), with ``total`` the mean over ``look_back_period_s`` (30 s) of the ongoing requests
  (queued + running), refreshed every ``metrics_interval_s`` (10 s);
  ``ceil(current + smoothing_factor · (desired - current))`` (1.0); a decision is applied
  only after it was made in every control-loop period for ``upscale_delay_s`` (30 s) or
  ``downscale_delay_s`` (600 s). The control loop runs every simulator tick (Ray's runs
  every 0.1 s; the counters count periods of the tick instead).
- **Knative KPA** (knative.dev "Additional autoscaling configuration for Knative Pod
  Autoscaler", ``config-autoscaler`` defaults, ``pkg/autoscaler/scaling/autoscaler.go``):
  target ``container-concurrency-target-default`` (100) x
  ``container-concurrency-target-percentage`` (70 %) concurrent requests per pod; every
  ``tick-interval`` (2 s) the desired pods are ``ceil(mean concurrency / target)`` over the
  60 s stable window, or over the 6 s panic window (10 % of it) while panicking; panic
  starts when the panic-window pods reach ``panic-threshold-percentage`` (200 %) of the
  ready pods, never scales down, and ends after a stable window without a reason to
  panic; per tick at most x1000 up (``max-scale-up-rate``) and /2 down
  (``max-scale-down-rate``).
- **AutoScale** (Gandhi, Harchol-Balter, Raghunathan, Kozuch, ACM TOCS 30(4), 2012), the
  coarse-grained tuning of InferLine §6: the pipeline is replicated as one unit; scale-up
  from the number of requests in the system, ``k = ceil(n_sys / p)`` units, with the
  packing factor ``p`` (requests one unit holds while still meeting the SLO, profiled
  offline: :func:`packing_factor`); scale-down only by turning off a unit after it has
  been idle for ``t_wait`` (120 s in the paper), with index-packing dispatch so that the
  excess units go idle (the simulator dispatches lowest replica slot first for it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from sloline.common.trace import gamma_arrivals
from sloline.lab.loop import Observation, StageView, Targets
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload, estimate
from sloline.planner.planner import InfeasibleError
from sloline.planner.problem import PlanningProblem

__all__ = [
    "AutoScaleSettings",
    "HpaSettings",
    "HpaStage",
    "KpaSettings",
    "KpaStage",
    "RaySettings",
    "RayStage",
    "autoscale_step",
    "hpa_recommendation",
    "hpa_step",
    "kpa_step",
    "packing_factor",
    "ray_step",
]

_EPS = 1e-9


def _clamp(value: int, low: int, high: int) -> int:
    return min(max(value, low), high)


def _window(
    samples: tuple[tuple[float, float], ...], now_s: float, window_s: float
) -> tuple[tuple[float, float], ...]:
    """Samples taken in (now - window, now]."""
    return tuple(s for s in samples if s[0] > now_s - window_s + _EPS)


def _mean(samples: tuple[tuple[float, float], ...]) -> float:
    return sum(v for _, v in samples) / len(samples) if samples else 0.0


# -- Kubernetes HPA -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HpaSettings:
    """Kubernetes HPA constants (autoscaling/v2 defaults; the 70 % target is ours)."""

    target_utilisation: float = 0.7
    sync_period_s: float = 15.0
    tolerance: float = 0.1
    metric_window_s: float = 15.0
    downscale_stabilisation_s: float = 300.0
    scale_up_pods: int = 4
    scale_up_percent: float = 100.0
    scale_up_period_s: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 256


@dataclass(frozen=True, slots=True)
class HpaStage:
    """One HPA's memory: utilisation samples (time, busy s, ready s), recommendations
    (time, replicas), scale-ups (time, replicas added) and the last sync."""

    samples: tuple[tuple[float, float, float], ...] = ()
    recommendations: tuple[tuple[float, int], ...] = ()
    scale_ups: tuple[tuple[float, int], ...] = ()
    last_sync_s: float = 0.0


def hpa_recommendation(
    utilisation: float, ready: int, starting: int, current: int, settings: HpaSettings
) -> int:
    """The replica calculator: ``ceil(pods · utilisation / target)`` with the tolerance
    band and the not-yet-ready pods counted at 0 % when scaling up; ``current`` when
    nothing changes."""
    if ready == 0:
        return current
    ratio = utilisation / settings.target_utilisation
    if abs(ratio - 1.0) <= settings.tolerance:
        return current
    pods = ready
    new_ratio = ratio
    if ratio > 1.0 and starting > 0:
        pods = ready + starting
        new_ratio = utilisation * ready / (settings.target_utilisation * pods)
        if abs(new_ratio - 1.0) <= settings.tolerance or new_ratio < 1.0:
            return current
    replicas = math.ceil(new_ratio * pods - _EPS)
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return current
    return replicas


def hpa_step(
    view: StageView, now_s: float, state: HpaStage, settings: HpaSettings
) -> tuple[int, HpaStage]:
    """One tick of one stage's HPA: collect the sample; every sync period recommend,
    stabilise (max over the scale-down window) and rate-limit the scale-up."""
    kept = [s for s in state.samples if s[0] > now_s - settings.metric_window_s + _EPS]
    samples = (*kept, (now_s, view.busy_replica_s, view.ready_replica_s))
    state = replace(state, samples=samples)
    if now_s - state.last_sync_s < settings.sync_period_s - _EPS:
        return view.desired, state
    busy = sum(s[1] for s in samples)
    ready_s = sum(s[2] for s in samples)
    utilisation = busy / ready_s if ready_s > 0.0 else 0.0
    current = view.desired
    wanted = hpa_recommendation(utilisation, view.ready, view.starting, current, settings)
    recent = tuple(
        r for r in state.recommendations if r[0] > now_s - settings.downscale_stabilisation_s
    )
    down_limit = max([wanted, *(r[1] for r in recent)])
    target = wanted if wanted > current else min(current, down_limit)
    ups = tuple(u for u in state.scale_ups if u[0] > now_s - settings.scale_up_period_s)
    start = current - sum(u[1] for u in ups)
    up_limit = max(
        start + settings.scale_up_pods,
        math.ceil(start * (1.0 + settings.scale_up_percent / 100.0) - _EPS),
    )
    target = _clamp(min(target, up_limit), settings.min_replicas, settings.max_replicas)
    if target > current:
        ups += ((now_s, target - current),)
    return target, HpaStage(samples, (*recent, (now_s, wanted)), ups, now_s)


# -- Ray Serve ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RaySettings:
    """Ray Serve ``AutoscalingConfig`` defaults."""

    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    metrics_interval_s: float = 10.0
    smoothing_factor: float = 1.0
    min_replicas: int = 1
    max_replicas: int = 256


@dataclass(frozen=True, slots=True)
class RayStage:
    """One deployment's memory: ongoing-request samples, the metric as last reported to
    the controller (None before the first report) and the decision counter."""

    samples: tuple[tuple[float, float], ...] = ()
    reported: float | None = None
    counter: int = 0


def ray_step(
    view: StageView, now_s: float, tick_s: float, state: RayStage, settings: RaySettings
) -> tuple[int, RayStage]:
    """One control-loop period of ``replica_queue_length_autoscaling_policy`` with the
    default parameters applied (scaling factor, bounds, delay counters)."""
    samples = (
        *_window(state.samples, now_s, settings.look_back_period_s),
        (now_s, view.mean_ongoing),
    )
    reported = state.reported
    pushes = now_s / settings.metrics_interval_s
    if abs(pushes - round(pushes)) < _EPS * max(1.0, pushes):
        reported = _mean(samples)
    target = view.desired
    if reported is None or view.ready == 0:
        return target, RayStage(samples, reported, state.counter)
    running = view.ready
    desired = reported / settings.target_ongoing_requests
    scaled = math.ceil(running + settings.smoothing_factor * (desired - running) - _EPS)
    if math.ceil(desired - _EPS) < running and scaled == running:
        scaled -= 1
    bounded = _clamp(scaled, settings.min_replicas, settings.max_replicas)
    counter = state.counter
    decision = target
    if bounded > target:
        counter = max(counter, 0) + 1
        if counter > int(settings.upscale_delay_s / tick_s + _EPS):
            counter, decision = 0, bounded
    elif bounded < target:
        counter = min(counter, 0) - 1
        if counter < -int(settings.downscale_delay_s / tick_s + _EPS):
            counter, decision = 0, max(1, bounded)
    else:
        counter = 0
    return decision, RayStage(samples, reported, counter)


# -- Knative KPA ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KpaSettings:
    """Knative ``config-autoscaler`` defaults."""

    container_concurrency_target_default: float = 100.0
    container_concurrency_target_percentage: float = 70.0
    stable_window_s: float = 60.0
    panic_window_percentage: float = 10.0
    panic_threshold_percentage: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    tick_interval_s: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 256

    @property
    def target(self) -> float:
        """Target concurrent requests per pod (70 by default)."""
        return (
            self.container_concurrency_target_default
            * self.container_concurrency_target_percentage
            / 100.0
        )


@dataclass(frozen=True, slots=True)
class KpaStage:
    """One revision's autoscaler memory: concurrency samples, when it last entered or
    extended panic (None: stable mode), the most pods asked for in this panic, last tick."""

    samples: tuple[tuple[float, float], ...] = ()
    panic_s: float | None = None
    max_panic_pods: int = 0
    last_tick_s: float = 0.0


def kpa_step(
    view: StageView, now_s: float, state: KpaStage, settings: KpaSettings
) -> tuple[int, KpaStage]:
    """One tick of the KPA decider (``autoscaler.Scale``): stable and panic windows."""
    samples = (*_window(state.samples, now_s, settings.stable_window_s), (now_s, view.mean_ongoing))
    if now_s - state.last_tick_s < settings.tick_interval_s - _EPS:
        return view.desired, replace(state, samples=samples)
    panic_window = settings.stable_window_s * settings.panic_window_percentage / 100.0
    stable = _mean(samples)
    panic = _mean(_window(samples, now_s, panic_window))
    ready = float(max(1, view.ready))
    max_up = math.ceil(settings.max_scale_up_rate * ready)
    max_down = math.floor(ready / settings.max_scale_down_rate)
    stable_pods = math.ceil(stable / settings.target - _EPS)
    panic_pods = math.ceil(panic / settings.target - _EPS)
    want_stable = _clamp(stable_pods, max_down, max_up)
    want_panic = _clamp(panic_pods, max_down, max_up)
    over = panic_pods / ready >= settings.panic_threshold_percentage / 100.0
    panic_s, max_panic = state.panic_s, state.max_panic_pods
    if over:
        panic_s = now_s
    elif panic_s is not None and panic_s + settings.stable_window_s < now_s:
        panic_s, max_panic = None, 0
    desired = want_stable
    if panic_s is not None:  # never scale down while panicking
        max_panic = max(max_panic, want_stable, want_panic)
        desired = max_panic
    target = _clamp(desired, settings.min_replicas, settings.max_replicas)
    return target, KpaStage(samples, panic_s, max_panic, now_s)


# -- AutoScale (coarse-grained) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AutoScaleSettings:
    """AutoScale constants: the packing factor p (see :func:`packing_factor`) and the idle
    timeout before a unit is turned off."""

    packing_factor: float
    t_wait_s: float = 120.0
    min_units: int = 1
    max_units: int = 256

    def __post_init__(self) -> None:
        if not (math.isfinite(self.packing_factor) and self.packing_factor > 0.0):
            raise ValueError(f"packing factor must be > 0 requests, got {self.packing_factor!r}")


def autoscale_step(observation: Observation, settings: AutoScaleSettings) -> Targets:
    """Units for the whole pipeline: ``ceil(n_sys / p)`` if more than it has, else minus
    the units whose replicas have all been idle for ``t_wait``; every stage gets the
    same count (the unit is the whole pipeline). Stateless."""
    units = max(v.desired for v in observation.stages)
    needed = math.ceil(observation.mean_in_system / settings.packing_factor - _EPS)
    if needed > units:
        target = min(needed, settings.max_units)
    else:
        idle = min(
            sum(1 for s in v.idle_for_s if s >= settings.t_wait_s - _EPS)
            for v in observation.stages
        )
        target = max(settings.min_units, units - idle)
    return (target,) * len(observation.stages)


def packing_factor(
    problem: PlanningProblem,
    hardware: str,
    max_batch: int,
    *,
    queries: int = 6000,
    iterations: int = 30,
) -> float:
    """AutoScale's p for one coarse-grained unit (every stage on ``hardware`` at
    ``max_batch``, one replica each), profiled offline as AutoScale prescribes: the
    number of requests in the system at the highest load the unit serves within the SLO.

    The highest rate is bisected with the estimator on Poisson arrivals (one unit-rate
    trace of ``queries`` arrivals, rescaled per rate, so the search is monotone); p is that
    rate times the mean latency there (Little's law)."""
    topology = problem.topology
    config = tuple(StageConfig(hardware, max_batch, 1) for _ in topology.stages)
    capacity = min(
        problem.stage_profile(name, hardware).throughput_rps(max_batch)
        / max(problem.profile.scale_factors[name], _EPS)
        for name in topology.stages
    )
    unit = gamma_arrivals(1.0, float(queries), seed=problem.seed)

    def latencies(rate: float) -> npt.NDArray[np.float64]:
        workload = Workload.build(topology, problem.profile, unit / rate, seed=problem.seed)
        result = estimate(
            topology, problem.profile, config, workload, service=problem.service, seed=problem.seed
        )
        return result.latencies_s

    def meets(rate: float) -> bool:
        tail = np.percentile(latencies(rate), problem.percentile, method="inverted_cdf")
        return bool(tail <= problem.slo_s)

    low, high = capacity * 1e-3, capacity
    if not meets(low):
        raise InfeasibleError(
            "NoPackingFactor",
            f"one coarse-grained unit on {hardware!r} at batch {max_batch} misses the SLO "
            "even at a trickle of load; AutoScale has no packing factor for it",
        )
    for _ in range(iterations):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if meets(mid) else (low, mid)
    return float(low * np.mean(latencies(low)))
