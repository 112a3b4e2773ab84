"""The planning trace a pipeline's ``spec.workload`` describes."""

from __future__ import annotations

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
