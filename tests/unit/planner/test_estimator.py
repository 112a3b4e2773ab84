"""The Estimator (§4.2): hand-checked event traces, queueing closed forms, determinism,
batching, joins and conditional skips."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sloline.common.trace import gamma_arrivals
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Estimate, Workload, estimate, no_queue_latencies
from sloline.planner.profile import PipelineProfile, StageProfile
from sloline.planner.topology import Topology


def linear(single_s: float, cap: int = 8, extra_s: float = 0.0) -> StageProfile:
    """Batch b takes single_s + (b - 1) * extra_s."""
    sizes = [b for b in (1, 2, 4, 8, 16, 32) if b <= cap]
    return StageProfile.from_latencies("hw", {b: single_s + (b - 1) * extra_s for b in sizes})


def run(
    topology: Topology,
    stages: dict[str, StageProfile],
    config: Sequence[tuple[int, int]],
    arrivals: npt.ArrayLike,
    **profile_args: object,
) -> np.ndarray:
    profile = PipelineProfile({n: {"hw": p} for n, p in stages.items()}, **profile_args)  # type: ignore[arg-type]
    workload = Workload.build(topology, profile, arrivals)
    cfg = [StageConfig("hw", b, r) for b, r in config]
    return estimate(topology, profile, cfg, workload).latencies_s


def test_single_replica_fifo_trace() -> None:
    # One stage, batch 1, 1 s service: a queue forms and drains.
    latencies = run(Topology.chain(["a"]), {"a": linear(1.0)}, [(1, 1)], [0.0, 0.5, 0.6, 3.0])
    # q0 0->1, q1 1->2, q2 2->3, q3 3->4.
    np.testing.assert_array_equal(latencies, [1.0, 1.5, 2.4, 1.0])


def test_batches_take_what_is_queued_up_to_max_batch() -> None:
    # Batch of b takes 1 + 0.25 (b - 1) s; max batch 2.
    latencies = run(
        Topology.chain(["a"]),
        {"a": linear(1.0, extra_s=0.25)},
        [(2, 1)],
        [0.0, 0.1, 0.2, 0.3, 0.4],
    )
    # [q0] 0->1; [q1 q2] 1->2.25; [q3 q4] 2.25->3.5.
    np.testing.assert_allclose(latencies, [1.0, 2.15, 2.05, 3.2, 3.1])


def test_replicas_share_one_queue() -> None:
    latencies = run(Topology.chain(["a"]), {"a": linear(1.0)}, [(1, 2)], [0.0, 0.0, 0.0, 0.5])
    # Two idle replicas take q0 and q1 at 0; q2 waits for the first free one (1.0 -> 2.0);
    # q3 for the other (1.0 -> 2.0).
    np.testing.assert_array_equal(latencies, [1.0, 1.0, 2.0, 1.5])


def test_hop_overhead_is_added_per_stage_visit_and_occupies_the_replica() -> None:
    stages = {"a": linear(1.0), "b": linear(2.0)}
    latencies = run(Topology.chain(["a", "b"]), stages, [(1, 1), (1, 1)], [0.0, 0.0], hop_s=0.5)
    # a: q0 0->1.5, q1 1.5->3.0. b: q0 1.5->4.0, q1 4.0->6.5.
    np.testing.assert_array_equal(latencies, [4.0, 6.5])


def test_join_waits_for_the_slowest_branch() -> None:
    topology = Topology.from_deps({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}, "d")
    stages = {"a": linear(1.0), "b": linear(2.0), "c": linear(5.0), "d": linear(1.0)}
    latencies = run(topology, stages, [(1, 1)] * 4, [0.0, 10.0])
    np.testing.assert_array_equal(latencies, [7.0, 7.0])  # a 1 + max(b 2, c 5) + d 1


def test_conditional_skip_replays_the_visit_matrix() -> None:
    # Cascade: fast -> slow (only when fast is unsure) -> combine (reads slow optionally).
    topology = Topology.from_deps(
        {"fast": [], "slow": ["fast"], "combine": ["fast", "slow"]},
        "combine",
        optional={"combine": ["slow"]},
    )
    stages = {"fast": linear(1.0), "slow": linear(10.0), "combine": linear(1.0)}
    visits = np.array([[1, 1, 1], [1, 0, 1]], dtype=bool)  # sample 0 escalates, 1 does not
    latencies = run(
        topology,
        stages,
        [(1, 4)] * 3,
        [0.0, 0.0, 0.0, 0.0],
        visits=visits,
        visit_stages=("fast", "slow", "combine"),
    )
    # Queries 0 and 2 follow sample 0 (12 s), 1 and 3 follow sample 1 (2 s).
    np.testing.assert_array_equal(latencies, [12.0, 2.0, 12.0, 2.0])


def test_skipped_required_input_skips_the_dependent() -> None:
    topology = Topology.from_deps({"a": [], "b": ["a"], "c": ["b"]}, "c")
    stages = {"a": linear(1.0), "b": linear(2.0), "c": linear(3.0)}
    profile = PipelineProfile({n: {"hw": p} for n, p in stages.items()}, {"b": 0.5})
    workload = Workload.build(topology, profile, np.arange(4000) * 100.0, seed=3)
    b_ran = workload.visits[:, 1]
    np.testing.assert_array_equal(workload.visits[:, 2], b_ran)  # c requires b
    assert 0.45 < b_ran.mean() < 0.55
    cfg = [StageConfig("hw", 1, 1)] * 3
    latencies = estimate(topology, profile, cfg, workload).latencies_s
    np.testing.assert_array_equal(latencies, np.where(b_ran, 6.0, 1.0))


def test_bernoulli_visits_match_scale_factors_down_a_cascade() -> None:
    # s_b = 0.6 overall and s_c = 0.3 overall, with c only ever after b (a tree).
    topology = Topology.chain(["a", "b", "c"])
    stages = {n: {"hw": linear(1.0)} for n in "abc"}
    profile = PipelineProfile(stages, {"b": 0.6, "c": 0.3})
    workload = Workload.build(topology, profile, np.arange(20_000, dtype=float), seed=1)
    assert workload.visits[:, 1].mean() == pytest.approx(0.6, abs=0.01)
    assert workload.visits[:, 2].mean() == pytest.approx(0.3, abs=0.01)
    assert not np.any(workload.visits[:, 2] & ~workload.visits[:, 1])


def test_overload_grows_batches_to_max_batch() -> None:
    # 200 rps into a stage that serves 100 rps at batch 1 and 400 rps at batch 8.
    topology = Topology.chain(["a"])
    profile = PipelineProfile({"a": {"hw": linear(0.01, cap=8, extra_s=0.0025)}})
    arrivals = gamma_arrivals(200.0, 60.0, seed=2)
    workload = Workload.build(topology, profile, arrivals)
    low = estimate(topology, profile, [StageConfig("hw", 8, 3)], workload).stages[0]
    high = estimate(topology, profile, [StageConfig("hw", 8, 1)], workload).stages[0]
    assert low.mean_batch < 1.2  # three replicas: mostly idle, batches of one
    assert high.mean_batch > 2.0
    # At overload (batch 1 would need 2x the capacity) batches hit the cap.
    overload = gamma_arrivals(2000.0, 10.0, seed=2)
    w = Workload.build(topology, profile, overload)
    stats = estimate(topology, profile, [StageConfig("hw", 8, 1)], w).stages[0]
    assert stats.mean_batch > 7.9
    assert stats.utilisation > 0.99


def test_same_seed_same_output_and_seeds_matter() -> None:
    topology = Topology.chain(["a", "b"])
    samples = tuple(np.random.default_rng(0).gamma(4.0, 0.0025, 50).tolist())
    from sloline.planner.profile import BatchLatency

    stage = StageProfile(
        "hw",
        (
            BatchLatency.from_samples(1, samples),
            BatchLatency.from_samples(2, [2 * s for s in samples]),
        ),
    )
    profile = PipelineProfile({"a": {"hw": stage}, "b": {"hw": stage}}, {"b": 0.5})
    arrivals = gamma_arrivals(150.0, 20.0, cv2=4.0, seed=5)
    cfg = [StageConfig("hw", 2, 2), StageConfig("hw", 2, 1)]

    def latencies(seed: int) -> np.ndarray:
        workload = Workload.build(topology, profile, arrivals, seed=seed)
        return estimate(topology, profile, cfg, workload, service="samples", seed=seed).latencies_s

    np.testing.assert_array_equal(latencies(7), latencies(7))
    assert not np.array_equal(latencies(7), latencies(8))


def test_md1_mean_wait_matches_pollaczek_khinchine() -> None:
    # M/D/1: W_q = rho * S / (2 (1 - rho)).
    service, rho = 0.01, 0.6
    arrivals = gamma_arrivals(rho / service, 20_000.0, seed=11)
    latencies = run(Topology.chain(["a"]), {"a": linear(service, cap=1)}, [(1, 1)], arrivals)
    expected = rho * service / (2 * (1 - rho))
    assert np.mean(latencies - service) == pytest.approx(expected, rel=0.02)


def erlang_c_wait(servers: int, arrival_rps: float, service_rps: float) -> float:
    """Mean wait in queue of M/M/c (Erlang C)."""
    a = arrival_rps / service_rps
    rho = a / servers
    tail = a**servers / math.factorial(servers) / (1 - rho)
    p_wait = tail / (sum(a**k / math.factorial(k) for k in range(servers)) + tail)
    return p_wait / (servers * service_rps - arrival_rps)


def test_mmc_mean_wait_matches_erlang_c() -> None:
    servers, mean_s, rho = 3, 0.01, 0.7
    rate = rho * servers / mean_s
    topology = Topology.chain(["a"])
    profile = PipelineProfile({"a": {"hw": linear(mean_s, cap=1)}})
    workload = Workload.build(topology, profile, gamma_arrivals(rate, 10_000.0, seed=4))
    cfg = [StageConfig("hw", 1, servers)]
    result = estimate(topology, profile, cfg, workload, service="exponential", seed=4)
    stats = result.stages[0]
    mean_service = stats.busy_s / stats.batches
    wait = float(np.mean(result.latencies_s)) - mean_service
    assert mean_service == pytest.approx(mean_s, rel=0.01)
    assert wait == pytest.approx(erlang_c_wait(servers, rate, 1 / mean_s), rel=0.02)
    assert stats.utilisation == pytest.approx(rho, rel=0.02)


def test_no_queue_latencies_are_a_lower_bound() -> None:
    topology = Topology.from_deps({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}, "d")
    stages = {
        n: linear(t, extra_s=t / 2) for n, t in zip("abcd", (0.01, 0.02, 0.05, 0.01), strict=True)
    }
    profile = PipelineProfile({n: {"hw": p} for n, p in stages.items()}, {"c": 0.5}, hop_s=0.001)
    workload = Workload.build(topology, profile, gamma_arrivals(80.0, 30.0, seed=9), seed=9)
    floor = no_queue_latencies(topology, workload, [0.011, 0.021, 0.051, 0.011])
    busy = estimate(topology, profile, [StageConfig("hw", 4, 1)] * 4, workload).latencies_s
    ample = estimate(topology, profile, [StageConfig("hw", 1, 50)] * 4, workload).latencies_s
    assert np.all(busy >= floor - 1e-12)
    np.testing.assert_allclose(ample, floor)  # with ample replicas nobody waits


def test_rejects_unsorted_trace_and_wrong_config_length() -> None:
    topology = Topology.chain(["a"])
    profile = PipelineProfile({"a": {"hw": linear(1.0)}})
    with pytest.raises(ValueError, match="sorted"):
        Workload.build(topology, profile, [1.0, 0.0])
    workload = Workload.build(topology, profile, [0.0])
    with pytest.raises(ValueError, match="2 stage configs for 1 stages"):
        estimate(topology, profile, [StageConfig("hw", 1, 1)] * 2, workload)
    with pytest.raises(ValueError, match="outside the profile"):
        estimate(topology, profile, [StageConfig("hw", 64, 1)], workload)


@given(
    st.lists(st.floats(0.0, 10.0), min_size=1, max_size=300),
    st.sampled_from([1.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0]),
    st.floats(0.0, 10.0),
)
def test_percentile_is_numpys_inverted_cdf_and_matches_attainment(
    values: list[float], q: float, slo: float
) -> None:
    result = Estimate(np.array(values), ())
    assert result.percentile_s(q) == np.percentile(values, q, method="inverted_cdf")
    # The SLO check on the percentile is exactly the attainment check.
    assert (result.percentile_s(q) <= slo) == (result.attainment(slo) >= q / 100.0)
