"""``sloline simulate``: scaling policies compared in closed loop on the same traces
(InferLine §7.1-§7.3, Figs. 7, 8, 11-13).

For each trace, every policy serves the *same* arrivals and conditional routes through
the event simulation of :mod:`sloline.lab.engine`, with a 5 s replica activation delay
(InferLine §5). The policies:

- ``plan``: the planner's plan for the trace's planning sample, never changed
  (InferLine's "Planner only");
- ``oracle``: the planner run on the whole live trace — static, the cheapest plan that
  meets the SLO with full knowledge of the load (Fig. 11's oracle);
- ``inferline``: the plan, tuned every tick by :func:`sloline.tuner.policy.decide`
  (Algorithms 3 and 4) on the streaming envelope of the arrivals so far, as the live loop;
- ``inferline-paper``: the same ``decide`` fed §5's literal rates (r_max, raw λ_new;
  :func:`sloline.tuner.policy.estimate_load` with ``literal=True``), for comparison;
- ``inferline-replan``: ``inferline`` plus the planner run again every 30 s on the
  last minute of arrivals, its plan adopted when it changes a stage's hardware or batch
  and is cheaper than the replicas running (:mod:`sloline.tuner.replan`);
- ``cg-autoscale``: InferLine's coarse-grained baseline (§6): the CG-Mean configuration
  (whole pipeline as one unit), tuned by AutoScale;
- ``hpa``, ``ray-serve``, ``knative-kpa``: the plan, each stage scaled by that system's
  default autoscaler (InferLine §7.3's "InferLine Plan + Baseline Tune" shape).

:mod:`sloline.lab.autoscalers` documents each baseline and the source of every default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloline.lab.autoscalers import (
    AutoScaleSettings,
    HpaSettings,
    HpaStage,
    KpaSettings,
    KpaStage,
    RaySettings,
    RayStage,
    autoscale_step,
    hpa_step,
    kpa_step,
    packing_factor,
    ray_step,
)
from sloline.lab.cg import cg_baseline
from sloline.lab.engine import EngineSettings, run_closed_loop
from sloline.lab.loop import Observation, Policy, Targets
from sloline.lab.report import PolicyResult, SimulationReport, recovery_times, rolling_tail
from sloline.lab.traces import Trace
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload
from sloline.planner.evaluator import Evaluator
from sloline.planner.plan import Plan
from sloline.planner.planner import InfeasibleError
from sloline.planner.planner import plan as make_plan
from sloline.planner.problem import PlanningProblem
from sloline.tuner.policy import (
    StageState,
    TunerContext,
    TunerSettings,
    decide,
    effective_rates,
    estimate_load,
)
from sloline.tuner.replan import ReplanSettings, choose, plan_recent, running_config
from sloline.tuner.sources import device_caps

__all__ = [
    "POLICIES",
    "REACTIVE",
    "SimulationSettings",
    "build_policy",
    "simulate",
]

POLICIES = (
    "plan",
    "oracle",
    "inferline",
    "inferline-paper",
    "inferline-replan",
    "cg-autoscale",
    "hpa",
    "ray-serve",
    "knative-kpa",
)
REACTIVE = ("cg-autoscale", "hpa", "ray-serve", "knative-kpa")


@dataclass(frozen=True, slots=True)
class SimulationSettings:
    """Simulation constants (InferLine §5 defaults) and every baseline's settings.

    ``tuner`` None derives the InferLine tuner's settings from the plan (window base T_s
    and largest window of the plan's envelope, one decision per tick, every other field
    at its default); the engine observes the envelope and λ windows as the tuner's
    settings say, for every policy; ``packing_factor``
    None profiles AutoScale's p with :func:`sloline.lab.autoscalers.packing_factor`;
    ``packing_factor_scale`` multiplies that p (given or profiled): AutoScale's cost knob,
    > 1 packs more requests into a unit (fewer units, less headroom), < 1 fewer.
    Baselines' replica bounds are replaced by each stage's bounds from the problem.
    """

    tick_s: float = 1.0
    activation_delay_s: float = 5.0
    recovery_window_s: float = 5.0
    tuner: TunerSettings | None = None
    hpa: HpaSettings = field(default_factory=HpaSettings)
    ray: RaySettings = field(default_factory=RaySettings)
    kpa: KpaSettings = field(default_factory=KpaSettings)
    autoscale_t_wait_s: float = 120.0
    packing_factor: float | None = None
    packing_factor_scale: float = 1.0
    replan: ReplanSettings = field(default_factory=ReplanSettings)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.packing_factor_scale) and self.packing_factor_scale > 0.0):
            raise ValueError(
                "packing_factor_scale multiplies AutoScale's packing factor and must be a "
                f"finite number > 0 (1 keeps the profiled p), got {self.packing_factor_scale!r}"
            )


def _tuner_settings(plan: Plan, settings: SimulationSettings) -> TunerSettings:
    windows = plan.envelope.windows_s
    return settings.tuner or TunerSettings(
        window_base_s=windows[0], window_max_s=windows[-1], interval_s=settings.tick_s
    )


def _tune(
    problem: PlanningProblem, plan: Plan, settings: TunerSettings, *, literal: bool
) -> Callable[[Observation, float], tuple[Targets, float]]:
    """One tick of the InferLine tuner on ``plan``: :func:`~sloline.tuner.policy.decide`
    on stages with the effective rho_m and mu_m the live loop gives them
    (:func:`~sloline.tuner.policy.effective_rates`, as
    :func:`sloline.tuner.sources.stage_tunings`); ``literal`` feeds it §5's rates
    instead of the default estimate. Its bounds are the spec's, on a class with a device
    bound no more than :func:`~sloline.tuner.sources.device_caps` allows, as live."""
    devices = device_caps(plan)
    bounds = [
        (lo, min(hi, devices.get(s.name, hi)))
        for s, (lo, hi) in ((s, problem.replica_bounds(s.name)) for s in plan.stages)
    ]
    at_floor = [s.replicas <= lo for s, (lo, _) in zip(plan.stages, bounds, strict=True)]
    rhos, mus = effective_rates(plan.stages, at_floor)

    def step(observation: Observation, last_change_s: float) -> tuple[Targets, float]:
        assert observation.envelope is not None  # the engine feeds the plan's windows
        context = TunerContext(
            now_s=observation.now_s,
            stages=tuple(
                StageState(
                    name=s.name,
                    desired_replicas=view.desired,
                    ready_replicas=view.ready,
                    min_replicas=lo,
                    max_replicas=hi,
                    scale_factor=s.scale_factor,
                    throughput_rps=mu,
                    max_provisioning_ratio=rho,
                )
                for s, view, (lo, hi), rho, mu in zip(
                    plan.stages, observation.stages, bounds, rhos, mus, strict=True
                )
            ),
            planning_envelope=plan.envelope,
            observed_envelope=observation.envelope,
            recent_lambdas_rps=observation.lambdas_rps,
            last_change_s=last_change_s,
            planning_rate_rps=plan.rate_rps,
        )
        load = estimate_load(context, settings, literal=literal)
        outcome = decide(context, settings, load)
        targets = {d.stage: d.to_replicas for d in outcome.decisions}
        return (
            tuple(targets.get(v.name, v.desired) for v in observation.stages),
            outcome.last_change_s,
        )

    return step


def _inferline(
    problem: PlanningProblem, plan: Plan, settings: TunerSettings, *, literal: bool
) -> Policy:
    """The InferLine tuner: the plan, tuned every tick (:func:`_tune`)."""
    name = "inferline-paper" if literal else "inferline"
    step = _tune(problem, plan, settings, literal=literal)
    return Policy(name, plan.config, step, 0.0, settings.windows_s)


@dataclass(frozen=True, slots=True)
class _Replanning:
    plan: Plan
    tune: Callable[[Observation, float], tuple[Targets, float]]
    last_change_s: float
    last_plan_s: float


def _inferline_replan(
    problem: PlanningProblem, plan: Plan, settings: TunerSettings, replan: ReplanSettings
) -> Policy:
    """The InferLine tuner that also re-plans on recent arrivals
    (:mod:`sloline.tuner.replan`, as the live :class:`~sloline.tuner.replan.Replanner`):
    every ``replan.interval_s``, :func:`~sloline.tuner.replan.choose` on the plan for the
    last ``replan.lookback_s`` and the running configuration's estimate there; between
    plans, the tuner as in ``inferline`` on the plan adopted last. The simulation serves
    ``problem``'s profile, so it plans with the served speed exactly, where the live loop
    plans with a calibration of the look-back's batches."""
    windows = settings.windows_s

    def adopt(candidate: Plan, now_s: float) -> _Replanning:
        tune = _tune(problem, candidate, settings, literal=False)
        return _Replanning(candidate, tune, now_s, now_s)

    def step(observation: Observation, state: _Replanning) -> tuple[Targets, _Replanning]:
        now, recent = observation.now_s, observation.recent_arrivals_s
        if now - state.last_plan_s >= replan.interval_s and recent is not None:
            state = dataclasses.replace(state, last_plan_s=now)
            arrivals = recent - (now - replan.lookback_s)
            desired = [v.desired for v in observation.stages]
            running = running_config(state.plan, desired)
            steady = replan.steady(arrivals)
            result = plan_recent(problem, arrivals, windows, running, steady=steady)
            targets, _ = choose(
                state.plan, result, desired, problem.hardware_costs, replan, problem.slo_s
            )
            if result.candidate is not None and targets is not None:
                return targets, adopt(result.candidate, now)
        targets, last_change_s = state.tune(observation, state.last_change_s)
        return targets, dataclasses.replace(state, last_change_s=last_change_s)

    return Policy(
        "inferline-replan",
        plan.config,
        step,
        adopt(plan, 0.0),
        windows,
        arrivals_lookback_s=replan.lookback_s,
    )


def _per_stage(
    name: str,
    config: tuple[StageConfig, ...],
    states: tuple[Any, ...],
    stage_step: Callable[[Any, Observation, Any, int], tuple[int, Any]],
) -> Policy:
    """A policy that runs one independent autoscaler per stage."""

    def step(observation: Observation, current: tuple[Any, ...]) -> tuple[Targets, Any]:
        out = [
            stage_step(view, observation, state, m)
            for m, (view, state) in enumerate(zip(observation.stages, current, strict=True))
        ]
        return tuple(t for t, _ in out), tuple(s for _, s in out)

    return Policy(name, config, step, states)


def _cg_autoscale(problem: PlanningProblem, settings: SimulationSettings) -> Policy:
    baseline = cg_baseline(problem, Evaluator(problem), "cg-mean")
    if baseline is None:
        raise InfeasibleError(
            "NoCoarseGrainedConfig",
            "no single hardware class runs every stage within the SLO, so there is no "
            "coarse-grained (CG-Mean) configuration to tune",
        )
    p = settings.packing_factor or packing_factor(problem, baseline.hardware, baseline.max_batch)
    p *= settings.packing_factor_scale
    auto = AutoScaleSettings(
        p, settings.autoscale_t_wait_s, max_units=min(problem.max_replicas, 256)
    )
    config = tuple(
        StageConfig(baseline.hardware, baseline.max_batch, baseline.units)
        for _ in problem.topology.stages
    )

    def step(observation: Observation, state: None) -> tuple[Targets, None]:
        return autoscale_step(observation, auto), state

    return Policy("cg-autoscale", config, step, index_packing=True)


def build_policy(
    name: str,
    problem: PlanningProblem,
    plan: Plan,
    trace: Trace,
    settings: SimulationSettings,
) -> Policy:
    """The named policy (see :data:`POLICIES`) for ``trace``, starting from ``plan``.

    ``problem`` is the planning problem of the trace's sample (its arrivals are
    replaced by the live trace for the oracle). Raises
    :class:`~sloline.planner.planner.InfeasibleError` when the policy has no
    configuration (e.g. no plan meets the SLO on the whole trace)."""
    if name == "oracle":
        oracle = make_plan(dataclasses.replace(problem, arrivals_s=trace.arrivals_s))
        return Policy("oracle", oracle.config, routers=oracle.routers)
    # every other policy serves with the plan's routers
    return dataclasses.replace(_from_plan(name, problem, plan, settings), routers=plan.routers)


def _from_plan(
    name: str, problem: PlanningProblem, plan: Plan, settings: SimulationSettings
) -> Policy:
    bounds = [problem.replica_bounds(s) for s in problem.topology.stages]
    if name == "plan":
        return Policy("plan", plan.config)
    if name in {"inferline", "inferline-paper"}:
        tuner = _tuner_settings(plan, settings)
        return _inferline(problem, plan, tuner, literal=name == "inferline-paper")
    if name == "inferline-replan":
        return _inferline_replan(problem, plan, _tuner_settings(plan, settings), settings.replan)
    if name == "cg-autoscale":
        return _cg_autoscale(problem, settings)
    if name not in _PER_STAGE:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return _PER_STAGE[name](plan.config, bounds, settings)


def _hpa(
    config: tuple[StageConfig, ...], bounds: list[tuple[int, int]], settings: SimulationSettings
) -> Policy:
    hpa = [dataclasses.replace(settings.hpa, min_replicas=lo, max_replicas=hi) for lo, hi in bounds]
    return _per_stage(
        "hpa",
        config,
        tuple(HpaStage() for _ in config),
        lambda view, obs, state, m: hpa_step(view, obs.now_s, state, hpa[m]),
    )


def _ray(
    config: tuple[StageConfig, ...], bounds: list[tuple[int, int]], settings: SimulationSettings
) -> Policy:
    ray = [dataclasses.replace(settings.ray, min_replicas=lo, max_replicas=hi) for lo, hi in bounds]
    return _per_stage(
        "ray-serve",
        config,
        tuple(RayStage() for _ in config),
        lambda view, obs, state, m: ray_step(view, obs.now_s, obs.tick_s, state, ray[m]),
    )


def _kpa(
    config: tuple[StageConfig, ...], bounds: list[tuple[int, int]], settings: SimulationSettings
) -> Policy:
    kpa = [dataclasses.replace(settings.kpa, min_replicas=lo, max_replicas=hi) for lo, hi in bounds]
    return _per_stage(
        "knative-kpa",
        config,
        tuple(KpaStage() for _ in config),
        lambda view, obs, state, m: kpa_step(view, obs.now_s, state, kpa[m]),
    )


_PER_STAGE: dict[
    str,
    Callable[[tuple[StageConfig, ...], list[tuple[int, int]], SimulationSettings], Policy],
] = {"hpa": _hpa, "ray-serve": _ray, "knative-kpa": _kpa}


def _result(
    problem: PlanningProblem,
    trace: Trace,
    policy: Policy,
    workload: Workload,
    settings: SimulationSettings,
    tuner: TunerSettings,
) -> PolicyResult:
    engine = EngineSettings(
        tick_s=settings.tick_s,
        activation_delay_s=settings.activation_delay_s,
        service=problem.service,
        seed=problem.seed,
        envelope_lookback_s=tuner.envelope_lookback_s,
        lambda_window_s=tuner.lambda_window_s,
        lambda_lookback_s=tuner.lambda_lookback_s,
        prices_per_hour=problem.hardware_costs,
    )
    run = run_closed_loop(
        problem.topology, problem.profile, workload, policy, trace.duration_s, engine
    )
    tail = rolling_tail(
        trace.arrivals_s,
        run.latencies_s,
        run.ticks_s,
        window_s=settings.recovery_window_s,
        percentile=problem.percentile,
    )
    within = np.count_nonzero(run.latencies_s <= problem.slo_s)
    return PolicyResult(
        trace=trace.name,
        policy=policy.name,
        queries=int(run.latencies_s.size),
        attainment=float(within) / max(1, run.latencies_s.size),
        cost_usd=run.cost_usd,
        tail_s=float(np.percentile(run.latencies_s, problem.percentile, method="inverted_cdf")),
        recovery_s=recovery_times(run.ticks_s, tail, trace.changes_s, problem.slo_s),
        scale_events=len(run.events),
        stages=problem.topology.stages,
        config=policy.config,
        run=run,
        rolling_tail_s=tail,
    )


def simulate(
    problem: PlanningProblem,
    traces: Sequence[Trace],
    *,
    plan: Plan | None = None,
    policies: Sequence[str] = POLICIES,
    settings: SimulationSettings | None = None,
) -> SimulationReport:
    """Compare ``policies`` on every trace, in closed loop.

    ``problem`` carries the pipeline (topology, profiles), hardware prices, SLO and
    estimator mode; its planning arrivals are replaced by each trace's planning sample.
    ``plan`` None plans every trace on its sample (InferLine's protocol); a given plan is
    used as the starting point on every trace. A policy without a configuration on a
    trace (no feasible oracle plan, no CG configuration) is listed as skipped."""
    settings = settings or SimulationSettings()
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    results: list[PolicyResult] = []
    skipped: list[tuple[str, str, str]] = []
    for trace in traces:
        if trace.arrivals_s.size == 0:
            raise ValueError(f"trace {trace.name!r} has no arrivals")
        sample = dataclasses.replace(problem, arrivals_s=trace.planning_s)
        start = plan or make_plan(sample)
        workload = Workload.build(
            problem.topology, problem.profile, trace.arrivals_s, seed=problem.seed
        )
        for name in policies:
            try:
                policy = build_policy(name, sample, start, trace, settings)
            except InfeasibleError as exc:
                skipped.append((trace.name, name, exc.reason))
                continue
            tuner = _tuner_settings(start, settings)
            results.append(_result(problem, trace, policy, workload, settings, tuner))
    return SimulationReport(
        pipeline=problem.name,
        slo_s=problem.slo_s,
        percentile=problem.percentile,
        traces=tuple(traces),
        results=tuple(results),
        skipped=tuple(skipped),
    )
