"""The profiler's serving-overhead cache: measured once, then read back exactly, so a plan
made from the stored overhead is the plan made from the measured one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from sloline.planner.overhead import ServingOverhead
from sloline.planner.planner import plan
from sloline.planner.profile import PipelineProfile
from sloline.planner.profiler import cached_overhead
from sloline.planner.synthetic import random_problem


def _measured(seed: int) -> ServingOverhead:
    """An overhead with full-precision floats, as a probe gives them."""
    rng = np.random.default_rng(seed)
    return ServingOverhead(
        router_request_cpu_s=float(rng.uniform(2e-4, 1e-3)),
        router_batch_cpu_s=float(rng.uniform(1e-4, 5e-4)),
        router_item_cpu_s=float(rng.uniform(0.0, 5e-5)),
        worker_batch_cpu_s=float(rng.uniform(1e-4, 5e-4)),
        hop_s=tuple(float(v) for v in rng.lognormal(np.log(1e-4), 1.0, 300)),
        request_s=tuple(float(v) for v in rng.lognormal(np.log(4e-4), 1.0, 300)),
        client_cpu_s=float(rng.uniform(2e-4, 1e-3)),
        cores=2,
    )


def test_the_overhead_is_measured_once_then_read_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "overhead.json"
    measured: list[ServingOverhead] = []

    def measure() -> ServingOverhead:
        measured.append(_measured(len(measured)))
        return measured[-1]

    first = cached_overhead(path, measure)
    again = cached_overhead(path, measure)
    assert len(measured) == 1
    assert again == first
    forced = cached_overhead(path, measure, force=True)
    assert len(measured) == 2
    assert forced == measured[1] != first
    assert cached_overhead(path, measure) == forced


def test_a_plan_from_the_stored_overhead_is_the_plan_from_the_measured_one(
    tmp_path: Path,
) -> None:
    measured = _measured(7)
    stored = cached_overhead(tmp_path / "overhead.json", lambda: measured)
    read = cached_overhead(tmp_path / "overhead.json", lambda: _measured(8))
    base = random_problem(0, duration_s=4.0, max_replicas=8)

    def planned(overhead: ServingOverhead) -> dict[str, object]:
        profile = PipelineProfile(
            base.profile.stages,
            base.profile.scale_factors,
            hop_s=overhead.visit_s(),
            overhead=overhead,
        )
        return plan(dataclasses.replace(base, profile=profile)).to_dict()

    assert stored is measured
    assert planned(read) == planned(measured)
