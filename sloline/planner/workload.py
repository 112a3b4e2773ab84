"""The planning trace a pipeline's ``spec.workload`` describes, and the format of a trace
file (``traceUri``, ``sloline simulate --trace FILE``): text, one arrival time in seconds
per line; blank lines and ``#`` comments are ignored."""

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
