"""Traffic envelopes of arrival processes (InferLine §5, network calculus).

A traffic envelope maps a window size ΔT to the maximum number of arrivals q seen in any
window of that size; InferLine reports it as a rate r = q / ΔT for window sizes
T_s · 2^k up to 60 s (§5, Fig. 4). The planner builds the envelope of the planning trace
with :func:`trace_envelope`; the router keeps the live envelope with the streaming
estimator in this module and exports it as the ``sloline_arrival_envelope_rps`` gauges;
the tuner compares the two (Algorithm 3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Envelope", "StreamingEnvelope", "trace_envelope", "window_sizes"]

_REL_TOL = 1e-9
_MATCH_TOL = 1e-4


def window_sizes(base_s: float, max_s: float = 60.0) -> tuple[float, ...]:
    """Envelope window sizes ``base_s * 2**k`` for k = 0, 1, ... while they are <= ``max_s``.

    InferLine §5 sets the smallest window to the system's service time T_s and doubles it
    up to 60 s. The last window is the largest power-of-two multiple of ``base_s`` not
    exceeding ``max_s`` (a relative tolerance of 1e-9 absorbs float rounding, so
    ``window_sizes(7.5)`` ends at 60.0).
    """
    if not base_s > 0.0 or not np.isfinite(base_s):
        raise ValueError(f"window base must be a positive number of seconds, got {base_s!r}")
    if not max_s >= base_s * (1.0 - _REL_TOL) or not np.isfinite(max_s):
        raise ValueError(
            f"largest window ({max_s!r} s) must be at least the window base ({base_s!r} s); "
            "lower the base (the stage service time T_s) or raise the maximum"
        )
    sizes: list[float] = []
    size = float(base_s)
    while size <= max_s * (1.0 + _REL_TOL):
        sizes.append(size)
        size *= 2.0
    return tuple(sizes)


def trace_envelope(
    arrivals_s: npt.ArrayLike, windows_s: Sequence[float]
) -> npt.NDArray[np.float64]:
    """Exact traffic envelope of a trace, as max rates in requests per second (§5, Fig. 4).

    For each window size ΔT the result is ``max_t |{a : t <= a < t + ΔT}| / ΔT`` over all
    real t. The maximum is attained with t at an arrival, so for sorted arrivals a_i it is
    ``max_i (searchsorted(a, a_i + ΔT, "left") - i) / ΔT`` — O(n log n) per window, no loop
    over arrivals. Unsorted input is sorted; an empty trace has an all-zero envelope.

    Windows longer than the trace's span see the whole trace, so their rate is
    ``n / ΔT`` — lower than the trace's mean rate. Give the planner a planning trace at
    least as long as the largest window (60 s) or cap the windows at the trace's span.
    """
    arrivals = np.sort(np.asarray(arrivals_s, dtype=np.float64).ravel())
    windows = np.asarray(windows_s, dtype=np.float64).ravel()
    if windows.size and not np.all(windows > 0.0):
        raise ValueError(f"window sizes must be positive seconds, got {windows.tolist()}")
    if arrivals.size and not np.all(np.isfinite(arrivals)):
        raise ValueError("arrival timestamps must be finite seconds (found NaN or inf)")
    rates = np.zeros(windows.size, dtype=np.float64)
    if arrivals.size == 0:
        return rates
    index = np.arange(arrivals.size)
    for i, window in enumerate(windows):
        ends = np.searchsorted(arrivals, arrivals + window, side="left")
        rates[i] = float(np.max(ends - index)) / float(window)
    return rates


@dataclass(frozen=True, slots=True)
class Envelope:
    """A traffic envelope as data: max arrival rate (rps) per window size (s), §5.

    The planner hands the tuner the envelope of its planning trace; metric sources hand it
    the observed one. Windows are strictly increasing and rates are finite and >= 0.
    """

    windows_s: tuple[float, ...]
    rates_rps: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.windows_s) != len(self.rates_rps):
            raise ValueError(
                f"an envelope needs one rate per window: {len(self.windows_s)} windows, "
                f"{len(self.rates_rps)} rates"
            )
        if any(not w > 0.0 for w in self.windows_s) or any(
            b <= a for a, b in zip(self.windows_s, self.windows_s[1:], strict=False)
        ):
            raise ValueError(
                f"envelope windows must be positive and increasing, got {self.windows_s}"
            )
        if any(not (math.isfinite(r) and r >= 0.0) for r in self.rates_rps):
            raise ValueError(f"envelope rates must be finite and >= 0, got {self.rates_rps}")

    @classmethod
    def of_trace(cls, arrivals_s: npt.ArrayLike, windows_s: Sequence[float]) -> Envelope:
        """The exact envelope of a trace (see :func:`trace_envelope`)."""
        rates = trace_envelope(arrivals_s, windows_s)
        return cls(tuple(float(w) for w in windows_s), tuple(float(r) for r in rates))

    def rate_at(self, window_s: float) -> float | None:
        """The rate for a window size, or None.

        Sizes match within a relative 1e-4, so labels printed with 6 significant digits
        (``f"{w:g}"``) still match; envelope windows differ by factors of 2.
        """
        for window, rate in zip(self.windows_s, self.rates_rps, strict=True):
            if math.isclose(window, window_s, rel_tol=_MATCH_TOL):
                return rate
        return None


class StreamingEnvelope:
    """Live traffic envelope of an arrival stream with bounded memory and work (§5).

    Fed arrival timestamps (monotonic seconds; the clock is always an argument), it answers
    the two questions the tuner asks:

    - :meth:`rates`: per window size ΔT, the max arrival rate over the last ``lookback_s``
      — the current envelope compared with the planning envelope by Algorithm 3, and what
      the router exports as ``sloline_arrival_envelope_rps{window_s}`` so that a scrape
      every 15 s still sees a 100 ms burst;
    - :meth:`lambdas`: arrival rates of the completed ``lambda_window_s`` (5 s) tumbling
      windows in the last ``lambda_lookback_s`` (30 s), whose max is λ_new of Algorithm 4.

    **How.** Time is cut into fine buckets of ``b0 = windows_s[0] / subdivisions``. Window
    ΔT_i = ΔT_0 · 2^k_i counts arrivals in coarse buckets of ``b_i = ΔT_i / subdivisions``
    (fine bucket index shifted right by k_i) and keeps a ring of ``subdivisions`` bucket
    counts plus their running sum: the count of the bucket-aligned window of length ΔT_i
    that ends in the current bucket. The max of that sum is kept per epoch of
    ``epoch_s`` in a ring covering the look-back. Arrivals in the same fine bucket are
    only added to a pending count, so the work per arrival is O(1) plus O(number of
    windows) once per fine bucket that sees arrivals: amortised O(windows) at any rate,
    and at most ``1 / b0`` window updates per second however high the rate. Memory is
    ``windows * (subdivisions + lookback_s / epoch_s)`` integers, independent of the rate.

    **Approximation.** The reported count for ΔT is the max over *bucket-aligned* windows,
    which are real windows of length ΔT, so it never exceeds the exact sliding envelope
    (no false scale-up from an artefact). Any window [t, t + ΔT) lies in
    ``subdivisions + 1`` consecutive buckets, hence::

        reported(ΔT) <= exact(ΔT) <= reported(ΔT) + max_bucket_count(b) / ΔT
                                  <= reported(ΔT) + exact(b) / subdivisions,  b = ΔT / subdivisions

    i.e. the rate is under-reported by at most the arrivals of one bucket (1/8 of the
    bucket-scale rate with the default 8 subdivisions). It is exact with respect to its
    definition: the max over aligned windows, which tests check exactly. Bucket edges are
    ``floor((t - start_s) / b0)`` in float64, so arrivals within one ulp of an edge may
    fall either side of it. The look-back is rounded up to whole epochs (at most
    ``epoch_s`` longer); the λ window is ``round(lambda_window_s / b0)`` fine buckets.

    Timestamps earlier than the latest one seen (reordering between tasks) are counted at
    the latest one; timestamps before ``start_s`` are counted at ``start_s``.
    """

    __slots__ = (
        "_counts_per_lambda",
        "_cur_bucket",
        "_epoch_fine",
        "_epoch_ids",
        "_epoch_max",
        "_fine_s",
        "_lambda_count",
        "_lambda_fine",
        "_lambda_ids",
        "_lambda_slots",
        "_last_fine",
        "_last_s",
        "_lookback_s",
        "_pending",
        "_rings",
        "_shifts",
        "_start_s",
        "_subdivisions",
        "_sums",
        "_windows_s",
    )

    def __init__(
        self,
        windows_s: Sequence[float],
        *,
        start_s: float,
        lookback_s: float = 60.0,
        subdivisions: int = 8,
        epoch_s: float = 1.0,
        lambda_window_s: float = 5.0,
        lambda_lookback_s: float = 30.0,
    ) -> None:
        windows = tuple(float(w) for w in windows_s)
        if not windows or not windows[0] > 0.0:
            raise ValueError(f"need at least one positive window size, got {windows}")
        shifts: list[int] = []
        for window in windows:
            shift = round(math.log2(window / windows[0]))
            if shift < 0 or not math.isclose(window, windows[0] * 2.0**shift, rel_tol=1e-9):
                raise ValueError(
                    f"window sizes must be the smallest one times powers of two "
                    f"(see window_sizes()), got {windows}"
                )
            shifts.append(shift)
        if len(set(shifts)) != len(shifts) or shifts != sorted(shifts):
            raise ValueError(f"window sizes must be strictly increasing, got {windows}")
        if subdivisions < 1:
            raise ValueError(f"subdivisions must be >= 1, got {subdivisions}")
        for name, value in (
            ("lookback_s", lookback_s),
            ("epoch_s", epoch_s),
            ("lambda_window_s", lambda_window_s),
            ("lambda_lookback_s", lambda_lookback_s),
        ):
            if not (value > 0.0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self._windows_s = windows
        self._shifts = tuple(shifts)
        self._subdivisions = subdivisions
        self._fine_s = windows[0] / subdivisions
        self._start_s = float(start_s)
        self._lookback_s = float(lookback_s)
        self._epoch_fine = max(1, round(epoch_s / self._fine_s))
        n_epochs = math.ceil(lookback_s / (self._epoch_fine * self._fine_s)) + 1
        self._epoch_ids = [-1] * n_epochs
        self._epoch_max = [[0] * len(windows) for _ in range(n_epochs)]
        self._lambda_fine = max(1, round(lambda_window_s / self._fine_s))
        self._counts_per_lambda = max(1, round(lambda_lookback_s / lambda_window_s))
        self._lambda_slots = self._counts_per_lambda + 1
        self._lambda_ids = [-1] * self._lambda_slots
        self._lambda_count = [0] * self._lambda_slots
        self._cur_bucket = [-1] * len(windows)
        self._rings = [[0] * subdivisions for _ in windows]
        self._sums = [0] * len(windows)
        self._last_fine = -1
        self._last_s = self._start_s
        self._pending = 0

    @property
    def windows_s(self) -> tuple[float, ...]:
        """The window sizes ΔT_i, in seconds."""
        return self._windows_s

    @property
    def lookback_s(self) -> float:
        """The longest look-back :meth:`rates` can answer for, in seconds."""
        return self._lookback_s

    @property
    def lambda_window_s(self) -> float:
        """The effective λ window: a whole number of fine buckets, in seconds."""
        return self._lambda_fine * self._fine_s

    def observe(self, t_s: float, count: int = 1) -> None:
        """Record ``count`` arrivals at time ``t_s`` (monotonic seconds)."""
        t_s = max(float(t_s), self._last_s)
        self._last_s = t_s
        fine = math.floor((t_s - self._start_s) / self._fine_s)
        if fine == self._last_fine:  # the common case at high rates: O(1)
            self._pending += count
        else:
            self._add(fine, count)

    def observe_many(self, arrivals_s: npt.ArrayLike) -> None:
        """Record a batch of arrivals (nondecreasing timestamps; vectorised grouping)."""
        times = np.asarray(arrivals_s, dtype=np.float64).ravel()
        if times.size == 0:
            return
        if not np.all(np.isfinite(times)):
            raise ValueError("arrival timestamps must be finite seconds (found NaN or inf)")
        times = np.maximum.accumulate(np.maximum(times, self._last_s))
        self._last_s = float(times[-1])
        fine = np.floor((times - self._start_s) / self._fine_s).astype(np.int64)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(fine)) + 1))
        counts = np.diff(np.concatenate((starts, [fine.size])))
        for bucket, count in zip(fine[starts].tolist(), counts.tolist(), strict=True):
            self._add(bucket, count)

    def rates(self, now_s: float, lookback_s: float | None = None) -> tuple[float, ...]:
        """Max arrival rate (rps) per window size over the last ``lookback_s`` (§5, Fig. 5).

        ``lookback_s`` defaults to, and may not exceed, the constructor's look-back.
        """
        lookback = self._lookback_s if lookback_s is None else lookback_s
        if not 0.0 <= lookback <= self._lookback_s * (1.0 + 1e-9):
            raise ValueError(
                f"look-back {lookback!r} s is outside [0, {self._lookback_s}] s; build the "
                "StreamingEnvelope with a longer lookback_s"
            )
        self._flush()
        now_epoch = self._fine_index(now_s) // self._epoch_fine
        oldest = now_epoch - math.ceil(lookback / (self._epoch_fine * self._fine_s) - 1e-9)
        best = [0] * len(self._windows_s)
        for epoch_id, row in zip(self._epoch_ids, self._epoch_max, strict=True):
            if oldest <= epoch_id <= now_epoch:
                best = [max(a, b) for a, b in zip(best, row, strict=True)]
        return tuple(count / window for count, window in zip(best, self._windows_s, strict=True))

    def lambdas(self, now_s: float) -> tuple[float, ...]:
        """Rates (rps) of the completed λ windows in the λ look-back, oldest first (Alg. 4).

        Only windows that started at or after ``start_s`` are reported, so a freshly
        started envelope reports fewer values (and Algorithm 4 waits for enough evidence).
        """
        self._flush()
        current = self._fine_index(now_s) // self._lambda_fine
        width_s = self._lambda_fine * self._fine_s
        out: list[float] = []
        for bucket in range(max(0, current - self._counts_per_lambda), current):
            slot = bucket % self._lambda_slots
            count = self._lambda_count[slot] if self._lambda_ids[slot] == bucket else 0
            out.append(count / width_s)
        return tuple(out)

    def envelope(self, now_s: float, lookback_s: float | None = None) -> Envelope:
        """:meth:`rates` as an :class:`Envelope`."""
        return Envelope(self._windows_s, self.rates(now_s, lookback_s))

    def _fine_index(self, t_s: float) -> int:
        return math.floor((max(float(t_s), self._start_s) - self._start_s) / self._fine_s)

    def _add(self, fine: int, count: int) -> None:
        if fine == self._last_fine:
            self._pending += count
            return
        self._flush()
        self._last_fine = fine
        self._pending = count

    def _flush(self) -> None:
        if self._pending:
            self._apply(self._last_fine, self._pending)
            self._pending = 0

    def _apply(self, fine: int, count: int) -> None:
        """Add ``count`` arrivals in fine bucket ``fine`` (nondecreasing) to every window."""
        epoch = fine // self._epoch_fine
        slot = epoch % len(self._epoch_ids)
        if self._epoch_ids[slot] != epoch:
            self._epoch_ids[slot] = epoch
            self._epoch_max[slot] = [0] * len(self._windows_s)
        row = self._epoch_max[slot]
        n_sub = self._subdivisions
        sums, cur_bucket, rings = self._sums, self._cur_bucket, self._rings
        for i, shift in enumerate(self._shifts):
            bucket = fine >> shift
            ring = rings[i]
            current = cur_bucket[i]
            if bucket != current:
                if bucket - current >= n_sub:
                    ring[:] = [0] * n_sub
                    sums[i] = 0
                else:
                    for expired in range(current + 1, bucket + 1):
                        sums[i] -= ring[expired % n_sub]
                        ring[expired % n_sub] = 0
                cur_bucket[i] = bucket
            ring[bucket % n_sub] += count
            total = sums[i] + count
            sums[i] = total
            if total > row[i]:  # noqa: PLR1730 - hot loop: a compare beats a max() call
                row[i] = total
        lam = fine // self._lambda_fine
        lam_slot = lam % self._lambda_slots
        if self._lambda_ids[lam_slot] != lam:
            self._lambda_ids[lam_slot] = lam
            self._lambda_count[lam_slot] = 0
        self._lambda_count[lam_slot] += count
