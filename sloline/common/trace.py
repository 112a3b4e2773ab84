"""Planning traces: the arrival timestamps the planner provisions for (InferLine §3, §6).

A trace is a sorted float64 array of arrival times in seconds. It is either given (recorded
by the router, or listed in the pipeline's workload) or generated from a mean rate λ and a
squared coefficient of variation CV² of the inter-arrival times with gamma-distributed
inter-arrivals, as in the paper's synthetic workloads (§6: shape 1/CV², mean 1/λ; CV² = 1
is a Poisson process, larger is burstier). Generation takes a seed, so a trace is
reproducible.

**What the planner can simulate.** The planner replays the whole trace through its
estimator for every configuration it tries (about 250 bytes and 25,000-80,000 simulated
arrivals per second per try on one core at moderate rates, slower as the replica count
grows), so a planning trace holds at most :data:`MAX_PLANNING_ARRIVALS` arrivals (about
0.5 GB) and its rate is at most :data:`MAX_RATE_RPS`. :func:`arrival_problem` states the
rules every given trace (inline, from a file) must follow.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

from sloline.common.envelope import trace_envelope

__all__ = [
    "MAX_PLANNING_ARRIVALS",
    "MAX_RATE_RPS",
    "arrival_problem",
    "gamma_arrivals",
    "mean_rate_rps",
    "peak_rate_rps",
    "trace_from_timestamps",
]

Trace = npt.NDArray[np.float64]

MAX_PLANNING_ARRIVALS: Final = 2_000_000  # arrivals in one planning trace
MAX_RATE_RPS: Final = 100_000.0  # mean arrival rate of a planning workload


def arrival_problem(times_s: npt.ArrayLike) -> str | None:
    """Why ``times_s`` cannot be a planning trace, or None: it needs finite, non-negative,
    non-decreasing arrival times in seconds, at least two of them distinct, at most
    :data:`MAX_PLANNING_ARRIVALS` of them, at a mean rate of at most :data:`MAX_RATE_RPS`."""
    times = np.asarray(times_s, dtype=np.float64).ravel()
    if times.size > MAX_PLANNING_ARRIVALS:
        return (
            f"{times.size:,} arrivals; the planner simulates at most "
            f"{MAX_PLANNING_ARRIVALS:,} arrivals per planning trace"
        )
    if not np.all(np.isfinite(times)):
        return "arrival times must be finite numbers of seconds (found NaN or infinity)"
    problem = None
    if times.size and float(times.min()) < 0.0:
        problem = f"arrival times must be >= 0 seconds (found {float(times.min()):g})"
    elif np.any(np.diff(times) < 0.0):
        problem = "arrival times must be non-decreasing"
    elif times.size < 2 or times[-1] == times[0]:
        problem = (
            f"a planning trace needs at least 2 distinct arrival times "
            f"(got {times.size} arrival(s) at {min(times.size, 1)} distinct time(s))"
        )
    elif (rate := mean_rate_rps(times)) > MAX_RATE_RPS:
        problem = (
            f"mean rate {rate:,.0f} rps; the planner simulates at most {MAX_RATE_RPS:,.0f} rps"
        )
    return problem


def gamma_arrivals(rate_rps: float, duration_s: float, *, cv2: float = 1.0, seed: int = 0) -> Trace:
    """Arrival times in [0, duration_s) with i.i.d. gamma inter-arrivals (§6).

    Inter-arrival times have mean 1/rate_rps and squared coefficient of variation ``cv2``
    (shape k = 1/cv2, scale = 1/(rate_rps·k)); the first arrival comes one inter-arrival
    after 0. Same arguments, same trace.
    """
    for name, value in (("rate_rps", rate_rps), ("duration_s", duration_s), ("cv2", cv2)):
        if not (math.isfinite(value) and value > 0.0):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv2
    scale = 1.0 / (rate_rps * shape)
    expected = rate_rps * duration_s
    chunk = int(expected + 6.0 * math.sqrt(expected * cv2) + 16)
    parts: list[Trace] = []
    last = 0.0
    while last < duration_s:
        times = last + np.cumsum(rng.gamma(shape, scale, size=chunk))
        parts.append(times)
        last = float(times[-1])
    arrivals = np.concatenate(parts)
    return arrivals[arrivals < duration_s]


def trace_from_timestamps(timestamps_s: npt.ArrayLike) -> Trace:
    """A planning trace from recorded timestamps: sorted, shifted to start at 0."""
    times: Trace = np.sort(np.asarray(timestamps_s, dtype=np.float64).ravel())
    if times.size == 0:
        raise ValueError("a planning trace needs at least one arrival")
    if not np.all(np.isfinite(times)):
        raise ValueError("arrival timestamps must be finite seconds (found NaN or inf)")
    shifted: Trace = times - times[0]
    return shifted


def mean_rate_rps(arrivals_s: Trace) -> float:
    """Mean arrival rate λ: (n - 1) inter-arrivals over the trace's span (n / span when the
    span is zero is undefined, so a one-arrival trace is rejected)."""
    if arrivals_s.size < 2 or arrivals_s[-1] <= arrivals_s[0]:
        raise ValueError("the mean rate needs at least two arrivals at different times")
    return float((arrivals_s.size - 1) / (arrivals_s[-1] - arrivals_s[0]))


def peak_rate_rps(arrivals_s: Trace, window_s: float) -> float:
    """Highest arrival rate in any sliding window of ``window_s`` seconds (CG-Peak, §6)."""
    return float(trace_envelope(arrivals_s, [window_s])[0])
