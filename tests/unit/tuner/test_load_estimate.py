"""Which load the tuner provisions for (sloline.tuner.load_estimate): the Gaussian-envelope
reading of the observed envelope against §5's literal r_max."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sloline.common.envelope import Envelope, window_sizes
from sloline.tuner.load_estimate import (
    LoadEstimate,
    equivalent_rate,
    fluctuations,
    gaussian_load,
    planned_rate_at,
)
from sloline.tuner.policy import (
    StageState,
    TunerContext,
    TunerSettings,
    decide,
    estimate_load,
)

# The cpu-text pipeline's plan at 150 rps (docs/tuner.md): T_s = 0.29 s, λ = 149.2 rps.
CPU_WINDOWS = window_sizes(0.28988888888888886, 40.0)
CPU_PLAN = Envelope(CPU_WINDOWS, (224.0, 195.0, 180.0, 169.0, 166.0, 157.0, 153.0, 151.0))
CPU_RATE = 149.23
CPU_SETTINGS = TunerSettings(window_base_s=CPU_WINDOWS[0], window_max_s=CPU_WINDOWS[-1])
CLASSIFY = StageState("classify", 3, 3, 1, 64, 1.0, 75.5, CPU_RATE / (3 * 75.5))


def gaussian(rate: float, cs: tuple[float, ...], windows: tuple[float, ...]) -> Envelope:
    """The envelope of a stream with burstiness ``cs`` at mean ``rate`` (the model)."""
    return Envelope(
        windows,
        tuple((rate * w + c * math.sqrt(rate * w)) / w for w, c in zip(windows, cs, strict=True)),
    )


def cpu_load(observed: Envelope, lambdas: tuple[float, ...]) -> LoadEstimate:
    """:func:`gaussian_load` against the cpu-text plan with the default look-backs."""
    return gaussian_load(
        CPU_PLAN,
        CPU_RATE,
        observed,
        lambdas,
        lambda_window_s=5.0,
        lambda_count=6,
        max_window_s=30.0,
    )


def cpu_context(
    observed: Envelope,
    *,
    stage: StageState = CLASSIFY,
    lambdas: tuple[float, ...] = (),
    rate: float | None = CPU_RATE,
) -> TunerContext:
    return TunerContext(
        now_s=100.0,
        stages=(stage,),
        planning_envelope=CPU_PLAN,
        observed_envelope=observed,
        recent_lambdas_rps=lambdas,
        last_change_s=0.0,
        planning_rate_rps=rate,
    )


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(1e-3, 1e5),
    c=st.floats(0.0, 50.0),
    window=st.sampled_from(CPU_WINDOWS),
)
def test_equivalent_rate_inverts_the_gaussian_envelope(
    rate: float, c: float, window: float
) -> None:
    count = rate * window + c * math.sqrt(rate * window)
    assert equivalent_rate(count, c, window) == pytest.approx(rate, rel=1e-9)
    assert equivalent_rate(count * 1.01, c, window) > equivalent_rate(count, c, window)


def test_equivalent_rate_edges() -> None:
    assert equivalent_rate(0.0, 3.0, 0.5) == 0.0
    assert equivalent_rate(10.0, 0.0, 0.5) == pytest.approx(20.0)  # no burstiness: the rate
    assert math.isfinite(equivalent_rate(1e4, 1e200, 0.25))


@settings(max_examples=100, deadline=None)
@given(
    rate=st.floats(0.5, 1e4),
    excess=st.lists(st.floats(0.0, 5.0), min_size=len(CPU_WINDOWS), max_size=len(CPU_WINDOWS)),
)
def test_fluctuations_reproduce_the_planning_envelope(rate: float, excess: list[float]) -> None:
    """At the planning envelope itself the load is the planned mean, window by window."""
    planning = Envelope(CPU_WINDOWS, tuple(rate * (1 + e) for e in excess))
    cs = fluctuations(planning, rate)
    assert cs[-1] == 0.0 and all(c >= 0.0 for c in cs)
    for w, r, c in zip(CPU_WINDOWS[:-1], planning.rates_rps, cs, strict=False):
        assert equivalent_rate(r * w, c, w) == pytest.approx(rate, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    rate=st.floats(1.0, 1e4),
    replicas=st.integers(1, 40),
    mu=st.floats(0.5, 1e3),
    factor=st.floats(1.0, 4.0),
)
def test_plan_holds_at_its_own_envelope_and_scales_with_the_rate(
    rate: float, replicas: int, mu: float, factor: float
) -> None:
    """The planned replicas at the planning envelope (no decision), and ceil(n·x) replicas
    when the stream's mean grows by x with its burstiness unchanged. The model plan shows
    its mean at the sustained window (the largest within the 30 s look-back)."""
    cs = fluctuations(CPU_PLAN, CPU_RATE, CPU_SETTINGS.envelope_lookback_s)
    planning = gaussian(rate, cs, CPU_WINDOWS)
    planned = StageState("m", replicas, replicas, 1, 10**6, 1.0, mu, rate / (replicas * mu))

    def ctx(observed: Envelope) -> TunerContext:
        return TunerContext(100.0, (planned,), planning, observed, (), 0.0, rate)

    assume(abs(replicas * factor - round(replicas * factor)) > 1e-6)
    assert decide(ctx(planning), CPU_SETTINGS).decisions == ()
    scaled = ctx(gaussian(rate * factor, cs, CPU_WINDOWS))
    assert estimate_load(scaled, CPU_SETTINGS).up_rps == pytest.approx(rate * factor, rel=1e-9)
    want = math.ceil(replicas * factor)
    ups = decide(scaled, CPU_SETTINGS).decisions
    assert [d.to_replicas for d in ups] == ([want] if want > replicas else [])


def test_noise_at_a_short_window_is_not_provisioned_as_a_sustained_rate() -> None:
    """234 vs 224 rps at 0.29 s (a 0.3 s count of 68 vs 65 arrivals): §5's r_max provisions
    234 rps as the mean, ~1.6x the plan; the default reads it as ~6 % more load."""
    observed = Envelope(CPU_WINDOWS, (234.0, *CPU_PLAN.rates_rps[1:]))
    ctx = cpu_context(observed)
    (paper,) = decide(ctx, CPU_SETTINGS, estimate_load(ctx, CPU_SETTINGS, literal=True)).decisions
    assert paper.to_replicas == math.ceil(234.0 / (75.5 * CLASSIFY.max_provisioning_ratio)) == 5
    load = estimate_load(ctx, CPU_SETTINGS)
    assert CPU_RATE < load.up_rps < 1.08 * CPU_RATE
    (ours,) = decide(ctx, CPU_SETTINGS).decisions
    assert ours.to_replicas == 4
    assert "load 15" in ours.reason and "at window 0.289889 s" in ours.reason


def test_burstier_stream_at_the_same_mean_scales_up_from_short_windows() -> None:
    cs = fluctuations(CPU_PLAN, CPU_RATE)
    bursty = gaussian(CPU_RATE, tuple(2.0 * c for c in cs), CPU_WINDOWS)  # CV² ~4
    load = estimate_load(cpu_context(bursty), CPU_SETTINGS)
    assert load.up_rps > 1.3 * CPU_RATE
    assert "window 0.289889 s" in load.up_reason
    (d,) = decide(cpu_context(bursty), CPU_SETTINGS).decisions
    assert d.to_replicas > 3


def test_below_the_plan_a_stage_under_its_demand_scales_up_again() -> None:
    """After Alg. 4 went to 1 replica, traffic at 80 % of the planned rate is still below
    the planning envelope (§5's Alg. 3 never fires) but needs 3 replicas."""
    low = StageState("classify", 1, 1, 1, 64, 1.0, 75.5, CLASSIFY.max_provisioning_ratio)
    observed = gaussian(0.8 * CPU_RATE, fluctuations(CPU_PLAN, CPU_RATE), CPU_WINDOWS)
    assert all(o < p for o, p in zip(observed.rates_rps, CPU_PLAN.rates_rps, strict=True))
    ctx = cpu_context(observed, stage=low)
    assert decide(ctx, CPU_SETTINGS, estimate_load(ctx, CPU_SETTINGS, literal=True)).decisions == ()
    (d,) = decide(ctx, CPU_SETTINGS).decisions
    assert (d.from_replicas, d.to_replicas) == (1, math.ceil(3 * 0.8))


def test_lambda_new_is_read_against_the_planning_envelope_at_its_window() -> None:
    """λ_new, a largest 5 s rate, equal to the plan's own 5 s rate is the planned load."""
    at_5s = planned_rate_at(CPU_PLAN, 5.0)
    load = cpu_load(CPU_PLAN, (at_5s,) * 6)
    assert load.down_rps == pytest.approx(CPU_RATE, rel=1e-9)
    assert "lambda_new=" in load.down_reason
    short = cpu_load(CPU_PLAN, (at_5s,) * 5)
    assert short.down_rps is None  # not a full look-back: no scale-down


def test_windows_beyond_the_look_back_and_the_sustained_rate() -> None:
    """The 37 s window is longer than the 30 s look-back: its rate says nothing and is
    skipped. The 18.6 s window, the largest within it, and the mean of the λ windows are
    sustained rates, compared with λ as they are."""
    assert CPU_WINDOWS[-2] < 30.0 < CPU_WINDOWS[-1]
    assert fluctuations(CPU_PLAN, CPU_RATE, 30.0)[-2:] == (0.0, 0.0)
    assert fluctuations(CPU_PLAN, CPU_RATE)[-2] > 1.0  # as a short window of a longer look-back
    observed = Envelope(CPU_WINDOWS, (*CPU_PLAN.rates_rps[:-1], 2.0 * CPU_RATE))
    calm = cpu_load(observed, ())
    assert calm.up_rps == pytest.approx(CPU_PLAN.rates_rps[-2], rel=1e-9)  # 153, not 298
    assert f"at window {CPU_WINDOWS[-2]:g} s" in calm.up_reason and calm.down_rps is None
    busy = cpu_load(observed, (160.0,) * 3 + (170.0,) * 3)
    assert busy.up_rps == pytest.approx(165.0)
    assert "the mean of 6 windows of 5 s" in busy.up_reason
    assert busy.down_rps is not None and busy.down_rps < 170.0  # 5 s peaks read as a mean


def test_a_step_seen_through_a_short_look_back_is_not_read_as_noise() -> None:
    """A look-back barely longer than the sustained window holds one position of it: a
    2x rate there is 2x the load, not the planning sample's maximum over many positions."""
    observed = Envelope(CPU_WINDOWS, tuple(2.0 * CPU_RATE for _ in CPU_WINDOWS))
    short = gaussian_load(
        CPU_PLAN,
        CPU_RATE,
        observed,
        (),
        lambda_window_s=5.0,
        lambda_count=6,
        max_window_s=5.0,
    )
    assert short.up_rps == pytest.approx(2.0 * CPU_RATE)
    assert f"at window {CPU_WINDOWS[4]:g} s" in short.up_reason


def test_planned_rate_at_interpolates_in_log_window() -> None:
    plan = Envelope((1.0, 4.0), (100.0, 60.0))
    assert planned_rate_at(plan, 1.0) == 100.0 and planned_rate_at(plan, 4.0) == 60.0
    assert planned_rate_at(plan, 2.0) == pytest.approx(80.0)
    assert planned_rate_at(plan, 0.1) == 100.0 and planned_rate_at(plan, 9.0) == 60.0


def test_without_a_planning_rate_the_largest_window_stands_in() -> None:
    ctx = cpu_context(CPU_PLAN, rate=None)
    assert ctx.planned_rate_rps == CPU_PLAN.rates_rps[-1]
    with pytest.raises(ValueError, match="planning rate"):
        cpu_context(CPU_PLAN, rate=-1.0)
