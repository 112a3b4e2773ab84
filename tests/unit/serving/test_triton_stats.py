"""Triton's statistics documents from the router's counts: the pipeline as one model,
each stage as a model of its own, batch sizes counted exactly."""

from __future__ import annotations

from sloline.serving.metrics import LATENCY_BUCKETS_S, Series
from sloline.serving.triton_stats import TritonStats


def _stats() -> TritonStats:
    waits = {"a": Series(LATENCY_BUCKETS_S), "b": Series(LATENCY_BUCKETS_S)}
    stats = TritonStats(waits, max_batch_size=8)
    # Three requests: two of one row, one of two rows; a stage-a batch of 3 then of 1,
    # stage b one batch of 4.
    for wait in (0.001, 0.002, 0.003, 0.004):
        waits["a"].observe(wait)
        waits["b"].observe(wait / 2)
    stats.batch("a", 3, 0.010)
    stats.batch("a", 1, 0.004)
    stats.batch("b", 4, 0.020)
    stats.success(0.050, 1)
    stats.success(0.060, 1)
    stats.success(0.070, 2)
    stats.fail(0.5)
    return stats


def test_pipeline_entry_splits_time_into_queue_and_model_time() -> None:
    doc = _stats().to_json("p", "1")
    assert doc["inference_count"] == 4 and doc["execution_count"] == 3
    inf = doc["inference_stats"]
    assert inf["success"] == {"count": 3, "ns": 180_000_000}
    assert inf["fail"] == {"count": 1, "ns": 500_000_000}
    # Queue: every item's wait at every stage; compute: each item's batch model time.
    assert inf["queue"] == {"count": 3, "ns": 15_000_000}
    assert inf["compute_infer"] == {"count": 3, "ns": 3 * 10_000_000 + 4_000_000 + 4 * 20_000_000}
    # perf_analyzer refuses server stats whose compute counts differ.
    assert inf["compute_input"]["count"] == inf["compute_output"]["count"] == 3
    assert [(b["batch_size"], b["compute_infer"]) for b in doc["batch_stats"]] == [
        (1, {"count": 2, "ns": 110_000_000}),
        (2, {"count": 1, "ns": 70_000_000}),
    ]


def test_stage_entries_count_batches_by_size() -> None:
    stats = _stats()
    a, b = stats.stage_json("a", "1"), stats.stage_json("b", "1")
    assert a["name"] == "a" and a["inference_count"] == 4 and a["execution_count"] == 2
    assert a["inference_stats"]["queue"] == {"count": 4, "ns": 10_000_000}
    assert a["inference_stats"]["compute_infer"] == {"count": 4, "ns": 34_000_000}
    assert a["inference_stats"]["success"]["ns"] == 44_000_000
    assert [(x["batch_size"], x["compute_infer"]) for x in a["batch_stats"]] == [
        (1, {"count": 1, "ns": 4_000_000}),
        (3, {"count": 1, "ns": 10_000_000}),
    ]
    assert [(x["batch_size"], x["compute_infer"]["count"]) for x in b["batch_stats"]] == [(4, 1)]
    assert stats.max_batch_size == 8
