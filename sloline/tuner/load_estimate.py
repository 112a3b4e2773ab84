"""Which load the tuner provisions for: the rate Algorithms 3 and 4 put into
k_m = ceil(r · s_m / (mu_m · rho_m)) (InferLine §5), read from traffic envelopes.

The planner's rho_m is the utilisation of stage m at the planning trace's *mean* rate λ
(§5 "Initialization"), so k_m(λ) is the planned replica count and k_m(r) provisions for
``r`` as a sustained mean rate. Two readings of r:

- :func:`literal_load` is §5 as written: Alg. 3's r_max is the largest observed rate
  among the windows where the observed envelope exceeds the planning envelope, and Alg.
  4's λ_new is the largest recent 5 s rate. r_max is almost always a short window's
  peak, and every envelope's short-window peaks lie far above its mean (a Poisson stream
  at 150 rps peaks at ~220 rps in 0.3 s windows over a minute). So r_max provisions a
  peak as if it were the mean: any exceedance, however small, buys replicas for ~1.5x
  the load, and sampling noise between two one-minute envelopes triggers it.
- :func:`gaussian_load` compares like with like: it asks which *mean* rate a stream with
  the planning trace's burstiness would need to reach the observed envelope, window by
  window. The planning envelope is read as a Gaussian (central-limit) envelope, the
  standard statistical arrival curve of aggregated traffic in network calculus
  (Boorstyn, Burchard, Liebeherr, Oottamakorn, "Statistical service assurances for
  traffic scheduling algorithms", IEEE JSAC 2000): the largest count in a window of w
  seconds is ``q(w) = λ·w + c_w·sqrt(λ·w)``, a mean plus ``c_w`` standard deviations of
  a Poisson-like count. :func:`fluctuations` calibrates ``c_w`` on the plan (the
  planning envelope is reproduced exactly at λ); :func:`equivalent_rate` inverts the
  model for an observed count. The load estimate is the largest equivalent rate over
  the windows: a burstier stream at the same mean has larger short-window counts, so a
  larger equivalent rate at short windows (burstiness is still detected, §5); a faster
  stream has a larger one at every window. Windows longer than the look-back are
  skipped (their counts are incomplete). At the largest window within the look-back,
  which measures the sustained rate, the observed rate is compared with λ itself
  (``c = 0``): the plan's rho_m is defined at λ, whatever the sample's window of that
  size happened to hold, and a look-back barely longer than the window holds about one
  position of it, so a maximum-over-positions ``c_w`` calibrated on the longer planning
  sample would read a rate increase as noise. Besides the envelope, the mean of the λ
  windows is a sustained rate, compared with λ as it is. Alg. 4's λ_new, a largest 5 s
  rate, is read through the planning envelope at 5 s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sloline.common.envelope import Envelope

__all__ = [
    "Exceedance",
    "LoadEstimate",
    "equivalent_rate",
    "exceedances",
    "fluctuations",
    "gaussian_load",
    "literal_load",
    "planned_rate_at",
]


@dataclass(frozen=True, slots=True)
class Exceedance:
    """A window where the observed envelope exceeds the planning envelope (Alg. 3 l. 5)."""

    window_s: float
    observed_rps: float
    planned_rps: float


@dataclass(frozen=True, slots=True)
class LoadEstimate:
    """The rates Algorithms 3 and 4 provision for, each with the evidence behind it."""

    up_rps: float
    """Alg. 3's rate: every stage gets at least k_m(up_rps) replicas (0: no demand)."""
    up_reason: str
    down_rps: float | None
    """Alg. 4's λ_new; None without a full look-back of λ windows (no scale-down)."""
    down_reason: str


def exceedances(planning: Envelope, observed: Envelope) -> tuple[Exceedance, ...]:
    """Windows where the observed rate exceeds the planned one (Alg. 3 lines 3-6).

    Windows are matched by size; a window present in only one envelope is skipped. If the
    two share no window at all, the router and the plan disagree on T_s: that is an error.
    """
    return tuple(
        Exceedance(window, observed_rps, planned)
        for _, window, planned, observed_rps in _matched(planning, observed)
        if observed_rps > planned
    )


def _matched(planning: Envelope, observed: Envelope) -> list[tuple[int, float, float, float]]:
    """(index, window, planned rate, observed rate) for every window both envelopes have."""
    pairs = [
        (i, window, planned, observed_rps)
        for i, (window, planned) in enumerate(
            zip(planning.windows_s, planning.rates_rps, strict=True)
        )
        if (observed_rps := observed.rate_at(window)) is not None
    ]
    if not pairs and planning.windows_s and observed.windows_s:
        raise ValueError(
            f"observed envelope windows {observed.windows_s} share no size with the planning "
            f"envelope windows {planning.windows_s}; export the router's envelope with the "
            "plan's window base T_s (window_sizes(T_s))"
        )
    return pairs


def _fluctuation(planned_rps: float, rate_rps: float, window_s: float) -> float:
    mean = rate_rps * window_s
    if mean <= 0.0:
        return 0.0
    return max(0.0, (planned_rps * window_s - mean) / math.sqrt(mean))


def fluctuations(
    planning: Envelope, rate_rps: float, max_window_s: float = math.inf
) -> tuple[float, ...]:
    """c_w per planning window: how many sqrt(mean count) standard deviations the planning
    trace's largest count in w exceeds its mean count λ·w (>= 0). 0 from the largest
    window within ``max_window_s`` (the look-back) on: that window measures the sustained
    rate of the look-back and is compared with λ itself."""
    within = [w for w in planning.windows_s if w <= max_window_s]
    sustained_s = within[-1] if within else math.inf
    return tuple(
        0.0 if window >= sustained_s else _fluctuation(planned_rps, rate_rps, window)
        for window, planned_rps in zip(planning.windows_s, planning.rates_rps, strict=True)
    )


def equivalent_rate(count: float, fluctuation: float, window_s: float) -> float:
    """The mean rate λ' with ``λ'·w + c·sqrt(λ'·w) = count``: the stream with the planning
    burstiness ``c`` whose largest count in a window of ``w`` seconds is ``count``."""
    if count <= 0.0:
        return 0.0
    # The root of u² + c·u - count = 0 in the form that neither cancels nor overflows.
    root = 2.0 * count / (fluctuation + math.hypot(fluctuation, 2.0 * math.sqrt(count)))
    return root * root / window_s


def planned_rate_at(planning: Envelope, window_s: float) -> float:
    """The planning envelope's rate at any window size: linear in log(window) between its
    windows, its first or last rate outside them."""
    windows, rates = planning.windows_s, planning.rates_rps
    if window_s <= windows[0]:
        return rates[0]
    for (w0, r0), (w1, r1) in itertools.pairwise(zip(windows, rates, strict=True)):
        if window_s <= w1:
            t = math.log(window_s / w0) / math.log(w1 / w0)
            return r0 + t * (r1 - r0)
    return rates[-1]


def _evidence(lambdas_rps: Sequence[float], lambda_count: int) -> float | None:
    return max(lambdas_rps) if len(lambdas_rps) >= lambda_count and lambdas_rps else None


def gaussian_load(
    planning: Envelope,
    planning_rate_rps: float,
    observed: Envelope,
    lambdas_rps: Sequence[float],
    *,
    lambda_window_s: float,
    lambda_count: int,
    max_window_s: float,
) -> LoadEstimate:
    """The equivalent mean rates of the observed envelope (windows up to ``max_window_s``,
    the look-back) and of λ_new, and the mean of the λ windows (module docstring)."""
    c_w = fluctuations(planning, planning_rate_rps, max_window_s)
    best = (0.0, 0.0, 0.0, 0.0)  # (equivalent rate, window, observed, planned)
    for i, window, planned, observed_rps in _matched(planning, observed):
        rate = equivalent_rate(observed_rps * window, c_w[i], window)
        if window <= max_window_s and rate > best[0]:
            best = (rate, window, observed_rps, planned)
    up, window, observed_rps, planned = best
    up_reason = (
        f"load {up:.4g} rps (the planning trace's mean {planning_rate_rps:.4g} rps with its "
        f"burstiness, scaled to the observed {observed_rps:.4g} rps vs planned "
        f"{planned:.4g} rps at window {window:g} s)"
    )
    sustained = sum(lambdas_rps) / len(lambdas_rps) if lambdas_rps else 0.0
    if sustained > up:
        up = sustained
        up_reason = (
            f"load {up:.4g} rps (the mean of {len(lambdas_rps)} windows of "
            f"{lambda_window_s:g} s, vs the planning trace's mean {planning_rate_rps:.4g} rps)"
        )
    if up <= 0.0:
        up_reason = "no arrivals observed"
    lambda_new = _evidence(lambdas_rps, lambda_count)
    if lambda_new is None:
        return LoadEstimate(up, up_reason, None, "")
    planned_w = planned_rate_at(planning, lambda_window_s)
    c = _fluctuation(planned_w, planning_rate_rps, lambda_window_s)
    down = equivalent_rate(lambda_new * lambda_window_s, c, lambda_window_s)
    down_reason = (
        f"lambda_new={lambda_new:.4g} rps (max of {len(lambdas_rps)} windows of "
        f"{lambda_window_s:g} s; planned {planned_w:.4g} rps at {lambda_window_s:g} s) -> "
        f"load {down:.4g} rps"
    )
    return LoadEstimate(up, up_reason, down, down_reason)


def literal_load(
    planning: Envelope,
    observed: Envelope,
    lambdas_rps: Sequence[float],
    *,
    lambda_window_s: float,
    lambda_count: int,
) -> LoadEstimate:
    """§5 as written: r_max, the largest observed rate among the windows that exceed the
    planning envelope (0 if none does), and λ_new, the largest recent λ window."""
    over = exceedances(planning, observed)
    up_reason = "observed envelope within the plan"
    r_max = 0.0
    if over:
        worst = max(over, key=lambda e: e.observed_rps)
        r_max = worst.observed_rps
        listed = ", ".join(
            f"{e.window_s:g} s ({e.observed_rps:.6g} > {e.planned_rps:.6g} rps)" for e in over
        )
        up_reason = (
            f"observed envelope exceeds the plan at window(s) {listed}; "
            f"r_max={r_max:.6g} rps at window {worst.window_s:g} s"
        )
    lambda_new = _evidence(lambdas_rps, lambda_count)
    if lambda_new is None:
        return LoadEstimate(r_max, up_reason, None, "")
    down_reason = (
        f"lambda_new={lambda_new:.6g} rps (max of {len(lambdas_rps)} windows of "
        f"{lambda_window_s:g} s)"
    )
    return LoadEstimate(r_max, up_reason, lambda_new, down_reason)
