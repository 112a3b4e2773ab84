"""Trace shapes of production traffic, for the held-out evaluation.

Each generator returns a :class:`~sloline.lab.traces.Trace` around a base rate: live
arrivals on [0, duration_s) and a *planning sample*, an independent realisation of the
same process over the first quarter (``PLAN_FRACTION``) of the time (what an operator
would have recorded before the run: the base regime, without the flash crowd or the
growth still to come). Arrivals under a changing rate are a non-homogeneous Poisson process drawn by
thinning (Lewis and Shedler): candidates at the peak rate, each kept with probability
rate(t) / peak. The shapes, after the published characterisations:

- ``diurnal``: the daily cycle of interactive services and of the Azure Functions traces
  ("Serverless in the Wild", Shahrad et al.), compressed to one period per run, with
  slow multiplicative noise (a mean-reverting log-normal process, knots every 10 s);
- ``flash-crowd``: a sudden surge of 3-5x the base rate held for 10-60 s, with a ramp up
  and a decay (the "flash crowd" / Slashdot effect of Jung, Krishnamurthy and Rabinovich);
- ``growth``: a slow linear ramp to 2-3x the base rate over the run (organic growth, a
  launch or a migration shifting traffic);
- ``mmpp``: a two-state Markov-modulated Poisson process (Heffes and Lucantoni), a calm
  state at the base rate and a burst state at 2-4x it, exponential holding times (each
  burst's onset is a load change);
- ``heavy-tailed``: a renewal process with log-normal inter-arrivals of squared
  coefficient of variation 4-10 at the base rate (heavy-tailed, highly variable
  inter-arrival times, as the Azure Functions traces report for many functions and
  Crovella and Bestavros for web traffic).

Every generator is deterministic per seed; keyword arguments left None are drawn from
it (and written into the trace's description).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from sloline.lab.traces import Trace

__all__ = [
    "SHAPES",
    "diurnal",
    "flash_crowd",
    "flash_profile",
    "growth",
    "heavy_tailed",
    "mmpp",
    "shape_trace",
    "thinned",
]

FloatArray = npt.NDArray[np.float64]
RateFn = Callable[[FloatArray], FloatArray]
# a realisation on [0, span): arrivals and the times its load changes
Realisation = tuple[FloatArray, tuple[float, ...]]
Draw = Callable[[np.random.Generator, float], Realisation]
PLAN_FRACTION = 0.25


def thinned(
    rng: np.random.Generator, rate: RateFn, peak_rps: float, duration_s: float
) -> FloatArray:
    """A non-homogeneous Poisson process of intensity ``rate`` (<= ``peak_rps``) on
    [0, duration_s), by thinning a homogeneous one at ``peak_rps``."""
    n = int(rng.poisson(peak_rps * duration_s))
    candidates = np.sort(rng.uniform(0.0, duration_s, size=n))
    keep = rng.random(n) * peak_rps < rate(candidates)
    return candidates[keep]


def _split(
    name: str,
    draw: Draw,
    duration_s: float,
    rngs: list[np.random.Generator],
    description: str,
) -> Trace:
    live, changes_s = draw(rngs[0], duration_s)
    planning, _ = draw(rngs[1], duration_s * PLAN_FRACTION)
    if live.size < 2 or planning.size < 2:
        raise ValueError(f"{name}: too few arrivals; raise the rate or the duration")
    return Trace(name, live, duration_s, planning, changes_s, description)


def _rngs(seed: int, shape: str) -> tuple[np.random.Generator, list[np.random.Generator]]:
    """Parameter, live and planning streams of ``seed`` for ``shape``."""
    params, live, planning = np.random.SeedSequence([seed, *shape.encode()]).spawn(3)
    return np.random.default_rng(params), [
        np.random.default_rng(live),
        np.random.default_rng(planning),
    ]


def diurnal(
    base_rps: float,
    duration_s: float,
    seed: int,
    *,
    amplitude: float | None = None,
    phase: float | None = None,
    noise: float | None = None,
) -> Trace:
    """rate(t) = base · (1 + amplitude · sin(2πt/duration + phase)) · exp(x(t)), x an
    AR(1) process between knots 10 s apart (correlation 0.8, stationary standard
    deviation ``noise``, clipped at 3 of them) interpolated linearly. Over one period
    the mean rate is about base; the planning sample sees the phase the run starts at."""
    p, rngs = _rngs(seed, "diurnal")
    a = float(amplitude if amplitude is not None else p.uniform(0.3, 0.6))
    ph = float(phase if phase is not None else p.uniform(0.0, 2.0 * math.pi))
    sigma = float(noise if noise is not None else p.uniform(0.05, 0.15))
    cap = base_rps * (1.0 + a) * math.exp(3.0 * sigma)

    def draw(rng: np.random.Generator, span: float) -> Realisation:
        knots = np.arange(0.0, span + 10.0, 10.0)
        walk = np.empty(knots.size)
        walk[0] = rng.normal(0.0, sigma)
        shocks = rng.normal(0.0, sigma * math.sqrt(1.0 - 0.8**2), size=knots.size)
        for k in range(1, knots.size):
            walk[k] = 0.8 * walk[k - 1] + shocks[k]
        walk = np.clip(walk, -3.0 * sigma, 3.0 * sigma)

        def rate(t: FloatArray) -> FloatArray:
            cycle = 1.0 + a * np.sin(2.0 * math.pi * t / duration_s + ph)
            return base_rps * cycle * np.exp(np.interp(t, knots, walk))

        return thinned(rng, rate, cap, span), ()

    desc = f"diurnal around {base_rps:.0f} rps, amplitude {a:.2f}, noise {sigma:.2f}"
    return _split("diurnal", draw, duration_s, rngs, desc)


def flash_profile(
    base_rps: float, peak: float, start_s: float, ramp_s: float, hold_s: float, decay_s: float
) -> RateFn:
    """The flash crowd's rate: base, a linear ramp to ``peak`` x base, a hold, a decay."""
    xs = [0.0, start_s, start_s + ramp_s, start_s + ramp_s + hold_s]
    xs.append(xs[-1] + decay_s)
    ys = [1.0, 1.0, peak, peak, 1.0]

    def rate(t: FloatArray) -> FloatArray:
        return base_rps * np.interp(t, xs, ys)

    return rate


def flash_crowd(
    base_rps: float,
    duration_s: float,
    seed: int,
    *,
    peak: float | None = None,
    start_s: float | None = None,
    ramp_s: float | None = None,
    hold_s: float | None = None,
    decay_s: float | None = None,
) -> Trace:
    """A surge to ``peak`` (3-5) x base, ramping over 2-10 s from ``start_s`` (40-60 %
    of the run), held 10-60 s (at most a quarter of the run), decaying over 10-30 s."""
    p, rngs = _rngs(seed, "flash-crowd")
    k = float(peak if peak is not None else p.uniform(3.0, 5.0))
    t0 = float(start_s if start_s is not None else p.uniform(0.4, 0.6) * duration_s)
    up = float(ramp_s if ramp_s is not None else p.uniform(2.0, 10.0))
    hold = float(hold_s if hold_s is not None else min(p.uniform(10.0, 60.0), duration_s / 4))
    down = float(decay_s if decay_s is not None else p.uniform(10.0, 30.0))
    rate = flash_profile(base_rps, k, t0, up, hold, down)

    def draw(rng: np.random.Generator, span: float) -> Realisation:
        changes = (t0,) if t0 < span else ()
        return thinned(rng, rate, base_rps * k, span), changes

    desc = (
        f"flash crowd {k:.1f}x {base_rps:.0f} rps at {t0:.0f} s "
        f"(ramp {up:.0f} s, hold {hold:.0f} s, decay {down:.0f} s)"
    )
    return _split("flash-crowd", draw, duration_s, rngs, desc)


def growth(base_rps: float, duration_s: float, seed: int, *, factor: float | None = None) -> Trace:
    """A linear ramp from base to ``factor`` (2-3) x base over the run."""
    p, rngs = _rngs(seed, "growth")
    g = float(factor if factor is not None else p.uniform(2.0, 3.0))

    def rate(t: FloatArray) -> FloatArray:
        return base_rps * (1.0 + (g - 1.0) * t / duration_s)

    def draw(rng: np.random.Generator, span: float) -> Realisation:
        return thinned(rng, rate, base_rps * g, span), ()

    return _split("growth", draw, duration_s, rngs, f"growth {base_rps:.0f} rps -> {g:.1f}x")


def mmpp(
    base_rps: float,
    duration_s: float,
    seed: int,
    *,
    burst: float | None = None,
    calm_s: float | None = None,
    burst_s: float | None = None,
) -> Trace:
    """Two states, calm at base and burst at ``burst`` (2-4) x base, with exponential
    holding times of mean ``calm_s`` (20-60 s) and ``burst_s`` (5-20 s); starts calm."""
    p, rngs = _rngs(seed, "mmpp")
    k = float(burst if burst is not None else p.uniform(2.0, 4.0))
    calm = float(calm_s if calm_s is not None else p.uniform(20.0, 60.0))
    hot = float(burst_s if burst_s is not None else p.uniform(5.0, 20.0))

    def draw(rng: np.random.Generator, span: float) -> Realisation:
        edges, levels, t, state = [0.0], [], 0.0, 0
        while t < span:
            levels.append(k if state else 1.0)
            t += float(rng.exponential(hot if state else calm))
            edges.append(t)
            state ^= 1
        bounds, rates = np.array(edges), np.array(levels) * base_rps

        def rate(times: FloatArray) -> FloatArray:
            return rates[np.searchsorted(bounds, times, side="right") - 1]

        onsets = tuple(float(e) for e in bounds[1::2] if e < span)
        return thinned(rng, rate, base_rps * k, span), onsets

    desc = f"MMPP {base_rps:.0f} rps / {k:.1f}x, mean holding {calm:.0f} s / {hot:.0f} s"
    return _split("mmpp", draw, duration_s, rngs, desc)


def heavy_tailed(
    base_rps: float, duration_s: float, seed: int, *, cv2: float | None = None
) -> Trace:
    """Log-normal inter-arrivals of mean 1/base and squared coefficient of variation
    ``cv2`` (4-10): σ² = ln(1 + cv2), μ = -ln(base) - σ²/2."""
    p, rngs = _rngs(seed, "heavy-tailed")
    c2 = float(cv2 if cv2 is not None else p.uniform(4.0, 10.0))
    s2 = math.log1p(c2)
    mu = -math.log(base_rps) - s2 / 2.0

    def draw(rng: np.random.Generator, span: float) -> Realisation:
        parts, last = [], 0.0
        chunk = int(base_rps * span) + 64
        while last < span:
            times = last + np.cumsum(rng.lognormal(mu, math.sqrt(s2), size=chunk))
            parts.append(times)
            last = float(times[-1])
        out = np.concatenate(parts)
        return out[out < span], ()

    desc = f"log-normal renewal at {base_rps:.0f} rps, CV² {c2:.1f}"
    return _split("heavy-tailed", draw, duration_s, rngs, desc)


SHAPES: dict[str, Callable[[float, float, int], Trace]] = {
    "diurnal": diurnal,
    "flash-crowd": flash_crowd,
    "growth": growth,
    "mmpp": mmpp,
    "heavy-tailed": heavy_tailed,
}


def shape_trace(shape: str, base_rps: float, duration_s: float, seed: int) -> Trace:
    """The trace of ``shape`` (one of :data:`SHAPES`) with its parameters drawn from ``seed``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown trace shape {shape!r}; choose from {', '.join(SHAPES)}")
    return SHAPES[shape](base_rps, duration_s, seed)
