"""The planning envelope measured the way the observed one is: across several routers.

A pipeline with R routers has R arrival streams; where no single process sees them all
(Kubernetes: each router exports its own envelope, :class:`~sloline.tuner.sources.
PrometheusSource` sums them), the tuner observes the **sum of the routers' envelopes**.
That sum bounds the envelope of the total stream from above, and loosely at short
windows: each router's largest count in a 1 ms window happened at its own moment, and the
sum adds them as if they had coincided. Two routers sharing a 100 rps Poisson stream show
about 2.8x the total's envelope there, which Algorithm 3 would read as load.

So the tuner compares like with like. The data plane spreads requests over the routers
(the Service picks a router per connection, SO_REUSEPORT per connection, clients open
many), so the reference is the planning trace spread the same way: each arrival assigned
uniformly at random to one of R streams, each stream's exact envelope, summed. The sum's
looseness is then in both envelopes and cancels: the planned rate reads as the planned
rate with any R, a rate ``x`` times higher as about ``x`` times, as with one router.

The reference is the mean over :data:`DRAWS` assignments from a fixed seed (the same
reference every time, with the noise of one assignment averaged out). With one stream it
is the trace's exact envelope.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sloline.common.envelope import Envelope, trace_envelope

__all__ = ["DRAWS", "PlanningReference", "split_envelope"]

DRAWS = 8
"""Random assignments the reference averages over."""


def split_envelope(
    arrivals_s: npt.ArrayLike,
    windows_s: Sequence[float],
    streams: int,
    *,
    draws: int = DRAWS,
    seed: int = 0,
) -> Envelope:
    """The sum of the exact envelopes of ``streams`` streams that each arrival joins
    uniformly at random, averaged over ``draws`` assignments (seeded: deterministic);
    one stream gives the trace's envelope."""
    if streams < 1 or draws < 1:
        raise ValueError(f"need streams >= 1 and draws >= 1, got {streams} and {draws}")
    arrivals = np.sort(np.asarray(arrivals_s, dtype=np.float64).ravel())
    windows = tuple(float(w) for w in windows_s)
    if streams == 1:
        return Envelope.of_trace(arrivals, windows)
    rng = np.random.default_rng(seed)
    total = np.zeros(len(windows), dtype=np.float64)
    for _ in range(draws):
        stream = rng.integers(streams, size=arrivals.size)
        for k in range(streams):
            total += trace_envelope(arrivals[stream == k], windows)
    return Envelope(windows, tuple(float(r) for r in total / draws))


class PlanningReference:
    """The planning envelope per number of observed streams (routers), computed once each.

    One stream: the plan's envelope as it is. More: :func:`split_envelope` of the
    planning trace ``arrivals_s`` at the plan's windows, which needs that trace."""

    def __init__(self, envelope: Envelope, arrivals_s: npt.ArrayLike | None = None) -> None:
        self.envelope = envelope
        self._arrivals = None if arrivals_s is None else np.asarray(arrivals_s, dtype=np.float64)
        self._split: dict[int, Envelope] = {}

    def for_streams(self, streams: int) -> Envelope:
        """The reference for an observed envelope that sums ``streams`` routers' envelopes."""
        if streams <= 1:
            return self.envelope
        if self._arrivals is None:
            raise ValueError(
                f"the observed envelope sums {streams} routers' envelopes; comparing it "
                "needs the planning trace (Tuner(planning_sample_s=...))"
            )
        if streams not in self._split:
            self._split[streams] = split_envelope(self._arrivals, self.envelope.windows_s, streams)
        return self._split[streams]
