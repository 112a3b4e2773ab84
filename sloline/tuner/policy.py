"""InferLine's reactive tuning policy as pure functions (§5, Algorithms 3 and 4).

The tuner keeps the pipeline provisioned for the live arrival process between plans.
:func:`decide` takes a frozen :class:`TunerContext` (the time ``now_s``, every stage's
replica counts and tuning parameters from the plan, the planning and observed traffic
envelopes, the planning trace's mean rate, recent arrival rates, the time of the last
scaling change) plus :class:`TunerSettings` and returns the scaling decisions and the new
last-change time. It does no I/O and reads no clock, so the live loop
(:class:`sloline.tuner.sources.Tuner`) and a simulator with simulated time call the very
same function.

- **Scale up, Algorithm 3.** Every stage gets k_m = ceil(r · s_m / (mu_m · rho_m))
  replicas if it has fewer, with r the load the observed envelope shows
  (:func:`estimate_load`).
- **Scale down, Algorithm 4.** Only once more than ``stabilization_s`` (15 s) has passed
  since the last change: every stage keeps k_m = ceil(λ_new · s_m / (mu_m · rho_min))
  replicas, λ_new read from the largest 5 s rate of the last 30 s, rho_min the smallest
  rho_m of the pipeline.
- **Which r and λ_new** (:mod:`sloline.tuner.load_estimate`). §5 takes r = r_max, the
  largest observed rate among the windows that exceed the planning envelope, and compares
  it with rho_m, a utilisation at the planning trace's *mean* rate: a short-window peak is
  provisioned as if it were a sustained mean. By default r is instead the mean rate a
  stream with the planning trace's burstiness would need to reach the observed envelope
  (a Gaussian envelope read window by window), and λ_new likewise; ``literal=True``
  gives §5's reading, kept for comparison.
- A stage the planner left at its replica floor (a cheap parser at 1 replica) has a tiny
  rho_m that expresses no chosen slack; taken literally it makes Alg. 3 scale that stage
  in proportion to the rate and Alg. 4's rho_min ~ 0 blocks every scale-down. Such a
  stage gets an effective rho (:func:`effective_rhos`): the smallest rho among stages
  with planned slack, or the pipeline's largest rho when every stage is at its floor.
- mu_m counts full batches and no hop, so a fast stage at batch 1 (1.2 ms of work, a
  0.8 ms hop) serves 1.6x less than mu_m says; with a rho alone a floor stage like it
  stayed at one replica through a 4x flash crowd and queued every query. A floor stage
  also gets an effective mu (:func:`effective_throughputs`) from its estimated busy
  fraction U_m at the planned rate, which counts the hop: it scales so as to stay no
  busier than the least busy stage with planned slack, and never faster than the load.

Choices where §5 is silent or loose (also in docs/tuner.md):

- Replica counts compare against the *desired* count: replicas still starting are already
  paid for and will serve, so counting only ready ones would scale up twice.
- Alg. 3 scales a stage up whenever it has fewer replicas than the load demands, not only
  when the observed envelope exceeds the planning one: after Alg. 4 went below the plan,
  traffic that comes back towards the planned rate is provisioned for again.
- Any change, up or down, restarts the stabilisation delay (the §5 text says "after any
  configuration changes"; Alg. 4's pseudo-code only shows scale-up setting LastUpdate).
  At most one decision per stage per tick; a tick with a scale-up does no scale-down.
- Targets are clamped to [min_replicas, max_replicas]; a desired count outside the
  bounds is corrected at once. k_m is >= 1 whenever its rate is > 0 and s_m > 0, so a
  stage with traffic never drops to 0; it reaches 0 only if min_replicas is 0 and no
  request arrived in the λ look-back. A stage at 0 replicas is woken up to at least 1 as
  soon as any arrival shows in the observed envelope, even below the planning envelope.
- Scale-down waits for a full λ look-back of evidence (6 windows of 5 s) and, by default,
  never goes below what Algorithm 3 currently demands (``down_respects_up_demand``):
  otherwise a burstier-than-planned workload makes Alg. 3 and Alg. 4 flap every 15 s.

**Routers** (:class:`RouterState`, where the plan models the router's CPU and the backend
can change the count) are scaled from the same load estimate as a stage that every query
visits once (s = 1), with the plan's μ_router and the routers' own rho: up as Algorithm
3, down as Algorithm 4 but with their own rho rather than the stages' rho_min; their
decision (:func:`scale_routers`) comes beside the stages' in the same tick.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sloline.common.envelope import Envelope, window_sizes
from sloline.tuner.load_estimate import (
    Exceedance,
    LoadEstimate,
    exceedances,
    gaussian_load,
    literal_load,
)

if TYPE_CHECKING:
    from sloline.planner.plan import StagePlan

__all__ = [
    "Decision",
    "Exceedance",
    "LoadEstimate",
    "RouterState",
    "StageState",
    "TunerContext",
    "TunerOutcome",
    "TunerSettings",
    "decide",
    "effective_rates",
    "effective_rhos",
    "effective_throughputs",
    "estimate_load",
    "exceedances",
    "replicas_for_rate",
    "scale_down",
    "scale_routers",
    "scale_up",
]

_CEIL_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class StageState:
    """One stage as the tuner sees it: replica counts now and its plan parameters (§5)."""

    name: str
    desired_replicas: int
    ready_replicas: int
    min_replicas: int
    max_replicas: int
    scale_factor: float
    """s_m: the fraction of pipeline queries that reach this stage (conditional edges)."""
    throughput_rps: float
    """mu_m: the max throughput of one replica in its planned configuration."""
    max_provisioning_ratio: float
    """rho_m: the planner's max-provisioning ratio (slack kept to absorb bursts)."""

    def __post_init__(self) -> None:
        if self.desired_replicas < 0 or self.ready_replicas < 0:
            raise ValueError(f"stage {self.name!r}: replica counts must be >= 0")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"stage {self.name!r}: need 0 <= min_replicas <= max_replicas, got "
                f"min={self.min_replicas} max={self.max_replicas}"
            )
        if not (math.isfinite(self.scale_factor) and self.scale_factor >= 0.0):
            raise ValueError(f"stage {self.name!r}: scale factor s_m must be finite and >= 0")
        if not (math.isfinite(self.throughput_rps) and self.throughput_rps > 0.0):
            raise ValueError(f"stage {self.name!r}: throughput mu_m must be > 0 rps")
        if not (math.isfinite(self.max_provisioning_ratio) and self.max_provisioning_ratio > 0):
            raise ValueError(f"stage {self.name!r}: max-provisioning ratio rho_m must be > 0")


@dataclass(frozen=True, slots=True)
class RouterState:
    """The routers as the tuner sees them: counts now, bounds, and from the plan the
    requests per second one router's CPU serves (μ_router) and their rho."""

    desired_routers: int
    ready_routers: int
    min_routers: int
    max_routers: int
    throughput_rps: float
    max_provisioning_ratio: float

    def __post_init__(self) -> None:
        if self.desired_routers < 0 or self.ready_routers < 0:
            raise ValueError("router counts must be >= 0")
        if not 1 <= self.min_routers <= self.max_routers:
            raise ValueError(
                f"routers: need 1 <= min_routers <= max_routers, got min={self.min_routers} "
                f"max={self.max_routers}"
            )
        if not (math.isfinite(self.throughput_rps) and self.throughput_rps > 0.0):
            raise ValueError("routers: throughput mu_router must be > 0 rps")
        if not (math.isfinite(self.max_provisioning_ratio) and self.max_provisioning_ratio > 0):
            raise ValueError("routers: max-provisioning ratio must be > 0")


@dataclass(frozen=True, slots=True)
class TunerSettings:
    """Tuner parameters; defaults are InferLine's (§5)."""

    window_base_s: float
    """T_s, the smallest envelope window (the system's service time)."""
    window_max_s: float = 60.0
    stabilization_s: float = 15.0
    lambda_lookback_s: float = 30.0
    lambda_window_s: float = 5.0
    envelope_lookback_s: float = 30.0
    """How far back the observed envelope looks (the router's and Prometheus' look-back).
    As long as Alg. 4's λ look-back, so that Alg. 3's demand, which holds Alg. 4 back,
    forgets a burst when λ_new does."""
    interval_s: float = 1.0
    """How often the live loop calls :func:`decide`."""
    scale_up_enabled: bool = True
    scale_down_enabled: bool = True
    down_respects_up_demand: bool = True

    def __post_init__(self) -> None:
        window_sizes(self.window_base_s, self.window_max_s)  # validates both
        for name in (
            "stabilization_s",
            "lambda_lookback_s",
            "lambda_window_s",
            "envelope_lookback_s",
            "interval_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f"tuner setting {name} must be > 0 seconds, got {value!r}")
        if self.lambda_window_s > self.lambda_lookback_s:
            raise ValueError(
                f"lambda_window_s ({self.lambda_window_s}) must not exceed "
                f"lambda_lookback_s ({self.lambda_lookback_s})"
            )

    @property
    def windows_s(self) -> tuple[float, ...]:
        """The envelope window sizes T_s · 2^k up to ``window_max_s``."""
        return window_sizes(self.window_base_s, self.window_max_s)

    @property
    def lambda_count(self) -> int:
        """How many λ windows make a full look-back (6 for 30 s / 5 s)."""
        return max(1, round(self.lambda_lookback_s / self.lambda_window_s))


@dataclass(frozen=True, slots=True)
class TunerContext:
    """Everything one tuning decision depends on, frozen (§5)."""

    now_s: float
    stages: tuple[StageState, ...]
    planning_envelope: Envelope
    observed_envelope: Envelope
    recent_lambdas_rps: tuple[float, ...]
    """Arrival rates of the recent λ windows (5 s each over the last 30 s), any order."""
    last_change_s: float
    """When replicas last changed; deploying the plan counts as a change."""
    planning_rate_rps: float | None = None
    """λ, the planning trace's mean rate (the plan's ``rate_rps``, at which rho_m is
    defined); None: the planning envelope's largest-window rate stands in for it."""
    routers: RouterState | None = None
    """The routers, where the tuner scales them; None: their count stays."""

    def __post_init__(self) -> None:
        names = [stage.name for stage in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        if any(not (math.isfinite(r) and r >= 0.0) for r in self.recent_lambdas_rps):
            raise ValueError(f"arrival rates must be finite and >= 0: {self.recent_lambdas_rps}")
        rate = self.planning_rate_rps
        if rate is not None and not (math.isfinite(rate) and rate >= 0.0):
            raise ValueError(f"planning rate must be finite and >= 0 rps, got {rate!r}")

    @property
    def planned_rate_rps(self) -> float:
        """λ: ``planning_rate_rps``, else the planning envelope's largest-window rate."""
        if self.planning_rate_rps is not None:
            return self.planning_rate_rps
        return self.planning_envelope.rates_rps[-1] if self.planning_envelope.rates_rps else 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    """Set ``stage`` from ``from_replicas`` (desired) to ``to_replicas``, and why."""

    stage: str
    from_replicas: int
    to_replicas: int
    reason: str

    @property
    def is_scale_up(self) -> bool:
        """Whether this decision adds replicas."""
        return self.to_replicas > self.from_replicas


ROUTERS = "routers"
"""The name a router decision carries in :attr:`Decision.stage`."""


@dataclass(frozen=True, slots=True)
class TunerOutcome:
    """The stage decisions of one tick, the router decision (if any) and the (possibly
    updated) last-change time."""

    decisions: tuple[Decision, ...]
    last_change_s: float
    routers: Decision | None = None


def replicas_for_rate(
    rate_rps: float, scale_factor: float, throughput_rps: float, ratio: float
) -> int:
    """k_m = ceil(rate · s_m / (mu_m · rho)) — Alg. 3 lines 9-10 and Alg. 4 lines 5-6.

    The ceiling forgives a relative 1e-9: the planner computes rho_m = λ·s_m /
    (replicas·mu_m), so the planned rate must give back the planned replicas exactly,
    not one more from rounding."""
    return math.ceil(rate_rps * scale_factor / (throughput_rps * ratio) * (1.0 - _CEIL_TOL))


def _has_traffic(ctx: TunerContext) -> bool:
    return any(r > 0.0 for r in ctx.observed_envelope.rates_rps) or any(
        r > 0.0 for r in ctx.recent_lambdas_rps
    )


def _clamp(replicas: int, stage: StageState) -> int:
    return min(max(replicas, stage.min_replicas), stage.max_replicas)


def _up_demand(stage: StageState, rate_rps: float) -> int:
    return replicas_for_rate(
        rate_rps, stage.scale_factor, stage.throughput_rps, stage.max_provisioning_ratio
    )


def estimate_load(
    ctx: TunerContext, settings: TunerSettings, *, literal: bool = False
) -> LoadEstimate:
    """The rates Algorithms 3 and 4 provision for (:mod:`sloline.tuner.load_estimate`): by
    default the equivalent mean rates of the observed envelope and of λ_new under the
    planning trace's burstiness; ``literal`` gives §5's r_max and raw λ_new."""
    if literal:
        return literal_load(
            ctx.planning_envelope,
            ctx.observed_envelope,
            ctx.recent_lambdas_rps,
            lambda_window_s=settings.lambda_window_s,
            lambda_count=settings.lambda_count,
        )
    return gaussian_load(
        ctx.planning_envelope,
        ctx.planned_rate_rps,
        ctx.observed_envelope,
        ctx.recent_lambdas_rps,
        lambda_window_s=settings.lambda_window_s,
        lambda_count=settings.lambda_count,
        max_window_s=settings.envelope_lookback_s,
    )


def scale_up(
    ctx: TunerContext, settings: TunerSettings, load: LoadEstimate
) -> tuple[Decision, ...]:
    """Algorithm 3 (reactive scale-up) for ``load``, plus bound corrections and wake-up
    from zero."""
    rate = load.up_rps
    wake = _has_traffic(ctx)
    decisions: list[Decision] = []
    for stage in ctx.stages:
        current = stage.desired_replicas
        why: list[str] = []
        want = current
        if settings.scale_up_enabled and rate > 0.0:
            k_m = _up_demand(stage, rate)
            if k_m > current:
                want = k_m
                why.append(
                    f"scale up (Alg. 3): {load.up_reason}; k_m=ceil({rate:.6g}*"
                    f"{stage.scale_factor:g}/({stage.throughput_rps:.6g}*"
                    f"{stage.max_provisioning_ratio:g}))={k_m}"
                )
        if current == 0 and want == 0 and wake and stage.scale_factor > 0.0:
            want = 1
            why.append("wake up: arrivals observed while the stage has 0 replicas")
        if current < stage.min_replicas:
            why.append(f"below min_replicas={stage.min_replicas}")
        target = _clamp(want, stage)
        if target > current:
            if target < want:
                why.append(f"clamped to max_replicas={stage.max_replicas}")
            decisions.append(
                Decision(
                    stage.name,
                    current,
                    target,
                    f"{'; '.join(why)}; desired {current} (ready {stage.ready_replicas})"
                    f" -> {target}",
                )
            )
    return tuple(decisions)


def effective_rhos(rhos: Sequence[float], at_floor: Sequence[bool]) -> list[float]:
    """rho_m for the tuner: a stage planned at its replica floor gets the smallest rho of
    the stages whose slack the planner chose (or the largest rho when all are at their
    floor) if that is larger than its own; see the module docstring."""
    chosen = [r for r, floor in zip(rhos, at_floor, strict=True) if not floor]
    reference = min(chosen) if chosen else max(rhos)
    return [max(r, reference) if floor else r for r, floor in zip(rhos, at_floor, strict=True)]


def effective_throughputs(
    throughputs: Sequence[float],
    rhos: Sequence[float],
    at_floor: Sequence[bool],
    utilisations: Sequence[float],
) -> list[float]:
    """mu_m for the tuner, beside :func:`effective_rhos`: a floor stage with estimated
    busy fraction U_m gets mu_m · min(1, (rho_m / rho_eff) · max(1, U_ref / U_m)), U_ref
    the smallest busy fraction among the stages with planned slack, so that Alg. 3 gives
    it k = ceil(k_plan · (r/λ) · min(1, U_m / U_ref)) replicas once that is more than
    its effective rho asks: its busy fraction stays at most U_ref, and it never scales
    faster than the load (a stage with slack may be replicated for latency, not load,
    and so be far less busy than any floor stage). Unchanged where no stage has planned
    slack or U_m is unknown (0)."""
    busy = [u for u, f in zip(utilisations, at_floor, strict=True) if not f and u > 0.0]
    if not busy:
        return list(throughputs)
    u_ref = min(busy)
    eff = effective_rhos(rhos, at_floor)
    return [
        mu * min(1.0, (rho / rho_eff) * max(1.0, u_ref / u)) if floor and u > 0.0 else mu
        for mu, rho, rho_eff, floor, u in zip(
            throughputs, rhos, eff, at_floor, utilisations, strict=True
        )
    ]


def effective_rates(
    stages: Sequence[StagePlan], at_floor: Sequence[bool]
) -> tuple[list[float], list[float]]:
    """(rho_m, mu_m) per planned stage for the tuner, the embedded, Kubernetes and lab
    loops alike: :func:`effective_rhos` and :func:`effective_throughputs` of the plan's
    rho, throughput and busy fraction, ``at_floor`` saying which stages are planned at
    their replica floor."""
    planned_rhos = [s.rho for s in stages]
    rhos = effective_rhos(planned_rhos, at_floor)
    mus = effective_throughputs(
        [s.throughput_rps for s in stages],
        planned_rhos,
        at_floor,
        [s.utilisation for s in stages],
    )
    return rhos, mus


def scale_down(
    ctx: TunerContext, settings: TunerSettings, load: LoadEstimate
) -> tuple[Decision, ...]:
    """Algorithm 4 (conservative scale-down with rho_min) for ``load``, plus max-bound
    corrections."""
    decisions = [
        Decision(
            stage.name,
            stage.desired_replicas,
            stage.max_replicas,
            f"above max_replicas={stage.max_replicas}; desired {stage.desired_replicas} "
            f"(ready {stage.ready_replicas}) -> {stage.max_replicas}",
        )
        for stage in ctx.stages
        if stage.desired_replicas > stage.max_replicas
    ]
    if decisions:
        return tuple(decisions)
    since_s = ctx.now_s - ctx.last_change_s
    lambda_new = load.down_rps
    if (
        not settings.scale_down_enabled
        or not ctx.stages
        or not since_s > settings.stabilization_s
        or lambda_new is None
    ):
        return ()
    rho_stage = min(ctx.stages, key=lambda s: s.max_provisioning_ratio)
    rho_min = rho_stage.max_provisioning_ratio
    hold = settings.scale_up_enabled and settings.down_respects_up_demand
    for stage in ctx.stages:
        current = stage.desired_replicas
        k_m = replicas_for_rate(lambda_new, stage.scale_factor, stage.throughput_rps, rho_min)
        floor = _up_demand(stage, load.up_rps) if hold else 0
        target = _clamp(max(k_m, floor), stage)
        if target >= current:
            continue
        notes = ""
        if floor > k_m and target == _clamp(floor, stage):
            notes += f"; held at Alg. 3 demand {floor} for {load.up_rps:.6g} rps"
        if target > max(k_m, floor):
            notes += f"; clamped to min_replicas={stage.min_replicas}"
        decisions.append(
            Decision(
                stage.name,
                current,
                target,
                f"scale down (Alg. 4): {since_s:.6g} s since last change > "
                f"{settings.stabilization_s:g} s; {load.down_reason}; "
                f"rho_min={rho_min:g} (stage {rho_stage.name!r}); k_m=ceil({lambda_new:.6g}*"
                f"{stage.scale_factor:g}/({stage.throughput_rps:.6g}*{rho_min:g}))={k_m}"
                f"{notes}; desired {current} (ready {stage.ready_replicas}) -> {target}",
            )
        )
    return tuple(decisions)


def scale_routers(
    ctx: TunerContext, settings: TunerSettings, load: LoadEstimate
) -> Decision | None:
    """The router count for ``load``, as a stage visited by every query: up to Algorithm
    3's k = ceil(r / (μ_router · rho)) at once, down (after ``stabilization_s``) to
    Algorithm 4's ceil(λ_new / (μ_router · rho)) with the routers' own rho, never below
    the scale-up demand when ``down_respects_up_demand``; clamped to the bounds."""
    routers = ctx.routers
    if routers is None:
        return None
    current = routers.desired_routers
    mu, rho = routers.throughput_rps, routers.max_provisioning_ratio
    up = replicas_for_rate(load.up_rps, 1.0, mu, rho) if load.up_rps > 0.0 else 0
    bounds = f"[{routers.min_routers}, {routers.max_routers}]"
    target, why = current, ""
    if settings.scale_up_enabled and up > current:
        target, why = up, f"scale up (Alg. 3): {load.up_reason}; k=ceil({load.up_rps:.6g}/"
        why += f"({mu:.6g}*{rho:g}))={up}"
    elif (
        settings.scale_down_enabled
        and load.down_rps is not None
        and ctx.now_s - ctx.last_change_s > settings.stabilization_s
    ):
        down = replicas_for_rate(load.down_rps, 1.0, mu, rho)
        hold = settings.scale_up_enabled and settings.down_respects_up_demand
        want = max(down, up) if hold else down
        if want < current:
            target = want
            why = f"scale down (Alg. 4): {load.down_reason}; k=ceil({load.down_rps:.6g}/"
            why += f"({mu:.6g}*{rho:g}))={down}"
    clamped = min(max(target, routers.min_routers), routers.max_routers)
    if clamped == current:
        return None
    if clamped != target:
        why += f"{'; ' if why else ''}clamped to {bounds}"
    reason = f"{why}; desired {current} (ready {routers.ready_routers}) -> {clamped}"
    return Decision(ROUTERS, current, clamped, reason)


def decide(
    ctx: TunerContext, settings: TunerSettings, load: LoadEstimate | None = None
) -> TunerOutcome:
    """One tuning tick (§5): Algorithm 3, then Algorithm 4 if nothing scaled up; and the
    routers (:func:`scale_routers`) where ``ctx.routers`` is given.

    ``load`` defaults to :func:`estimate_load` of ``ctx``. Returns the decisions (at most
    one per stage, and one for the routers) and the last-change time, which is
    ``ctx.now_s`` if anything changed.
    """
    load = load or estimate_load(ctx, settings)
    decisions = scale_up(ctx, settings, load) or scale_down(ctx, settings, load)
    routers = scale_routers(ctx, settings, load)
    changed = bool(decisions) or routers is not None
    return TunerOutcome(decisions, ctx.now_s if changed else ctx.last_change_s, routers)
