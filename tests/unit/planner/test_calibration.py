"""Calibration: measured from the router's per-batch records, applied to a profile."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sloline.planner.calibration import (
    MIN_BATCHES,
    MIN_GROUP_BATCHES,
    Calibration,
    idle_groups,
    request_path,
)
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload, estimate
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import IdlePenalty, PipelineProfile, StageProfile
from sloline.planner.topology import Topology

LATENCY_S = {1: 0.010, 2: 0.012, 4: 0.016}


def _stage(hardware: str, scale: float = 1.0) -> StageProfile:
    base = StageProfile.from_latencies(hardware, {b: v * scale for b, v in LATENCY_S.items()})
    return StageProfile(base.hardware, base.points, IdlePenalty((0.1,), (0.002,)))


def _profile() -> PipelineProfile:
    overhead = ServingOverhead(1e-4, 5e-5, 1e-5, 1e-4, (1e-4, 2e-4), (3e-4,))
    return PipelineProfile(
        stages={
            "a": {"cpu-1": _stage("cpu-1"), "cpu-2": _stage("cpu-2", 0.6)},
            "b": {"cpu-1": _stage("cpu-1")},
        },
        hop_s=1.5e-4,
        overhead=overhead,
    )


def _measured(
    extra_s: float,
    hop_s: float,
    batches_b: int = 200,
    request_s: np.ndarray | None = None,
    idle_a: np.ndarray | None = None,
) -> Calibration:
    rng = np.random.default_rng(0)
    sizes_a = rng.choice([1, 2, 4], size=300).astype(np.float64)
    sizes_b = np.ones(batches_b)
    service_a = np.array([LATENCY_S[int(k)] for k in sizes_a]) + extra_s
    service_b = np.full(batches_b, LATENCY_S[1] + extra_s)
    return Calibration.measure(
        _profile(),
        {"a": ("cpu-1", 4), "b": ("cpu-1", 1)},
        {"a": sizes_a, "b": sizes_b},
        {"a": service_a, "b": service_b},
        {"a": service_a + hop_s, "b": service_b + hop_s},
        pipeline="p",
        duration_s=30.0,
        requests=600,
        request_s=request_s,
        idle_s=None if idle_a is None else {"a": idle_a},
    )


def test_measure_reads_the_extra_time_per_batch_and_the_in_situ_hop() -> None:
    calibration = _measured(extra_s=0.002, hop_s=0.0008)
    a = calibration.stages["a"]
    assert a.batches == 300 and a.applied
    assert a.extra_s == pytest.approx(0.002)
    assert a.service_mean_s - a.profile_mean_s == pytest.approx(0.002)
    assert len(calibration.hop_s) == 1000
    assert np.median(calibration.hop_s) == pytest.approx(0.0008)


def test_on_a_cpu_class_the_extra_is_cpu_time_not_the_wait_for_a_core() -> None:
    """Wall time = the profile + 1 ms of model slowdown + 3 ms waiting for a core; the CPU
    time has only the first. With CPU times the extra is 1 ms (the estimator's processor
    sharing adds the wait); without them, or where a worker reported none, 4 ms."""
    rng = np.random.default_rng(2)
    sizes = rng.choice([1, 2, 4], size=200).astype(np.float64)
    profiled = np.array([LATENCY_S[int(k)] for k in sizes])
    wall, cpu = profiled + 0.004, profiled + 0.001

    def measure(cpu_s: dict[str, np.ndarray] | None, hardware: str = "cpu-1") -> float:
        served = {"a": (hardware, 4)}
        profile = _profile()
        if hardware == "cpu-2":  # a two-thread class whose profile is the cpu-1 one
            stage = profile.stage("a", "cpu-1")
            two = StageProfile("cpu-2", stage.points, stage.idle, cores=2)
            profile = PipelineProfile(stages={"a": {"cpu-1": stage, "cpu-2": two}})
        calibration = Calibration.measure(
            profile, served, {"a": sizes}, {"a": wall}, {"a": wall + 1e-4},
            pipeline="p", duration_s=10.0, requests=200, cpu_s=cpu_s,
        )  # fmt: skip
        stage_calibration = calibration.stages["a"]
        assert stage_calibration.wall_mean_s == pytest.approx(float(wall.mean()))
        assert np.median(calibration.hop_s) == pytest.approx(1e-4)  # round trip less wall
        return stage_calibration.extra_s

    assert measure({"a": cpu}) == pytest.approx(0.001)
    assert measure(None) == pytest.approx(0.004)  # an accelerator: wall time
    assert measure({"a": np.zeros_like(cpu)}) == pytest.approx(0.004)  # not reported
    # Two threads: CPU time over two cores, never more than the wall time.
    assert measure({"a": 2 * cpu}, "cpu-2") == pytest.approx(0.001)
    assert measure({"a": 4 * wall}, "cpu-2") == pytest.approx(0.004)


def test_a_faster_stage_is_not_made_faster_than_its_profile() -> None:
    assert _measured(extra_s=-0.003, hop_s=0.0).stages["a"].extra_s == 0.0


def test_apply_adds_the_extra_on_every_hardware_class_and_replaces_the_hop() -> None:
    profile = _profile()
    calibrated = _measured(extra_s=0.002, hop_s=0.0008).apply(profile)
    for hardware in ("cpu-1", "cpu-2"):  # served on cpu-1 only: carried to cpu-2
        before, after = profile.stage("a", hardware), calibrated.stage("a", hardware)
        assert after.idle is None
        for p0, p1 in zip(before.points, after.points, strict=True):
            assert p1.p50_s == pytest.approx(p0.p50_s + 0.002)
            assert p1.p99_s == pytest.approx(p0.p99_s + 0.002)
    assert calibrated.overhead is not None
    assert np.median(calibrated.overhead.hop_s) == pytest.approx(0.0008)
    assert calibrated.hop_s == pytest.approx(0.0008)
    assert calibrated.overhead.request_s == profile.overhead.request_s  # type: ignore[union-attr]


def test_the_estimate_moves_by_what_was_measured() -> None:
    """A two-stage chain at low load: the calibrated P50 is the profile's plus the extra
    time on both stages plus the hop difference on both hops (no idle penalty here: the
    calibration drops it, as the in-situ time includes the wake-ups)."""
    plain = StageProfile.from_latencies("cpu-1", LATENCY_S)
    profile = PipelineProfile(stages={"a": {"cpu-1": plain}, "b": {"cpu-1": plain}}, hop_s=1e-4)
    topology = Topology.chain(("a", "b"))
    arrivals = np.arange(200, dtype=np.float64)  # 1 rps: nothing queues
    config = (StageConfig("cpu-1", 1, 1), StageConfig("cpu-1", 1, 1))

    def p50(p: PipelineProfile) -> float:
        workload = Workload.build(topology, p, arrivals)
        return estimate(topology, p, config, workload).percentile_s(50.0)

    calibrated = _measured(extra_s=0.002, hop_s=0.0008).apply(profile)
    expected = 2 * 0.002 + 2 * (0.0008 - 1e-4)
    assert p50(calibrated) - p50(profile) == pytest.approx(expected, abs=2e-4)


def test_idle_groups_merge_sparse_bins_and_skip_unknown_idle_times() -> None:
    n = MIN_GROUP_BATCHES
    idle = np.concatenate(
        [
            np.full(n, 1e-4),  # one full bin
            np.full(n // 2, 3e-3),  # two half bins: one group
            np.full(n - n // 2, 7e-3),
            np.full(n, 0.3),
            np.full(3, 5.0),  # a short remainder: joins the group before
            [np.nan],  # a worker's first batch
        ]
    )
    extra = np.where(idle < 1e-3, 0.001, 0.004)
    gaps, means, counts = idle_groups(idle, extra)
    assert counts == (n, n, n + 3)
    assert gaps[0] == pytest.approx(1e-4)
    assert gaps[1] == pytest.approx((n // 2 * 3e-3 + (n - n // 2) * 7e-3) / n)
    assert gaps[2] == pytest.approx((n * 0.3 + 15.0) / (n + 3))
    assert means == pytest.approx((0.001, 0.004, 0.004))
    assert idle_groups(idle[: n - 1], extra[: n - 1]) == ((), (), ())


def test_the_in_situ_idle_penalty_follows_how_long_workers_sat_idle() -> None:
    """Batches after 0.1 ms idle take the profile + 1 ms, after 50 ms idle + 4 ms: the
    calibration's extra is 1 ms and its idle penalty 3 ms at 50 ms idle, which replaces
    the profile's (2 ms at 100 ms). At 1 rps every batch finds its worker idle, so the
    estimate moves by 4 ms per stage, where the mean extra (2.5 ms) would say 2.5 ms."""
    rng = np.random.default_rng(3)
    n = 400
    sizes = np.ones(n)
    idle = np.where(rng.random(n) < 0.5, 1e-4, 0.05)
    service = LATENCY_S[1] + np.where(idle < 1e-3, 0.001, 0.004)
    calibration = Calibration.measure(
        _profile(),
        {"a": ("cpu-1", 1), "b": ("cpu-1", 1)},
        {"a": sizes, "b": sizes},
        {"a": service, "b": service},
        {"a": service, "b": service},
        pipeline="p",
        duration_s=30.0,
        requests=n,
        idle_s={"a": idle, "b": idle},
    )
    a = calibration.stages["a"]
    assert a.extra_s == pytest.approx(0.001)
    assert a.idle is not None and a.idle.extra_at(0.05) == pytest.approx(0.003)
    assert a.idle.extra_at(1e-4) == pytest.approx(0.0, abs=1e-12)
    assert "+1.00 ms per batch (+4.00 ms after 50 ms idle)" in calibration.summary()

    plain = StageProfile.from_latencies("cpu-1", LATENCY_S)
    profile = PipelineProfile(
        stages={"a": {"cpu-1": _stage("cpu-1")}, "b": {"cpu-1": _stage("cpu-1")}}, hop_s=0.0
    )
    calibrated = calibration.apply(profile)
    assert calibrated.stage("a", "cpu-1").idle == a.idle
    topology = Topology.chain(("a", "b"))
    arrivals = np.arange(100, dtype=np.float64)
    config = (StageConfig("cpu-1", 1, 1), StageConfig("cpu-1", 1, 1))

    def p50(p: PipelineProfile) -> float:
        return estimate(topology, p, config, Workload.build(topology, p, arrivals)).percentile_s(50)

    bare = PipelineProfile(stages={"a": {"cpu-1": plain}, "b": {"cpu-1": plain}}, hop_s=0.0)
    assert p50(calibrated) - p50(bare) == pytest.approx(2 * 0.004, abs=2e-4)


def test_a_stage_with_too_few_batches_is_left_as_profiled() -> None:
    calibration = _measured(extra_s=0.002, hop_s=0.0, batches_b=MIN_BATCHES - 1)
    assert not calibration.stages["b"].applied
    calibrated = calibration.apply(_profile())
    assert calibrated.stage("b", "cpu-1") == _profile().stage("b", "cpu-1")
    assert "fewer than" in calibration.summary()


def test_the_request_path_is_the_client_latency_less_the_router_s_quantile_by_quantile() -> None:
    rng = np.random.default_rng(1)
    router = rng.exponential(0.010, size=400)
    path = 0.002 + rng.exponential(0.001, size=400)
    client = rng.permutation(np.sort(router) + np.sort(path))  # no request ids shared
    levels = [0.1, 0.5, 0.9, 0.99]
    measured = np.quantile(request_path(client, router), levels)
    assert measured == pytest.approx(np.quantile(path, levels), rel=0.03)
    assert request_path(client[:10], router).size == 10
    assert request_path(np.empty(0), router).size == 0
    assert request_path(router, router + 1.0) == pytest.approx(np.zeros(400))  # clamped

    profile = _profile()
    calibration = _measured(extra_s=0.001, hop_s=0.0005, request_s=path)
    assert len(calibration.request_s) == 1000
    assert np.median(calibration.request_s) == pytest.approx(np.median(path), rel=0.02)
    calibrated = calibration.apply(profile)
    assert calibrated.overhead is not None and profile.overhead is not None
    assert calibrated.overhead.request_s == calibration.request_s
    assert calibrated.overhead.client_cpu_s == profile.overhead.client_cpu_s
    assert "request path outside the router" in calibration.summary()
    # Too few requests: the profiled request path stays.
    few = _measured(extra_s=0.001, hop_s=0.0005, request_s=path[: MIN_BATCHES - 1])
    assert few.request_s == ()
    assert few.apply(profile).overhead.request_s == profile.overhead.request_s  # type: ignore[union-attr]


def test_the_router_s_costs_scale_to_the_cpu_it_used() -> None:
    """The estimator's router CPU on the same arrivals, after the calibration, is the
    measured one: every router cost (per request, batch, item, idle penalty) scales."""
    base = _profile()
    assert base.overhead is not None
    overhead = replace(base.overhead, router_idle=IdlePenalty((0.01,), (5e-4,)))
    profile = replace(base, overhead=overhead)
    topology = Topology.chain(("a", "b"))
    config = (StageConfig("cpu-1", 4, 1), StageConfig("cpu-1", 1, 1))
    arrivals = np.arange(200, dtype=np.float64) * 0.05

    def router_cpu_s(p: PipelineProfile) -> float:
        return estimate(topology, p, config, Workload.build(topology, p, arrivals)).router_cpu_s

    calibration = _measured(extra_s=0.001, hop_s=0.0005)
    used = router_cpu_s(calibration.apply(profile))
    assert used > 0.0
    scaled = calibration.with_router_cpu(1.5 * used, used)
    assert scaled.router_scale == pytest.approx(1.5)
    assert router_cpu_s(scaled.apply(profile)) == pytest.approx(1.5 * used)
    router = scaled.apply(profile).overhead
    assert router is not None and router.router_idle is not None
    assert router.router_idle.extra_s == pytest.approx((7.5e-4,))
    assert router.router_batch_cpu_s == pytest.approx(1.5 * 5e-5)
    assert "x1.50 the profile's" in scaled.summary()
    # Clamped; no scale without an estimated router (a profile without serving overhead).
    assert calibration.with_router_cpu(10.0, 1.0).router_scale == 4.0
    assert calibration.with_router_cpu(1.0, 0.0).router_scale == 1.0


def test_round_trip_and_clear_errors(tmp_path: Path) -> None:
    idle = np.random.default_rng(4).exponential(0.01, 300)
    calibration = _measured(0.001, 0.0005, request_s=np.full(100, 0.002), idle_a=idle)
    assert len(calibration.stages["a"].idle_gaps_s) > 2
    calibration = calibration.with_router_cpu(0.3, 0.25)
    path = tmp_path / "calibration.json"
    calibration.save(path)
    assert Calibration.load(path) == calibration
    # `sloline run --calibration-out` files have no request path and no router CPU; older
    # ones lack the keys, and the idle groups.
    data = json.loads(path.read_text())
    for key in ("requestSeconds", "routerCpuSeconds", "routerScale"):
        del data[key]
    for stage in data["stages"].values():
        for key in ("idleGapsSeconds", "idleExtraSeconds", "idleBatches"):
            del stage[key]
    path.write_text(json.dumps(data))
    loaded = Calibration.load(path)
    assert loaded.request_s == () and loaded.router_cpu_s is None and loaded.router_scale == 1.0
    assert loaded.stages["a"].idle is None
    assert loaded.stages["a"].extra_s == pytest.approx(calibration.stages["a"].extra_s)
    data = json.loads(path.read_text())
    data["format"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="calibration format 0 is not 1"):
        Calibration.load(path)
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"calibration\.json: not a sloline calibration"):
        Calibration.load(path)
    other = PipelineProfile(stages={"x": {"cpu-1": _stage("cpu-1")}})
    with pytest.raises(ValueError, match=r"names stages \['a', 'b'\]"):
        calibration.apply(other)
