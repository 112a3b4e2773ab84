"""Batch-latency profiles (§4.1): interpolation, caps, serialisation, visit matrices and
the Clockwork GPU profiles."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.lab.clockwork import load_clockwork_profiles
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import BatchLatency, IdlePenalty, PipelineProfile, StageProfile


def gpu_like() -> StageProfile:
    return StageProfile.from_latencies("gpu", {1: 0.004, 2: 0.005, 4: 0.007, 8: 0.011})


def test_latency_interpolates_linearly_between_measured_sizes() -> None:
    profile = gpu_like()
    assert profile.latency_s(4) == 0.007
    assert profile.latency_s(3) == pytest.approx(0.006)
    assert profile.latency_s(6) == pytest.approx(0.009)
    assert profile.throughput_rps(8) == pytest.approx(8 / 0.011)
    np.testing.assert_allclose(
        profile.latency_table_s(8), [0, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.010, 0.011]
    )


def test_batches_beyond_the_cap_are_refused() -> None:
    with pytest.raises(ValueError, match=r"outside the profile on 'gpu' \(measured 1..8\)"):
        gpu_like().latency_s(9)
    with pytest.raises(ValueError, match="outside"):
        gpu_like().latency_table_s(16)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ((), "no measured batch sizes"),
        ((BatchLatency(2, 1.0, 1.0, 1.0),), "must start at batch size 1"),
        ((BatchLatency(1, 1.0, 1.0, 1.0), BatchLatency(1, 2.0, 2.0, 2.0)), "must increase"),
    ],
)
def test_stage_profile_validation(points: tuple[BatchLatency, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StageProfile("cpu", points)


def test_batch_latency_validation() -> None:
    with pytest.raises(ValueError, match=r"p99 .* is below p50"):
        BatchLatency(1, 0.002, 0.001, 0.002)
    with pytest.raises(ValueError, match="positive finite"):
        BatchLatency(1, 0.0, 0.001, 0.002)
    with pytest.raises(ValueError, match="positive finite"):
        BatchLatency(1, 0.001, 0.001, 0.001, (0.001, float("nan")))


def test_from_samples_summarises_and_keeps_the_samples() -> None:
    samples = [0.001 * k for k in range(1, 101)]
    point = BatchLatency.from_samples(4, samples)
    assert point.p50_s == pytest.approx(0.0505)
    assert point.p99_s == pytest.approx(0.09901)
    assert point.mean_s == pytest.approx(0.0505)
    assert point.samples_s == tuple(samples)


def test_quantile_table_couples_quantiles_across_batch_sizes() -> None:
    profile = StageProfile(
        "cpu",
        (
            BatchLatency.from_samples(1, [1.0, 3.0, 2.0, 4.0]),
            BatchLatency.from_samples(4, [7.0, 4.0, 6.0, 5.0]),
        ),
    )
    table = profile.quantile_table_s(4)
    np.testing.assert_array_equal(table[1], [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(table[4], [4.0, 5.0, 6.0, 7.0])
    np.testing.assert_array_equal(table[2], [2.0, 3.0, 4.0, 5.0])  # a third of the way
    with pytest.raises(ValueError, match="no raw samples"):
        gpu_like().quantile_table_s(2)


@st.composite
def idle_penalties(draw: st.DrawFn) -> IdlePenalty:
    gaps = sorted(set(draw(st.lists(st.floats(1e-4, 0.1), min_size=1, max_size=4))))
    extras = draw(st.lists(st.floats(0.0, 0.01), min_size=len(gaps), max_size=len(gaps)))
    return IdlePenalty.from_medians(gaps, extras)


@st.composite
def stage_profiles(draw: st.DrawFn) -> StageProfile:
    latency = draw(st.floats(1e-4, 1.0))
    points = []
    for size in (1, 2, 4, 8)[: draw(st.integers(1, 4))]:
        latency += draw(st.floats(0.0, 0.5))
        tail = latency * draw(st.floats(1.0, 3.0))
        samples = tuple(draw(st.lists(st.floats(1e-4, 2.0), max_size=4)))
        points.append(BatchLatency(size, latency, tail, latency * 1.1, samples))
    idle = draw(st.none() | idle_penalties())
    hardware = draw(st.sampled_from(["cpu-1", "gpu"]))
    return StageProfile(hardware, tuple(points), idle=idle, cores=draw(st.integers(1, 4)))


overheads = st.builds(
    ServingOverhead,
    *(st.floats(0.0, 0.01) for _ in range(4)),
    st.lists(st.floats(0.0, 0.01), min_size=1, max_size=5).map(tuple),
    st.lists(st.floats(0.0, 0.01), min_size=1, max_size=5).map(tuple),
    st.floats(0.0, 0.01),
    st.none() | st.integers(1, 64),
    st.integers(0, 19),
    st.none() | idle_penalties(),
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(stage_profiles(), min_size=1, max_size=3),
    st.floats(0.0, 0.01),
    st.booleans(),
    st.none() | overheads,
)
def test_pipeline_profile_round_trips_through_json_and_yaml(
    profiles: list[StageProfile],
    hop_s: float,
    with_visits: bool,
    overhead: ServingOverhead | None,
) -> None:
    stages = {f"s{i}": {p.hardware: p} for i, p in enumerate(profiles)}
    names = tuple(stages)
    visits = None
    if with_visits:
        visits = np.arange(5 * len(names)).reshape(5, len(names)) % 3 == 0
    original = PipelineProfile(
        stages,
        hop_s=hop_s,
        visits=visits,
        visit_stages=names if with_visits else (),
        overhead=overhead,
    )
    data = original.to_dict()
    for text in (json.dumps(data), yaml.safe_dump(data)):
        again = PipelineProfile.from_dict(yaml.safe_load(text))
        assert again.to_dict() == data
        assert again.stages == original.stages
        assert again.scale_factors == original.scale_factors
        assert again.overhead == original.overhead


def test_idle_penalty_is_clipped_monotone_and_interpolated() -> None:
    """Measured medians are noisy: a negative extra time is 0 and the curve never falls
    (a longer idle time does not make a batch faster). Linear from (0, 0), flat beyond."""
    idle = IdlePenalty.from_medians([0.001, 0.002, 0.01, 0.05], [-1e-5, 3e-4, 2e-4, 6e-4])
    assert idle.extra_s == (0.0, 3e-4, 3e-4, 6e-4)
    assert idle.extra_at(0.0) == 0.0
    assert idle.extra_at(0.0015) == pytest.approx(1.5e-4)
    assert idle.extra_at(0.03) == pytest.approx(4.5e-4)
    assert idle.extra_at(10.0) == 6e-4
    with pytest.raises(ValueError, match="must increase"):
        IdlePenalty((0.002, 0.001), (0.0, 0.0))
    with pytest.raises(ValueError, match="one extra time per gap"):
        IdlePenalty((0.001,), ())


def test_serving_overhead_summaries_and_validation() -> None:
    overhead = ServingOverhead(0.001, 0.0004, 0.0001, 0.0002, (3e-4, 1e-4, 2e-4), (5e-4,))
    assert overhead.router_visit_cpu_s(1) == pytest.approx(0.0005)
    assert overhead.router_visit_cpu_s(4) == pytest.approx(0.0002)
    assert overhead.visit_s() == pytest.approx(0.0005 + 2e-4)
    np.testing.assert_array_equal(overhead.hop_table_s(), [1e-4, 2e-4, 3e-4])
    profile = PipelineProfile({"a": {"gpu": gpu_like()}}, overhead=overhead)
    assert profile.request_s == pytest.approx(0.001 + 5e-4)
    assert PipelineProfile({"a": {"gpu": gpu_like()}}).request_s == 0.0
    with pytest.raises(ValueError, match="at least one sample"):
        ServingOverhead(0.0, 0.0, 0.0, 0.0, (), (1e-3,))
    with pytest.raises(ValueError, match="router CPU per request"):
        ServingOverhead(-1.0, 0.0, 0.0, 0.0, (1e-3,), (1e-3,))
    with pytest.raises(ValueError, match="shared cores"):
        ServingOverhead(0.0, 0.0, 0.0, 0.0, (1e-3,), (1e-3,), cores=0)
    with pytest.raises(ValueError, match="worker nice must be 0-19"):
        ServingOverhead(0.0, 0.0, 0.0, 0.0, (1e-3,), (1e-3,), worker_nice=-1)
    assert overhead.worker_weight == 1.0
    niced = ServingOverhead(0.0, 0.0, 0.0, 0.0, (1e-3,), (1e-3,), worker_nice=10)
    assert niced.worker_weight == pytest.approx(110 / 1024, rel=0.01)  # the kernel's table


def test_scale_factors_come_from_the_visit_matrix() -> None:
    stages = {n: {"gpu": gpu_like()} for n in ("a", "b")}
    visits = np.array([[1, 1], [1, 0], [1, 0], [1, 1]], dtype=bool)
    profile = PipelineProfile(stages, visits=visits, visit_stages=("a", "b"))
    assert dict(profile.scale_factors) == {"a": 1.0, "b": 0.5}
    with pytest.raises(ValueError, match="disagrees with the visit matrix"):
        PipelineProfile(stages, {"b": 0.7}, visits=visits, visit_stages=("a", "b"))
    with pytest.raises(ValueError, match="name every profiled stage"):
        PipelineProfile(stages, visits=visits[:, :1], visit_stages=("a",))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        PipelineProfile(stages, {"a": 1.5})
    with pytest.raises(KeyError, match=r"not profiled on 'cpu' \(profiled on \['gpu'\]\)"):
        profile.stage("a", "cpu")
    with pytest.raises(ValueError, match="filed under 'cpu' is for 'gpu'"):
        PipelineProfile({"a": {"cpu": gpu_like()}})


def test_clockwork_profiles_read_the_published_table() -> None:
    profiles = load_clockwork_profiles()
    assert set(profiles) >= {"resnet50", "resnet152", "densenet169"}
    resnet50 = profiles["resnet50"]
    assert resnet50.hardware == "gpu"
    assert resnet50.batch_sizes == (1, 2, 4, 8, 16)
    assert resnet50.latency_s(1) == pytest.approx(0.00261)
    assert resnet50.latency_s(16) == pytest.approx(0.01567)
    # Batching raises a GPU's throughput (Fig. 3): 16 / 15.67 ms vs 1 / 2.61 ms.
    assert resnet50.throughput_rps(16) > 2.5 * resnet50.throughput_rps(1)


def test_clockwork_loader_reads_a_given_file(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "table.csv"
    path.write_text("# note\nmodel,b1_ms,b2_ms\ntiny,1.0,1.5\n")
    profiles = load_clockwork_profiles(path, hardware="t4", tail_ratio=1.2)
    assert profiles["tiny"].points[1] == BatchLatency(2, 0.0015, 0.0015 * 1.2, 0.0015)


def test_idle_penalty_from_stretched_sleeps_keeps_its_gaps_increasing() -> None:
    # A busy machine overslept the 0.5 ms gap past the 2 ms one.
    idle = IdlePenalty.from_medians([0.0031, 0.0025, 0.011, 0.05], [1e-4, 2e-4, 3e-4, 4e-4])
    assert idle.gaps_s[0] == 0.0031 and 0.0031 < idle.gaps_s[1] < 0.00311
    assert idle.gaps_s[2:] == (0.011, 0.05)
