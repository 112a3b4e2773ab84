"""The probe's arithmetic (the measurements themselves run in the integration tests)."""

from __future__ import annotations

import pytest

from sloline.planner.probe import batch_cpu_s


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
