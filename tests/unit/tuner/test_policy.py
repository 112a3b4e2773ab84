"""The pure tuning policy: InferLine Algorithms 3 (scale up) and 4 (scale down), §5.

Tests of §5's literal rates (r_max, raw λ_new) go through :func:`literal`; the default
load estimate (:mod:`sloline.tuner.load_estimate`) has its own tests below them."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.common.envelope import Envelope, window_sizes
from sloline.tuner.policy import (
    StageState,
    TunerContext,
    TunerOutcome,
    TunerSettings,
    decide,
    estimate_load,
    exceedances,
    replicas_for_rate,
)

WINDOWS = window_sizes(0.25, 8.0)  # 0.25 ... 8 s
SETTINGS = TunerSettings(window_base_s=0.25, window_max_s=8.0)
FULL_LAMBDAS = (10.0,) * SETTINGS.lambda_count


def stage(
    name: str = "a",
    *,
    desired: int = 2,
    ready: int | None = None,
    lo: int = 1,
    hi: int = 50,
    s: float = 1.0,
    mu: float = 10.0,
    rho: float = 0.5,
) -> StageState:
    return StageState(name, desired, desired if ready is None else ready, lo, hi, s, mu, rho)


def flat(rate: float) -> Envelope:
    return Envelope(WINDOWS, (rate,) * len(WINDOWS))


def context(
    *stages: StageState,
    planning: Envelope | None = None,
    observed: Envelope | None = None,
    lambdas: tuple[float, ...] = FULL_LAMBDAS,
    now: float = 100.0,
    last_change: float = 0.0,
) -> TunerContext:
    return TunerContext(
        now_s=now,
        stages=stages or (stage(),),
        planning_envelope=planning or flat(20.0),
        observed_envelope=observed or flat(10.0),
        recent_lambdas_rps=lambdas,
        last_change_s=last_change,
    )


def literal(ctx: TunerContext, settings: TunerSettings = SETTINGS) -> TunerOutcome:
    """``decide`` on §5's literal rates."""
    return decide(ctx, settings, estimate_load(ctx, settings, literal=True))


def test_burst_at_small_window_with_unchanged_mean_scales_up() -> None:
    smooth = np.arange(0.0, 64.0, 0.05)  # 20 rps, evenly spaced
    bursty = np.repeat(np.arange(0.0, 64.0, 1.0), 20) + np.tile(np.arange(20) * 1e-3, 64)
    assert smooth.size == bursty.size  # same mean rate
    planning, observed = Envelope.of_trace(smooth, WINDOWS), Envelope.of_trace(bursty, WINDOWS)
    over = exceedances(planning, observed)
    assert over[0].window_s == 0.25
    assert {e.window_s for e in over} < set(WINDOWS)  # the 8 s window sees the same mean
    r_max = max(e.observed_rps for e in over)
    assert r_max == 20 / 0.25

    outcome = literal(context(planning=planning, observed=observed, now=3.0))

    (decision,) = outcome.decisions
    assert decision.to_replicas == math.ceil(80.0 * 1.0 / (10.0 * 0.5)) == 16
    assert "exceeds the plan at window(s) 0.25 s (80 > " in decision.reason
    assert "r_max=80 rps at window 0.25 s" in decision.reason
    assert "k_m=ceil(80*1/(10*0.5))=16" in decision.reason
    assert outcome.last_change_s == 3.0  # scale-up restarts the stabilisation delay


def test_rate_ramp_exceeds_only_large_windows_and_scales_up() -> None:
    clumped = np.repeat(np.arange(0.0, 64.0, 1.0), 10)  # 10 rps in clumps of 10
    ramp_rate = np.linspace(10.0, 20.0, 64 * 20)  # smooth ramp from 10 to 20 rps
    ramp = np.cumsum(1.0 / ramp_rate)
    ramp = ramp[ramp < 64.0]
    planning, observed = Envelope.of_trace(clumped, WINDOWS), Envelope.of_trace(ramp, WINDOWS)
    over = exceedances(planning, observed)
    assert [e.window_s for e in over] == [1.0, 2.0, 4.0, 8.0]  # not 0.25 s, 0.5 s
    r_max = max(e.observed_rps for e in over)

    (decision,) = literal(context(planning=planning, observed=observed)).decisions

    assert decision.to_replicas == math.ceil(r_max * 1.0 / (10.0 * 0.5))
    assert decision.to_replicas > 2


def test_r_max_only_counts_windows_that_exceed_their_plan() -> None:
    planning = Envelope((1.0, 2.0), (200.0, 40.0))
    observed = Envelope((1.0, 2.0), (100.0, 50.0))  # 100 is high but within its plan
    a = stage("a", desired=1, s=0.5, mu=7.0, rho=0.6)
    b = stage("b", desired=1, s=1.0, mu=3.0, rho=0.9)
    outcome = literal(context(a, b, planning=planning, observed=observed))
    assert {d.stage: d.to_replicas for d in outcome.decisions} == {
        "a": math.ceil(50.0 * 0.5 / (7.0 * 0.6)),
        "b": math.ceil(50.0 * 1.0 / (3.0 * 0.9)),
    }


@settings(max_examples=100, deadline=None)
@given(
    r=st.floats(0.01, 1e5),
    s=st.floats(0.0, 1.0),
    mu=st.floats(0.1, 1e4),
    rho=st.floats(0.05, 1.0),
    desired=st.integers(0, 100),
)
def test_k_m_is_algorithm_3_exactly(
    r: float, s: float, mu: float, rho: float, desired: int
) -> None:
    exact = r * s / (mu * rho)
    k_m = replicas_for_rate(r, s, mu, rho)
    # ceil, forgiving only float noise: k_m - 1 < exact <= k_m within a relative 1e-9
    assert k_m - 1 < exact <= k_m * (1 + 1e-9)
    assert (k_m >= 1) == (exact > 0)
    one = stage(desired=desired, lo=0, hi=10**9, s=s, mu=mu, rho=rho)
    ctx = context(one, planning=Envelope((1.0,), (r / 2,)), observed=Envelope((1.0,), (r,)))
    ups = [d for d in literal(ctx).decisions if d.is_scale_up]
    expected = max(k_m, 1 if desired == 0 and s > 0 else 0)
    assert [d.to_replicas for d in ups] == ([expected] if expected > desired else [])


def test_starting_replicas_are_not_double_counted() -> None:
    observed = flat(10.0)
    planning = Envelope(WINDOWS, (5.0,) * len(WINDOWS))  # k_m = ceil(10/(10*0.5)) = 2
    starting = stage(desired=2, ready=0)
    assert decide(context(starting, planning=planning, observed=observed), SETTINGS).decisions == ()
    more = Envelope(WINDOWS, (30.0,) * len(WINDOWS))  # k_m = 6
    (d,) = decide(context(starting, planning=planning, observed=more), SETTINGS).decisions
    assert (d.from_replicas, d.to_replicas) == (2, 6)
    assert "desired 2 (ready 0) -> 6" in d.reason


def test_scale_down_waits_for_stabilisation_and_uses_rho_min() -> None:
    a = stage("a", desired=10, s=1.0, mu=10.0, rho=0.8)
    b = stage("b", desired=12, s=0.5, mu=4.0, rho=0.4)
    lambdas = (12.0, 30.0, 8.0, 9.0, 10.0, 11.0)
    early = context(a, b, lambdas=lambdas, now=15.0, last_change=0.0)
    assert literal(early).decisions == ()  # 15 s is not > 15 s

    outcome = literal(context(a, b, lambdas=lambdas, now=15.5, last_change=0.0))

    assert {d.stage: d.to_replicas for d in outcome.decisions} == {
        "a": math.ceil(30.0 * 1.0 / (10.0 * 0.4)),  # rho_min = 0.4, not a's own 0.8
        "b": math.ceil(30.0 * 0.5 / (4.0 * 0.4)),
    }
    assert outcome.last_change_s == 15.5
    reason = outcome.decisions[0].reason
    assert "lambda_new=30 rps (max of 6 windows of 5 s)" in reason
    assert "rho_min=0.4 (stage 'b')" in reason
    assert "k_m=ceil(30*1/(10*0.4))=8" in reason


def test_scale_down_needs_a_full_lookback_of_lambdas() -> None:
    ctx = context(stage(desired=10), lambdas=(1.0,) * (SETTINGS.lambda_count - 1))
    assert decide(ctx, SETTINGS).decisions == ()


def test_scale_down_holds_at_algorithm_3_demand_unless_disabled() -> None:
    planning, observed = flat(10.0), flat(20.0)  # persistently above plan: demand 4
    ctx = context(stage(desired=4), planning=planning, observed=observed, lambdas=(5.0,) * 6)
    assert decide(ctx, SETTINGS).decisions == ()
    flappy = TunerSettings(window_base_s=0.25, window_max_s=8.0, down_respects_up_demand=False)
    (d,) = decide(ctx, flappy).decisions
    assert d.to_replicas == 1


def test_scale_down_is_clamped_to_min_and_can_reach_zero_without_traffic() -> None:
    (d,) = decide(context(stage(desired=5, lo=3), lambdas=(0.0,) * 6), SETTINGS).decisions
    assert d.to_replicas == 3
    assert "clamped to min_replicas=3" in d.reason
    idle = context(stage(desired=2, lo=0), observed=flat(0.0), lambdas=(0.0,) * 6)
    (d,) = decide(idle, SETTINGS).decisions
    assert d.to_replicas == 0
    busy = context(stage(desired=1, lo=0), observed=flat(0.01), lambdas=(0.0,) * 5 + (0.01,))
    assert decide(busy, SETTINGS).decisions == ()  # traffic keeps k_m >= 1


def test_stage_at_zero_wakes_up_on_any_arrival() -> None:
    asleep = stage(desired=0, lo=0)
    quiet = context(asleep, observed=flat(0.0), lambdas=(0.0,) * 6)
    assert decide(quiet, SETTINGS).decisions == ()
    trickle = context(asleep, observed=Envelope(WINDOWS, (4.0,) + (0.0,) * 5), lambdas=())
    # below the plan: §5's Alg. 3 does not fire, the wake-up does
    (d,) = literal(trickle).decisions
    assert (d.from_replicas, d.to_replicas, "wake up" in d.reason) == (0, 1, True)
    # the default load estimate demands k_m = ceil(4/(10*0.5)) = 1 itself
    (d,) = decide(trickle, SETTINGS).decisions
    assert (d.to_replicas, "scale up (Alg. 3)" in d.reason) == (1, True)
    up_off = TunerSettings(0.25, 8.0, scale_up_enabled=False)
    (d,) = decide(trickle, up_off).decisions
    assert (d.to_replicas, "wake up" in d.reason) == (1, True)


def test_out_of_bounds_desired_is_corrected_at_once() -> None:
    (d,) = decide(context(stage(desired=1, lo=3), last_change=99.0), SETTINGS).decisions
    assert (d.to_replicas, "below min_replicas=3" in d.reason) == (3, True)
    (d,) = decide(context(stage(desired=9, hi=4), last_change=99.0), SETTINGS).decisions
    assert (d.to_replicas, "above max_replicas=4" in d.reason) == (4, True)


def test_scale_up_is_clamped_to_max() -> None:
    (d,) = decide(context(stage(hi=5), observed=flat(1000.0)), SETTINGS).decisions
    assert d.to_replicas == 5
    assert "k_m=ceil(1000*1/(10*0.5))=200" in d.reason
    assert "clamped to max_replicas=5" in d.reason


def test_disabled_directions_do_nothing() -> None:
    off = TunerSettings(0.25, 8.0, scale_up_enabled=False, scale_down_enabled=False)
    assert decide(context(observed=flat(1000.0)), off).decisions == ()
    assert decide(context(stage(desired=30), lambdas=(0.0,) * 6), off).decisions == ()


def test_disjoint_windows_are_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="window base"):
        exceedances(flat(1.0), Envelope((0.3, 0.6), (1.0, 1.0)))


def test_settings_and_stage_validation() -> None:
    with pytest.raises(ValueError, match="stabilization_s"):
        TunerSettings(0.25, stabilization_s=0.0)
    with pytest.raises(ValueError, match="min_replicas <= max_replicas"):
        stage(lo=3, hi=2)
    with pytest.raises(ValueError, match="rho_m"):
        stage(rho=0.0)
    with pytest.raises(ValueError, match="unique"):
        context(stage("x"), stage("x"))


rates = st.floats(0.0, 1e4, allow_nan=False)
stage_strategy = st.builds(
    lambda name, lo, span, desired, ready, s, mu, rho: StageState(
        name, desired, ready, lo, lo + span, s, mu, rho
    ),
    name=st.text("abcdefgh", min_size=1, max_size=3),
    lo=st.integers(0, 5),
    span=st.integers(0, 20),
    desired=st.integers(0, 40),
    ready=st.integers(0, 40),
    s=st.floats(0.0, 2.0),
    mu=st.floats(0.1, 1e3),
    rho=st.floats(0.05, 1.0),
)


envelope_rates = st.lists(rates, min_size=len(WINDOWS), max_size=len(WINDOWS))
contexts = st.builds(
    lambda stages, planned, observed, lambdas, now, last_change: TunerContext(
        now,
        tuple(stages),
        Envelope(WINDOWS, tuple(planned)),
        Envelope(WINDOWS, tuple(observed)),
        tuple(lambdas),
        last_change,
    ),
    stages=st.lists(stage_strategy, min_size=1, max_size=4, unique_by=lambda s: s.name),
    planned=envelope_rates,
    observed=envelope_rates,
    lambdas=st.lists(rates, max_size=8),
    now=st.floats(0.0, 100.0),
    last_change=st.floats(0.0, 100.0),
)


@settings(max_examples=75, deadline=None)
@given(ctx=contexts)
def test_decisions_always_respect_bounds(ctx: TunerContext) -> None:
    outcome = decide(ctx, SETTINGS)
    by_name = {s.name: s for s in ctx.stages}
    assert len({d.stage for d in outcome.decisions}) == len(outcome.decisions)
    for d in outcome.decisions:
        current = by_name[d.stage]
        assert current.min_replicas <= d.to_replicas <= current.max_replicas
        assert d.from_replicas == current.desired_replicas != d.to_replicas
        assert d.reason
    assert outcome.last_change_s == (ctx.now_s if outcome.decisions else ctx.last_change_s)
    if not outcome.decisions:  # then every stage is within its bounds
        assert all(s.min_replicas <= s.desired_replicas <= s.max_replicas for s in ctx.stages)


def test_effective_rhos_lift_stages_at_their_floor() -> None:
    from sloline.tuner.policy import effective_rhos

    # parse at its floor with rho ~0 takes the smallest chosen slack (0.5), not 0.0003.
    assert effective_rhos([0.0003, 0.6, 0.5], [True, False, False]) == [0.5, 0.6, 0.5]
    # every stage at its floor: the busiest stage's rho applies to the idle ones.
    assert effective_rhos([0.0003, 0.59], [True, True]) == [0.59, 0.59]
    # a floor stage already busier than the reference keeps its own rho.
    assert effective_rhos([0.9, 0.5], [True, False]) == [0.9, 0.5]


def test_effective_throughputs_count_what_a_floor_stage_really_serves() -> None:
    from sloline.tuner.policy import effective_rhos, effective_throughputs

    # A held-out pipeline's plan at 137 rps: a CPU stage at batch 1 on its floor (mu
    # 821.7 rps from 1.2 ms of work, busy 28 % with its 0.8 ms hop) before a GPU-like
    # stage on 7 replicas (rho 0.68, busy 70 %).
    rhos, floor, busy = [0.17, 0.68], [True, False], [0.28, 0.70]
    eff_rho = effective_rhos(rhos, floor)
    eff_mu = effective_throughputs([821.7, 28.7], rhos, floor, busy)
    assert eff_rho == [0.68, 0.68]
    assert eff_mu[0] == pytest.approx(821.7 * (0.17 / 0.68) * (0.70 / 0.28))
    assert eff_mu[1] == 28.7  # a stage with planned slack keeps its mu
    cpu = stage("cpu", desired=1, mu=eff_mu[0], rho=eff_rho[0])
    gpu = stage("gpu", desired=7, mu=eff_mu[1], rho=eff_rho[1])
    surge = context(cpu, gpu, planning=flat(137.0), observed=flat(540.0))
    targets = {d.stage: d.to_replicas for d in decide(surge, SETTINGS).decisions}
    # 540 rps needs 2 CPU replicas to stay no busier than the GPU stage (1.1 s of
    # work per second on one); mu alone says one replica serves 821 rps.
    assert targets == {"cpu": 2, "gpu": math.ceil(7 * 540.0 / 137.0 - 1e-9)}
    plain = context(stage("cpu", desired=1, mu=821.7, rho=0.68), planning=flat(137.0))
    plain = dataclasses.replace(plain, observed_envelope=flat(540.0))
    assert decide(plain, SETTINGS).decisions == ()  # the planned mu alone: no scale-up


def test_effective_throughputs_leave_mu_where_they_know_no_better() -> None:
    from sloline.tuner.policy import effective_throughputs

    # No stage with planned slack, no busy fraction, or a floor stage that the
    # reference rho already scales enough: mu as planned.
    assert effective_throughputs([10.0, 20.0], [0.1, 0.5], [True, True], [0.1, 0.5]) == [
        10.0,
        20.0,
    ]
    assert effective_throughputs([10.0, 20.0], [0.1, 0.5], [True, False], [0.0, 0.5]) == [
        10.0,
        20.0,
    ]
    # rho 0.1 lifted to 0.5 already asks for 1/5 of the proportional replicas; its busy
    # fraction (0.05 against 0.5) allows 1/10: the rho stands, mu stays.
    assert effective_throughputs([10.0, 20.0], [0.1, 0.5], [True, False], [0.05, 0.5]) == [
        10.0,
        20.0,
    ]
    # A floor stage busier than the reference scales with the load, never faster:
    # mu · rho / rho_eff gives k = ceil(k_plan · r/λ) whatever its busy fraction.
    hot = effective_throughputs([10.0, 20.0], [0.1, 0.5], [True, False], [0.9, 0.1])
    assert hot == [pytest.approx(10.0 * 0.1 / 0.5), 20.0]
