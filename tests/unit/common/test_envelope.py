"""Traffic envelopes (InferLine §5): exact trace envelope and the streaming estimator."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.common.envelope import Envelope, StreamingEnvelope, trace_envelope, window_sizes

# Timestamps on a 1/1024 s grid and power-of-two windows are exact in float64, so the
# brute-force counts below and the estimator's bucket edges agree bit for bit.
GRID_S = 1.0 / 1024.0
TICKS = st.lists(st.integers(min_value=0, max_value=30 * 1024), min_size=0, max_size=80)


def brute_sliding_rates(
    arrivals: npt.NDArray[np.float64], windows: tuple[float, ...]
) -> list[float]:
    """max over t of |{a : t <= a < t + w}| / w, trying every arrival as t."""
    rates = []
    for w in windows:
        best = max((int(np.sum((arrivals >= t) & (arrivals < t + w))) for t in arrivals), default=0)
        rates.append(best / w)
    return rates


def brute_aligned_counts(
    arrivals: npt.NDArray[np.float64], windows: tuple[float, ...], subdivisions: int
) -> tuple[list[int], list[int]]:
    """Per window: max count over bucket-aligned windows, and max count of one bucket."""
    fine_s = windows[0] / subdivisions
    fine = np.floor(arrivals / fine_s).astype(np.int64)
    aligned, single = [], []
    for w in windows:
        shift = round(math.log2(w / windows[0]))
        buckets = fine >> shift
        ends = np.unique(buckets)
        aligned.append(
            max(
                (int(np.sum((buckets > g - subdivisions) & (buckets <= g))) for g in ends),
                default=0,
            )
        )
        single.append(max((int(np.sum(buckets == g)) for g in ends), default=0))
    return aligned, single


def test_window_sizes_double_up_to_max_inclusive() -> None:
    assert window_sizes(7.5) == (7.5, 15.0, 30.0, 60.0)
    assert window_sizes(0.25, 2.0) == (0.25, 0.5, 1.0, 2.0)
    assert window_sizes(0.3, 2.0) == (0.3, 0.6, 1.2)
    assert window_sizes(60.0) == (60.0,)


@pytest.mark.parametrize(("base", "top"), [(0.0, 60.0), (-1.0, 60.0), (10.0, 5.0)])
def test_window_sizes_rejects_bad_bounds(base: float, top: float) -> None:
    with pytest.raises(ValueError, match="window"):
        window_sizes(base, top)


def test_trace_envelope_burst_shows_at_small_windows_only() -> None:
    steady = np.arange(0.0, 60.0, 0.1)  # 10 rps
    burst = 30.0 + np.arange(20) * 0.001  # 20 arrivals within 20 ms
    rates = trace_envelope(np.concatenate((steady, burst)), (0.125, 60.0))
    assert rates[0] >= 20 / 0.125
    assert rates[1] == pytest.approx(620 / 60.0)


def test_trace_envelope_empty_and_unsorted() -> None:
    assert trace_envelope(np.array([]), (1.0, 2.0)).tolist() == [0.0, 0.0]
    assert trace_envelope([3.0, 1.0, 2.0], (1.5,)).tolist() == [2 / 1.5]


@settings(max_examples=50, deadline=None)
@given(ticks=TICKS, base=st.sampled_from([0.125, 0.25, 1.0]))
def test_trace_envelope_matches_brute_force(ticks: list[int], base: float) -> None:
    arrivals = np.array(ticks, dtype=np.float64) * GRID_S
    windows = window_sizes(base, 8.0)
    assert trace_envelope(arrivals, windows).tolist() == brute_sliding_rates(arrivals, windows)


def feed(env: StreamingEnvelope, arrivals: npt.NDArray[np.float64], cuts: list[int]) -> None:
    """Feed one at a time and in batches, split at ``cuts``."""
    pieces = np.split(arrivals, sorted({c % (arrivals.size + 1) for c in cuts}))
    for i, piece in enumerate(pieces):
        if i % 2:
            env.observe_many(piece)
        else:
            for t in piece.tolist():
                env.observe(t)


@settings(max_examples=50, deadline=None)
@given(
    ticks=TICKS,
    base=st.sampled_from([0.125, 0.25, 1.0]),
    subdivisions=st.sampled_from([1, 2, 4, 8]),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=4),
)
def test_streaming_envelope_exact_on_aligned_windows_and_within_bound(
    ticks: list[int], base: float, subdivisions: int, cuts: list[int]
) -> None:
    arrivals = np.sort(np.array(ticks, dtype=np.float64)) * GRID_S
    windows = window_sizes(base, 8.0)
    env = StreamingEnvelope(windows, start_s=0.0, lookback_s=64.0, subdivisions=subdivisions)
    feed(env, arrivals, cuts)
    reported = env.rates(31.0)
    aligned, single = brute_aligned_counts(arrivals, windows, subdivisions)
    exact = brute_sliding_rates(arrivals, windows)
    assert list(reported) == [c / w for c, w in zip(aligned, windows, strict=True)]
    for r, e, one, w in zip(reported, exact, single, windows, strict=True):
        assert r <= e <= r + one / w


def test_streaming_envelope_sees_burst_only_within_lookback() -> None:
    windows = window_sizes(0.125, 8.0)
    env = StreamingEnvelope(windows, start_s=0.0, lookback_s=10.0, epoch_s=1.0)
    env.observe_many(np.arange(0.0, 5.0, 0.5))  # 2 rps background
    env.observe(5.0, count=51)  # a burst of 50 on top of the background at t = 5 s
    assert env.rates(6.0)[0] == 51 / 0.125
    assert env.rates(6.0, lookback_s=0.5)[0] == 51 / 0.125
    env.observe_many(np.arange(5.5, 14.5, 0.5))
    assert env.rates(14.5)[0] == 51 / 0.125  # still within 10 s (+ one epoch)
    env.observe_many(np.arange(14.5, 17.0, 0.5))
    assert env.rates(17.0)[0] == 1 / 0.125  # the burst left the look-back
    # the 8 s window [0, 8) ends inside the look-back, so it still holds the burst
    assert env.rates(17.0)[-1] == (51 + 15) / 8.0
    with pytest.raises(ValueError, match="look-back"):
        env.rates(6.0, lookback_s=11.0)


def test_streaming_envelope_lambdas_are_completed_5s_windows() -> None:
    env = StreamingEnvelope(window_sizes(0.25), start_s=100.0)
    env.observe_many(100.0 + np.arange(0.0, 12.0, 0.1))  # 10 rps for 12 s
    assert env.lambdas(112.0) == pytest.approx((10.0, 10.0))
    env.observe_many(np.arange(112.0, 142.0, 0.5))  # then 2 rps
    lams = env.lambdas(142.0)
    assert len(lams) == 6
    assert lams[-1] == pytest.approx(2.0)
    assert env.lambdas(400.0) == (0.0,) * 6  # silence is evidence of zero rate


def test_streaming_envelope_clamps_reordered_timestamps() -> None:
    env = StreamingEnvelope((1.0,), start_s=0.0)
    env.observe(5.0)
    env.observe(4.0)  # counted at 5.0
    env.observe(-3.0)  # before start: counted at the latest time
    assert env.rates(5.0) == (3.0,)


def test_streaming_envelope_rejects_nan_timestamps() -> None:
    env = StreamingEnvelope((1.0,), start_s=0.0)
    with pytest.raises(ValueError, match="finite"):
        env.observe_many([1.0, float("nan")])
    with pytest.raises(ValueError, match="NaN"):
        env.observe(float("nan"))


def test_streaming_envelope_rejects_non_dyadic_windows() -> None:
    with pytest.raises(ValueError, match="powers of two"):
        StreamingEnvelope((1.0, 3.0), start_s=0.0)


def test_envelope_validates_and_matches_windows() -> None:
    env = Envelope.of_trace([0.0, 0.1, 0.2], (0.5, 1.0))
    assert env.rate_at(0.5) == 6.0
    assert env.rate_at(0.7) is None
    with pytest.raises(ValueError, match="one rate per window"):
        Envelope((1.0,), ())
    with pytest.raises(ValueError, match="increasing"):
        Envelope((2.0, 1.0), (0.0, 0.0))
