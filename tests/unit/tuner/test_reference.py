"""The tuner across several routers: the routers' envelopes summed (Prometheus) are
compared with the planning trace split as many ways (`sloline.tuner.reference`), so R
routers at the planned rate decide as one router does, and a real load increase still
scales up."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from sloline.common.envelope import Envelope, trace_envelope, window_sizes
from sloline.common.trace import gamma_arrivals
from sloline.tuner.policy import TunerSettings
from sloline.tuner.reference import PlanningReference, split_envelope
from sloline.tuner.sources import PrometheusSource, StageTuning, Tuner
from tests.unit.tuner.test_sources import Clock, FakeActuator, FakePrometheus, vector

RATE = 100.0  # the plan's λ
WINDOWS = window_sizes(0.002, 16.0)
LOOKBACK_S = 30.0
SETTINGS = TunerSettings(window_base_s=WINDOWS[0], window_max_s=WINDOWS[-1])
# Planned at 2 replicas; one replica serves 80 rps at the plan's utilisation, so
# k(r) = ceil(r / 80): the planned rate and its noise keep 2, a spurious reading of the
# routers' summed envelope (2-8x the planned rate at short windows) asks for 3-8.
STAGE = StageTuning("model", 1, 8, 1.0, 100.0, 0.8)
PLANNED = 2


def test_split_envelope_bounds_and_determinism() -> None:
    trace = gamma_arrivals(RATE, 60.0, cv2=4.0, seed=3)
    exact = trace_envelope(trace, WINDOWS)
    assert split_envelope(trace, WINDOWS, 1) == Envelope.of_trace(trace, WINDOWS)
    for streams in (2, 4):
        split = split_envelope(trace, WINDOWS, streams)
        assert split == split_envelope(trace, WINDOWS, streams)  # seeded
        rates = np.array(split.rates_rps)
        # Each stream's largest count sits inside the total's, and within the window
        # where the total is largest, the streams' counts add up to it.
        assert np.all(rates >= exact - 1e-9)
        assert np.all(rates <= streams * exact + 1e-9)
    # The looseness is at short windows: at the smallest, well above the total's.
    assert split_envelope(trace, WINDOWS, 2).rates_rps[0] > 1.3 * exact[0]


def test_the_reference_needs_the_trace_to_split() -> None:
    trace = gamma_arrivals(RATE, 60.0, seed=1)
    plan = Envelope.of_trace(trace, WINDOWS)
    assert PlanningReference(plan).for_streams(1) is plan
    with pytest.raises(ValueError, match="needs the planning trace"):
        PlanningReference(plan).for_streams(2)
    reference = PlanningReference(plan, trace)
    assert reference.for_streams(3) is reference.for_streams(3)  # computed once
    assert reference.for_streams(3) == split_envelope(trace, WINDOWS, 3)


def prometheus(live: npt.NDArray[np.float64], routers: int, seed: int) -> FakePrometheus:
    """Prometheus as the routers' gauges leave it: requests spread uniformly at random over
    `routers` routers, each router's exact envelope of its share over the look-back, and
    the 5 s λ windows of the whole stream (counters sum exactly)."""
    share = np.random.default_rng(seed).integers(routers, size=live.size)
    envelope = vector(
        *(
            ({"pod": f"router-{r}", "window": str(i)}, rate)
            for r in range(routers)
            for i, rate in enumerate(trace_envelope(live[share == r], WINDOWS))
        )
    )
    windows = vector(*(({"window": str(i)}, w) for i, w in enumerate(WINDOWS)))
    counts = np.histogram(live, bins=np.arange(0.0, LOOKBACK_S + 1.0, 5.0))[0]
    lambdas = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {}, "values": [[t, str(c / 5.0)] for t, c in enumerate(counts)]}],
        },
    }
    return FakePrometheus(envelope, lambdas, vector(), windows)


async def decided(
    trace: npt.NDArray[np.float64], live: npt.NDArray[np.float64], routers: int, seed: int
) -> int:
    """The stage's desired replicas after one tick of the operator's tuner (Prometheus in)."""
    actuator = FakeActuator({STAGE.name: PLANNED})
    tuner = Tuner(
        stages=[STAGE],
        planning_envelope=Envelope.of_trace(trace, WINDOWS),
        planning_rate_rps=RATE,
        planning_sample_s=trace,
        source=PrometheusSource(
            "http://prom",
            "ns",
            "p",
            windows_s=WINDOWS,
            lookback_s=LOOKBACK_S,
            get_json=prometheus(live, routers, seed),
        ),
        actuator=actuator,
        settings=SETTINGS,
        clock=Clock(100.0),
        last_change_s=0.0,
    )
    await tuner.step()
    return actuator.desired[STAGE.name]


@pytest.mark.parametrize("cv2", [1.0, 4.0], ids=["poisson", "bursty"])
@pytest.mark.parametrize("routers", [2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_routers_at_the_planned_rate_decide_as_one_router(
    cv2: float, routers: int, seed: int
) -> None:
    trace = gamma_arrivals(RATE, 60.0, cv2=cv2, seed=1)
    live = gamma_arrivals(RATE, LOOKBACK_S, cv2=cv2, seed=50 + seed)
    one = await decided(trace, live, 1, seed)
    assert one == PLANNED
    assert await decided(trace, live, routers, seed) == one


@pytest.mark.parametrize("cv2", [1.0, 4.0], ids=["poisson", "bursty"])
@pytest.mark.parametrize("routers", [1, 2, 4])
async def test_routers_at_twice_the_planned_rate_scale_up(cv2: float, routers: int) -> None:
    trace = gamma_arrivals(RATE, 60.0, cv2=cv2, seed=1)
    live = gamma_arrivals(2.0 * RATE, LOOKBACK_S, cv2=cv2, seed=60)
    assert await decided(trace, live, routers, 0) >= PLANNED + 1
