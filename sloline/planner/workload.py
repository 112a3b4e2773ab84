"""The planning trace a pipeline's ``spec.workload`` describes, the format of a trace
file (``traceUri``, ``sloline simulate --trace FILE``): text, one arrival time in seconds
per line; blank lines and ``#`` comments are ignored, and resamples of a planning trace
(:func:`resample_arrivals`) that the planner checks a plan on beside the trace itself."""

from __future__ import annotations

import io
import warnings

import numpy as np
import numpy.typing as npt

from sloline.common.trace import Trace, gamma_arrivals, trace_from_timestamps
from sloline.spec.models import WorkloadSpec


def trace_for_workload(workload: WorkloadSpec) -> Trace:
    """The planning trace a pipeline's ``spec.workload`` describes.

    An inline ``trace`` wins over ``rateRps``; a ``traceUri`` must be read by the caller
    (this module does no I/O) and passed to :func:`trace_from_timestamps`.
    """
    if workload.trace is not None:
        return trace_from_timestamps(workload.trace)
    if workload.rate_rps is not None:
        return gamma_arrivals(
            workload.rate_rps, workload.duration_s, cv2=workload.cv2, seed=workload.seed
        )
    if workload.trace_uri is not None:
        raise ValueError(
            f"workload trace {workload.trace_uri!r} must be read by the caller; pass its "
            "timestamps to trace_from_timestamps()"
        )
    raise ValueError("spec.workload needs rateRps or a trace to plan for")


def parse_arrival_times(text: str) -> npt.NDArray[np.float64]:
    """The arrival times of a trace file's text (module docstring), in file order; raises
    `ValueError` naming a line that is not one number. Checking them is
    :func:`sloline.common.trace.arrival_problem`'s."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no data: an empty trace, checked later
        times: npt.NDArray[np.float64] = np.loadtxt(io.StringIO(text), dtype=np.float64, ndmin=1)
    if times.ndim != 1:
        raise ValueError(f"expected one arrival time per line, found {times.shape[1]} columns")
    return times


def resample_arrivals(
    arrivals_s: npt.NDArray[np.float64], count: int, *, seed: int = 0
) -> list[npt.NDArray[np.float64]]:
    """``count`` traces drawn from the arrival process behind ``arrivals_s``: each keeps
    the first arrival and the number of arrivals, its inter-arrival gaps drawn with
    replacement from the trace's (a bootstrap). A resample varies as a fresh sample of a
    renewal process (gamma, Poisson) does, so a plan that meets its SLO on the planning
    trace by a hair often misses it on its resamples; it keeps the distribution of the
    gaps, not their order (a burst of short gaps, a slow ramp). Same arguments, same
    traces."""
    gaps = np.diff(arrivals_s)
    traces = []
    for k in range(count):
        drawn = np.random.default_rng([seed, 0x5E5A, k]).choice(gaps, size=gaps.size)
        trace = np.empty(arrivals_s.size)
        trace[0] = arrivals_s[0]
        np.cumsum(drawn, out=trace[1:])
        trace[1:] += arrivals_s[0]
        traces.append(trace)
    return traces
