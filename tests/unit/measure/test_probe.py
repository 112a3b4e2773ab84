"""The probe's arithmetic (the measurements themselves run in the integration tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sloline.measure.probe import _serve, batch_cpu_s


def test_a_batch_costs_the_extra_cpu_less_the_wake_up_of_an_idle_router() -> None:
    # 1.2 ms more per extra batch, 0.9 ms of it the idle penalty after the hold: 0.3 ms.
    assert batch_cpu_s(1.2e-3, 0.9e-3, 1.0e-3) == pytest.approx(0.3e-3)


def test_without_the_wake_up_the_whole_difference_is_per_batch() -> None:
    assert batch_cpu_s(0.4e-3, 0.0, 1.0e-3) == pytest.approx(0.4e-3)


@pytest.mark.parametrize(
    ("more_s", "wake_s", "expected_s"),
    [
        (0.5e-3, 0.9e-3, 0.0),  # noise below the wake-up: no negative cost
        (2.5e-3, 0.0, 1.0e-3),  # never more than the whole visit
    ],
)
def test_the_per_batch_cost_stays_within_the_visit(
    more_s: float, wake_s: float, expected_s: float
) -> None:
    assert batch_cpu_s(more_s, wake_s, 1.0e-3) == pytest.approx(expected_s)


def test_the_probe_serves_from_its_own_directory_whatever_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profiling Job sets SLOLINE_MODEL_DIR to the pipeline's models; the probe's own
    stage module lives in its temp directory, and its router and workers load it there."""
    monkeypatch.setenv("SLOLINE_MODEL_DIR", str(tmp_path))  # holds no probe module
    payload = {"x": np.zeros(4, np.float32)}

    async def ready(served: Any) -> dict[str, int]:
        return dict(served.router.ready_replicas())

    assert asyncio.run(_serve(payload, ["identity"], ready)) == {"s0": 1}
