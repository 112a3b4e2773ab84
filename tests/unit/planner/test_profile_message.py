"""Profiles as termination messages: the round trip, the 4 KiB bound, and that planning
from decoded messages gives the plan the original profiles give."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sloline.lab.synthetic import random_problem
from sloline.planner.estimator import Workload
from sloline.planner.evaluator import Evaluator
from sloline.planner.planner import plan
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import BatchLatency, PipelineProfile, StageProfile
from sloline.planner.profile_message import (
    DEFAULT_HOP_S,
    MAX_MESSAGE_BYTES,
    ProfileMessage,
    assemble_profile,
    decode_message,
    decode_profile,
    encode_message,
    encode_profile,
)


def profile_of(hardware: str, sizes: list[int], seed: int = 0, top_s: float = 0.05) -> StageProfile:
    rng = np.random.default_rng(seed)
    points = []
    for b in sizes:
        p50 = top_s * b / sizes[-1] + float(rng.uniform(1e-4, 1e-3))
        points.append(BatchLatency(b, p50, p50 * float(rng.uniform(1.0, 1.5)), p50 * 1.02))
    return StageProfile(hardware, tuple(points))


def test_round_trip_keeps_latencies_to_the_microsecond_and_visits_exactly() -> None:
    original = profile_of("cpu-2", [1, 2, 4, 8, 16, 32])
    visits = np.random.default_rng(1).random((256, 4)) < 0.3
    text = encode_profile(
        "fast", "cpu-2", original, hop_s=0.000412, visits=visits, visit_stages="abcd"
    )
    message = decode_message(text)
    assert (message.stage, message.hardware, message.hop_s) == ("fast", "cpu-2", 0.000412)
    assert message.profile.batch_sizes == original.batch_sizes
    for got, want in zip(message.profile.points, original.points, strict=True):
        for stat in ("p50", "p99", "mean"):
            assert got.stat_s(stat) == pytest.approx(want.stat_s(stat), abs=0.5e-6)
    assert message.visit_stages == ("a", "b", "c", "d")
    assert message.visits is not None and np.array_equal(message.visits, visits)
    assert decode_profile(text) == message.profile


def test_tiny_latencies_stay_valid_after_rounding() -> None:
    """Sub-microsecond stages round up to 1 us, never to an invalid 0."""
    tiny = StageProfile("cpu-1", (BatchLatency(1, 2e-7, 3e-7, 2e-7),))
    assert decode_profile(encode_profile("s", "cpu-1", tiny)).points[0].p50_s == 1e-6


@pytest.mark.parametrize("cap", [32, 64])
def test_message_fits_in_4_kib_with_every_batch_size_and_a_large_visit_matrix(cap: int) -> None:
    """Worst cases: a point per batch size 1..cap with 10 s latencies, and a random
    256 x 64 visit matrix with long stage names. Whatever does not fit is dropped in
    order (visits, then scale factors), never the latency table."""
    slow = profile_of("gpu-a100-80gb", list(range(1, cap + 1)), top_s=10.0)
    names = [f"stage-{i:02d}-" + "x" * 31 for i in range(64)]
    visits = np.random.default_rng(2).random((256, 64)) < 0.5
    text = encode_profile(
        "stage-00-" + "x" * 31, slow.hardware, slow, hop_s=0.01, visits=visits, visit_stages=names
    )
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    message = decode_message(text)
    assert message.profile.batch_sizes == tuple(range(1, cap + 1))
    assert message.hop_s == 0.01
    # A realistic pipeline keeps its exact visit matrix even at cap 64.
    few = [f"s{i}" for i in range(6)]
    rows = np.random.default_rng(3).random((256, 6)) < 0.5
    doubling = profile_of("cpu-1", [1, 2, 4, 8, 16, 32, 64][: cap.bit_length()])
    text = encode_profile("s0", "cpu-1", doubling, hop_s=0.001, visits=rows, visit_stages=few)
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    kept = decode_message(text).visits
    assert kept is not None and np.array_equal(kept, rows)


def test_visits_fall_back_to_scale_factors_then_to_nothing() -> None:
    points = profile_of("cpu-1", [1, 2, 4])
    visits = np.random.default_rng(4).random((256, 8)) < 0.25
    names = [f"s{i}" for i in range(8)]
    full = encode_profile("s0", "cpu-1", points, visits=visits, visit_stages=names)
    assert "visits" in json.loads(full)
    limit = len(full.encode()) - 1
    scaled = decode_message(
        encode_profile("s0", "cpu-1", points, visits=visits, visit_stages=names, limit_bytes=limit)
    )
    assert scaled.visits is None
    assert scaled.scale_factors == pytest.approx(
        dict(zip(names, visits.mean(axis=0), strict=True)), abs=1e-4
    )
    bare = encode_profile("s0", "cpu-1", points, visits=visits, visit_stages=names, limit_bytes=200)
    assert set(json.loads(bare)) == {"v", "stage", "hardware", "us"}
    with pytest.raises(ValueError, match="lower --cap"):
        encode_profile("s0", "cpu-1", points, limit_bytes=40)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("error: model not found", "not a sloline profile message"),
        ('{"v": 2, "stage": "s", "hardware": "h", "us": []}', "version"),
        ('{"v": 1, "stage": "s", "hardware": "h", "us": [[2, 5, 6, 5]]}', "batch size 1"),
        ('{"v": 1, "stage": "s", "hardware": "h", "us": [[1, 9, 5, 5]]}', "below p50"),
    ],
)
def test_decoding_garbage_says_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        decode_message(text)


def test_assemble_takes_the_newest_profiles_visits_and_the_median_hop() -> None:
    a1, a1_new, b1 = (profile_of("cpu-1", [1, 2], seed=s) for s in (0, 1, 2))
    old_visits = np.array([[True, True], [True, False]])
    new_visits = np.array([[True, True], [True, True], [True, False], [True, True]])
    messages = [
        ProfileMessage("a", a1, 0.001, old_visits, ("a", "b")),
        ProfileMessage("b", b1, 0.003, new_visits, ("a", "b")),
        ProfileMessage("a", a1_new, 0.002, np.array([[True]]), ("a",)),  # covers only a
    ]
    profile = assemble_profile([encode_message(m) for m in messages])
    assert profile.stage("a", "cpu-1").points[0].p50_s == pytest.approx(
        a1_new.points[0].p50_s, abs=1e-6
    )
    assert profile.visits is not None and np.array_equal(profile.visits, new_visits)
    assert profile.scale_factors == {"a": 1.0, "b": 0.75}
    assert profile.hop_s == pytest.approx(0.002)
    assert assemble_profile(messages, hop_s=0.0007).hop_s == 0.0007
    bare = assemble_profile([encode_profile("a", "cpu-1", a1)])
    assert bare.hop_s == DEFAULT_HOP_S and bare.visits is None
    with pytest.raises(ValueError, match="no profile messages"):
        assemble_profile([])


def with_visit_matrix(problem: PlanningProblem) -> PlanningProblem:
    """The problem with a recorded 256-sample visit matrix instead of bare scale factors,
    as the profiler records it."""
    samples = Workload.build(problem.topology, problem.profile, problem.arrivals_s[:256]).visits
    profile = PipelineProfile(
        problem.profile.stages,
        hop_s=problem.profile.hop_s,
        visits=samples,
        visit_stages=problem.topology.stages,
    )
    return dataclasses.replace(problem, profile=profile)


@pytest.mark.parametrize("seed", [3, 5, 6])
def test_plan_from_decoded_messages_equals_plan_from_the_originals(seed: int) -> None:
    problem = with_visit_matrix(random_problem(seed, duration_s=8.0, max_replicas=16))
    original = problem.profile
    assert min(original.scale_factors.values()) < 1.0, "want a conditional stage"
    messages = [
        encode_profile(
            stage,
            hw,
            prof,
            hop_s=original.hop_s,
            visits=original.visits,
            visit_stages=original.visit_stages,
        )
        for stage, per_hw in original.stages.items()
        for hw, prof in per_hw.items()
    ]
    assert all(len(m.encode()) <= MAX_MESSAGE_BYTES for m in messages)
    decoded = dataclasses.replace(problem, profile=assemble_profile(messages))
    assert decoded.profile.scale_factors == original.scale_factors
    want = plan(problem, Evaluator(problem))
    got = plan(decoded, Evaluator(decoded))
    assert got.config == want.config
    assert got.cost_per_hour == want.cost_per_hour
    assert got.p99_s == pytest.approx(want.p99_s, rel=1e-3, abs=1e-5)
