"""Seeded time-varying workloads for the closed-loop simulation (InferLine §6, §7).

InferLine evaluates its tuner on gamma arrival processes whose rate or burstiness (CV²)
evolves over time (§6 "Workload Setup"): a rate ramp from the planned 150 to 250 qps
(Fig. 11, Fig. 8), a change from CV² 1 to 4 at the same rate (Fig. 12), and replays of the
minute-level request rates of the AutoScale traces (Gandhi et al. 2012) — each minute's
mean rate sampled for 30 s with CV² 1, the series rescaled so its peak is a chosen rate,
the first 25 % of the trace used as the planner's sample and the rest served live
(Fig. 7). The AutoScale traces cannot be downloaded here, so :func:`autoscale_trace`
draws minute-level series from the documented synthetic model below instead.

**Arrivals under a changing rate: time rescaling.** With Λ(t) = ∫₀ᵗ rate, a renewal
process of unit rate and squared coefficient of variation CV² in "operational time"
s = Λ(t), mapped back through t = Λ⁻¹(s), has instantaneous rate rate(t) and the given
CV² at every rate. The rate is piecewise linear between knots (a knot repeated at one
time is a jump), so Λ is piecewise quadratic and inverted in closed form, vectorised.
CV² is piecewise constant; each CV² segment starts a fresh renewal process.

Every generator is deterministic in its seed; planning samples use a separate stream,
as InferLine generates separate traces for planning and evaluation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sloline.common.trace import gamma_arrivals, trace_from_timestamps

__all__ = [
    "Trace",
    "autoscale_rates",
    "autoscale_trace",
    "burst_trace",
    "modulated_arrivals",
    "ramp_trace",
    "spike_trace",
    "standard_traces",
]

FloatArray = npt.NDArray[np.float64]
_PLANNING_STREAM = 1  # SeedSequence spawn key of planning samples


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A live trace (sorted arrivals in [0, duration_s)), the planner's sample trace, and
    the times at which the load changes (time to recover is measured from each)."""

    name: str
    arrivals_s: FloatArray
    duration_s: float
    planning_s: FloatArray
    changes_s: tuple[float, ...] = ()
    description: str = ""

    @classmethod
    def from_timestamps(
        cls, name: str, timestamps_s: npt.ArrayLike, *, sample_fraction: float = 0.25
    ) -> Trace:
        """A recorded trace split as in InferLine §6: the first ``sample_fraction`` of its
        span plans, the rest is served live (shifted to start at 0)."""
        if not 0.0 < sample_fraction < 1.0:
            raise ValueError(f"sample_fraction must be in (0, 1), got {sample_fraction}")
        times = trace_from_timestamps(timestamps_s)
        split = float(times[-1]) * sample_fraction
        live = times[times >= split] - split
        if live.size < 2 or np.count_nonzero(times < split) < 2:
            raise ValueError(
                f"trace {name!r} is too short to split into a planning sample and a live part"
            )
        return cls(
            name,
            live,
            float(live[-1]) + 1e-9,
            times[times < split],
            description=f"recorded trace, first {sample_fraction:.0%} plans",
        )


def _segments(
    knots: Sequence[tuple[float, float]], duration_s: float
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Positive-length linear pieces (t0, t1, r0, r1) covering [0, duration_s]; the rate
    is held constant before the first and after the last knot."""
    if not knots:
        raise ValueError("a rate profile needs at least one (time, rate) knot")
    points = sorted(knots, key=lambda k: k[0])  # stable: a repeated time keeps its order
    if any(not (math.isfinite(r) and r > 0.0) for _, r in points):
        raise ValueError(f"rates must be positive and finite, got {[r for _, r in points]}")
    points = [(0.0, points[0][1]), *points, (duration_s, points[-1][1])]
    pieces = [
        (t0, t1, r0, r1)
        for (t0, r0), (t1, r1) in itertools.pairwise(points)
        if t1 > t0 and t0 < duration_s and t1 > 0.0
    ]
    t0, t1, r0, r1 = (np.array(col, dtype=np.float64) for col in zip(*pieces, strict=True))
    return t0, t1, r0, r1


def modulated_arrivals(
    knots: Sequence[tuple[float, float]],
    duration_s: float,
    *,
    cv2: Sequence[tuple[float, float]] = ((0.0, 1.0),),
    seed: int = 0,
) -> FloatArray:
    """Arrival times in [0, duration_s) following a piecewise-linear rate through
    ``knots`` (time s, rate rps) with gamma inter-arrivals of the piecewise-constant
    ``cv2`` ((start s, CV²), ...), by time rescaling (module docstring)."""
    if not (math.isfinite(duration_s) and duration_s > 0.0):
        raise ValueError(f"duration must be > 0 seconds, got {duration_s!r}")
    t0, t1, r0, r1 = _segments(knots, duration_s)
    width = t1 - t0
    mass = 0.5 * (r0 + r1) * width
    lam0 = np.concatenate(([0.0], np.cumsum(mass)))  # Λ at each piece's start

    def cumulative(t: float) -> float:
        i = int(np.clip(np.searchsorted(t1, t, side="left"), 0, t0.size - 1))
        dt = min(max(t - t0[i], 0.0), width[i])
        return float(lam0[i] + r0[i] * dt + 0.5 * (r1[i] - r0[i]) / width[i] * dt * dt)

    rng = np.random.default_rng(seed)
    cuts = sorted((max(0.0, float(s)), float(c)) for s, c in cv2)
    if not cuts or any(not (math.isfinite(c) and c > 0.0) for _, c in cuts):
        raise ValueError(f"CV² segments must be (start s, CV² > 0) pairs, got {list(cv2)}")
    parts: list[FloatArray] = []
    for (start, c), (end, _) in zip(cuts, [*cuts[1:], (duration_s, 0.0)], strict=True):
        if end <= start or start >= duration_s:
            continue
        lo, hi = cumulative(start), cumulative(min(end, duration_s))
        expected = hi - lo
        chunk = int(expected + 6.0 * math.sqrt(expected * c) + 16)
        points: list[FloatArray] = []
        last = lo
        while last < hi:
            step = last + np.cumsum(rng.gamma(1.0 / c, c, size=chunk))
            points.append(step)
            last = float(step[-1])
        s = np.concatenate(points)
        parts.append(s[s < hi])
    s = np.concatenate(parts) if parts else np.empty(0)
    # Invert Λ piece by piece: a·dt² + b·dt = c with a = (r1 - r0) / (2 width), b = r0.
    i = np.clip(np.searchsorted(lam0[1:], s, side="right"), 0, t0.size - 1)
    c_ = s - lam0[i]
    a = 0.5 * (r1[i] - r0[i]) / width[i]
    b = r0[i]
    dt = 2.0 * c_ / (b + np.sqrt(np.maximum(b * b + 4.0 * a * c_, 0.0)))
    times = np.minimum(t0[i] + dt, t1[i])
    return np.sort(times[times < duration_s])


def _planning(rate_rps: float, duration_s: float, cv2: float, seed: int) -> FloatArray:
    stream = int(np.random.SeedSequence(seed, spawn_key=(_PLANNING_STREAM,)).generate_state(1)[0])
    return gamma_arrivals(rate_rps, duration_s, cv2=cv2, seed=stream)


def ramp_trace(
    start_rps: float = 150.0,
    end_rps: float = 250.0,
    *,
    warm_s: float = 120.0,
    ramp_s: float = 60.0,
    hold_s: float = 240.0,
    tail_s: float = 120.0,
    cv2: float = 1.0,
    planning_s: float = 60.0,
    seed: int = 0,
) -> Trace:
    """Rate ramp (InferLine Fig. 11): ``start_rps`` for ``warm_s``, up to ``end_rps`` over
    ``ramp_s`` (the transition time τ), held for ``hold_s``, back down over ``ramp_s``,
    then ``start_rps`` for ``tail_s``. The planner sees ``start_rps``."""
    up, top = warm_s, warm_s + ramp_s
    down = top + hold_s
    duration = down + ramp_s + tail_s
    knots = [(up, start_rps), (top, end_rps), (down, end_rps), (down + ramp_s, start_rps)]
    return Trace(
        "ramp",
        modulated_arrivals(knots, duration, cv2=((0.0, cv2),), seed=seed),
        duration,
        _planning(start_rps, planning_s, cv2, seed),
        (up, down),
        f"{start_rps:g} -> {end_rps:g} rps over {ramp_s:g} s, held {hold_s:g} s, back down",
    )


def burst_trace(
    rate_rps: float = 150.0,
    *,
    cv2_from: float = 1.0,
    cv2_to: float = 4.0,
    warm_s: float = 120.0,
    burst_s: float = 300.0,
    tail_s: float = 180.0,
    planning_s: float = 60.0,
    seed: int = 0,
) -> Trace:
    """Burstiness change at an equal rate (InferLine Fig. 12): CV² ``cv2_from`` for
    ``warm_s``, ``cv2_to`` for ``burst_s``, then ``cv2_from`` again."""
    end = warm_s + burst_s
    duration = end + tail_s
    return Trace(
        "burst",
        modulated_arrivals(
            [(0.0, rate_rps)],
            duration,
            cv2=((0.0, cv2_from), (warm_s, cv2_to), (end, cv2_from)),
            seed=seed,
        ),
        duration,
        _planning(rate_rps, planning_s, cv2_from, seed),
        (warm_s, end),
        f"{rate_rps:g} rps, CV² {cv2_from:g} -> {cv2_to:g} for {burst_s:g} s -> {cv2_from:g}",
    )


def spike_trace(
    rate_rps: float = 150.0,
    *,
    factor: float = 2.0,
    at_s: float = 180.0,
    decay_s: float = 60.0,
    duration_s: float = 600.0,
    cv2: float = 1.0,
    planning_s: float = 60.0,
    seed: int = 0,
) -> Trace:
    """Sudden spike and decay (InferLine Fig. 7b): the rate jumps from ``rate_rps`` to
    ``factor`` times it at ``at_s`` and decays back exponentially with time constant
    ``decay_s`` (linear pieces every decay_s / 12, for six time constants)."""
    extra = (factor - 1.0) * rate_rps
    offsets = np.arange(0.0, 6.0 * decay_s + 1e-9, decay_s / 12.0)
    knots = [(at_s, rate_rps)] + [
        (at_s + float(o), rate_rps + extra * math.exp(-float(o) / decay_s)) for o in offsets
    ]
    knots.append((at_s + 6.0 * decay_s + 1e-6, rate_rps))
    return Trace(
        "spike",
        modulated_arrivals(knots, duration_s, cv2=((0.0, cv2),), seed=seed),
        duration_s,
        _planning(rate_rps, planning_s, cv2, seed),
        (at_s,),
        f"{rate_rps:g} rps, x{factor:g} at {at_s:g} s, decaying with tau={decay_s:g} s",
    )


def autoscale_rates(
    minutes: int = 24,
    *,
    peak_rps: float = 300.0,
    trough: float = 0.35,
    noise: float = 0.08,
    seed: int = 0,
) -> FloatArray:
    """A minute-level request-rate series in the style of the AutoScale traces.

    Model: a diurnal swing ``trough + (1 - trough)·(1 - cos(2π k / minutes)) / 2`` over
    the series (low, peak in the middle, low again), times log-normal noise from an AR(1)
    process (coefficient 0.7, innovation ``noise``), plus one flash crowd (x1.5 for two
    minutes) at a random minute in the second quarter; rescaled so that the largest rate
    is ``peak_rps`` (InferLine and AutoScale rescale traces to the cluster's peak)."""
    rng = np.random.default_rng(seed)
    k = np.arange(minutes, dtype=np.float64)
    level = trough + (1.0 - trough) * 0.5 * (1.0 - np.cos(2.0 * np.pi * k / minutes))
    ar = np.zeros(minutes)
    for i in range(1, minutes):
        ar[i] = 0.7 * ar[i - 1] + noise * rng.standard_normal()
    rates = level * np.exp(ar)
    flash = int(rng.integers(minutes // 4, max(minutes // 4 + 1, minutes // 2)))
    rates[flash : flash + 2] *= 1.5
    return np.asarray(rates * (peak_rps / rates.max()), dtype=np.float64)


def autoscale_trace(
    peak_rps: float = 300.0,
    *,
    minutes: int = 24,
    step_s: float = 30.0,
    sample_fraction: float = 0.25,
    seed: int = 0,
) -> Trace:
    """Minute-level rates (:func:`autoscale_rates`) each served for ``step_s`` with
    gamma(CV² 1) arrivals, as InferLine replays the AutoScale traces (§6): the first
    ``sample_fraction`` plans, the rest is the live trace. Load changes are the steps
    whose rate differs from the previous one by at least 10 %."""
    rates = autoscale_rates(minutes, peak_rps=peak_rps, seed=seed)
    duration = minutes * step_s
    knots: list[tuple[float, float]] = []
    for i, rate in enumerate(rates.tolist()):
        knots += [(i * step_s, rate), ((i + 1) * step_s, rate)]
    times = modulated_arrivals(knots, duration, seed=seed)
    split = math.ceil(minutes * sample_fraction) * step_s
    first = math.ceil(minutes * sample_fraction)
    changes = tuple(
        i * step_s - split
        for i in range(first + 1, minutes)
        if abs(rates[i] - rates[i - 1]) >= 0.1 * rates[i - 1]
    )
    return Trace(
        "autoscale",
        times[times >= split] - split,
        duration - split,
        times[times < split],
        changes,
        f"{minutes} minute-level rates (peak {peak_rps:g} rps) x {step_s:g} s, first {first} plan",
    )


def standard_traces(base_rps: float, *, scale: float = 1.0, seed: int = 0) -> tuple[Trace, ...]:
    """The four families at InferLine's proportions for a pipeline planned at
    ``base_rps``: ramp to 5/3 of it (150 -> 250), CV² 1 -> 4, a x2 spike, and AutoScale-
    style rates peaking at twice it. ``scale`` shrinks every duration (smoke runs)."""
    return (
        ramp_trace(
            base_rps,
            base_rps * 5.0 / 3.0,
            warm_s=120.0 * scale,
            ramp_s=60.0 * scale,
            hold_s=240.0 * scale,
            tail_s=120.0 * scale,
            seed=seed,
        ),
        burst_trace(
            base_rps, warm_s=120.0 * scale, burst_s=300.0 * scale, tail_s=180.0 * scale, seed=seed
        ),
        spike_trace(
            base_rps, at_s=180.0 * scale, decay_s=60.0 * scale, duration_s=600.0 * scale, seed=seed
        ),
        autoscale_trace(2.0 * base_rps, step_s=30.0 * scale, seed=seed),
    )
