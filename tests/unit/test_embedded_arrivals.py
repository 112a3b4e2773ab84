"""Embedded router 0 merges every router's arrivals into its envelope in time order, so
the tuner's envelope is the whole stream's, whatever the routers' share of it."""

from __future__ import annotations

import asyncio
import os

import numpy as np

from sloline.common.envelope import StreamingEnvelope, window_sizes
from sloline.common.trace import gamma_arrivals
from sloline.embedded import ARRIVAL_FLUSH_S, ARRIVAL_HOLD_S, ArrivalMerger

WINDOWS = window_sizes(0.002, 4.0)


def envelope_of(times: np.ndarray) -> StreamingEnvelope:
    env = StreamingEnvelope(WINDOWS, start_s=0.0)
    env.observe_many(np.sort(times))
    return env


async def test_router_0_counts_the_other_routers_arrivals_at_their_own_times() -> None:
    # Two routers share a 200 rps stream; router 1 sends its arrival times every 50 ms.
    times = gamma_arrivals(200.0, 10.0, seed=4) + 1.0
    mine = np.random.default_rng(0).integers(2, size=times.size) == 0
    merger = ArrivalMerger(lambda: None)
    merged = StreamingEnvelope(WINDOWS, start_s=0.0)
    merger.start(merged)
    as_they_came = StreamingEnvelope(WINDOWS, start_s=0.0)  # each time counted on arrival
    try:
        sent = 0.0
        for t_s, own in zip(times.tolist(), mine.tolist(), strict=True):
            while sent + ARRIVAL_FLUSH_S <= t_s:  # router 1's flush: its times so far
                sent += ARRIVAL_FLUSH_S
                batch = times[(~mine) & (times >= sent - ARRIVAL_FLUSH_S) & (times < sent)]
                os.write(merger.write_fd, batch.tobytes())
                as_they_came.observe_many(batch)
                await asyncio.sleep(0)  # the event loop reads the pipe
                merger.flush(sent)
            if own:
                merger.add(t_s)
                as_they_came.observe(t_s)
        batch = times[(~mine) & (times >= sent)]
        os.write(merger.write_fd, batch.tobytes())
        as_they_came.observe_many(batch)
        for _ in range(100):
            await asyncio.sleep(0)
        end = float(times[-1]) + ARRIVAL_HOLD_S
        merger.flush(end)
    finally:
        merger.close()
    exact = envelope_of(times)
    assert merged.rates(end) == exact.rates(end)
    assert merged.lambdas(end) == exact.lambdas(end)
    # Counted as they came, each batch of router 1's times lands in one instant: at the
    # shortest window that reads as a burst the stream never had.
    assert as_they_came.rates(end)[0] > 1.5 * exact.rates(end)[0]


async def test_a_time_is_held_until_it_is_old_enough() -> None:
    merger = ArrivalMerger(lambda: None)
    env = StreamingEnvelope(WINDOWS, start_s=0.0)
    merger.start(env)
    try:
        merger.add(1.0)
        merger.add(1.001)
        merger.flush(1.0 + ARRIVAL_HOLD_S / 2)
        assert env.rates(2.0)[-1] == 0.0  # nothing counted yet
        merger.add(1.2)
        merger.flush(1.001 + ARRIVAL_HOLD_S)
        assert env.rates(2.0)[-1] == 2 / WINDOWS[-1]
        merger.flush(1.2 + ARRIVAL_HOLD_S)
        assert env.rates(2.0)[-1] == 3 / WINDOWS[-1]
    finally:
        merger.close()
