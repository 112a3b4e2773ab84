"""Rolling statistics the live status line shows (p99, attainment, rps, batch sizes).

Samples go into fixed-size ring buffers with their timestamps; quantiles are computed
only when the status is drawn, so recording costs a few array writes per request.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np


class Ring:
    """The last `size` (time, value) samples."""

    __slots__ = ("_i", "_n", "times", "values")

    def __init__(self, size: int) -> None:
        # array, not numpy: storing one Python float is ~10x cheaper, and numpy reads the
        # same memory without a copy when the status is drawn.
        self.times = array("d", bytes(8 * size))
        self.values = array("d", bytes(8 * size))
        self._i = 0
        self._n = 0

    def add(self, t: float, value: float) -> None:
        i = self._i
        self.times[i] = t
        self.values[i] = value
        self._i = (i + 1) % len(self.times)
        self._n += 1

    def since(self, t0: float) -> np.ndarray:
        n = min(self._n, len(self.times))
        times = np.frombuffer(self.times, dtype=np.float64, count=n)
        return np.frombuffer(self.values, dtype=np.float64, count=n)[times >= t0]


@dataclass(frozen=True, slots=True)
class Window:
    count: int
    rate_rps: float
    p50_s: float
    p99_s: float
    mean: float

    @staticmethod
    def of(values: np.ndarray, span_s: float) -> Window:
        if len(values) == 0:
            return Window(0, 0.0, 0.0, 0.0, 0.0)
        p50, p99 = np.percentile(values, [50, 99])
        return Window(
            len(values), len(values) / span_s, float(p50), float(p99), float(values.mean())
        )


class RouterStats:
    """Recent request latencies and failures; per stage: visit latency (queued to answered)
    and, per batch answered (the same index in every ring): its size, the worker-measured
    model time, CPU time and idle time before it, and its round trip."""

    def __init__(self, stages: list[str], size: int = 65536) -> None:
        # Every request's arrival time, for the re-planner; None (not recorded) unless it runs.
        self.arrivals: Ring | None = None
        self.latency = Ring(size)
        self.errors = Ring(size // 4)
        self.stage_latency = {s: Ring(size) for s in stages}
        self.stage_batch = {s: Ring(size // 4) for s in stages}
        self.stage_service = {s: Ring(size // 4) for s in stages}  # model time per batch
        self.stage_cpu = {s: Ring(size // 4) for s in stages}  # the worker's CPU over it
        # How long its worker sat idle before it (NaN: the worker's first batch).
        self.stage_idle = {s: Ring(size // 4) for s in stages}
        # Per batch, dispatch to result back on the router's loop: the model time plus
        # the hop (wire, wake-ups, the worker's own decode and encode, the loop's delay).
        self.stage_roundtrip = {s: Ring(size // 4) for s in stages}

    def attainment(self, now: float, span_s: float, slo_s: float) -> float:
        ok = self.latency.since(now - span_s)
        failed = len(self.errors.since(now - span_s))
        total = len(ok) + failed
        return float(np.count_nonzero(ok <= slo_s)) / total if total else 1.0
