"""Triton's statistics documents from the router's counts: the pipeline as one model,
each stage as a model of its own, batch sizes counted exactly; several routers'
documents added up."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sloline.serving.metrics import LATENCY_BUCKETS_S, Series
from sloline.serving.triton_stats import TritonStats, add_statistics


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


def _document(stats: TritonStats, router: str) -> dict[str, Any]:
    ext_entries = [stats.to_json("p", "1"), stats.stage_json("a", "1"), stats.stage_json("b", "1")]
    return {"router": router, "model_stats": ext_entries}


def test_routers_documents_add_up_model_by_model() -> None:
    one = _stats()
    other = TritonStats({"a": Series(LATENCY_BUCKETS_S), "b": Series(LATENCY_BUCKETS_S)})
    other.queue_waits["a"].observe(0.001)
    other.batch("a", 2, 0.006)  # a size only this router saw
    other.batch("a", 1, 0.002)
    other.success(0.040, 2)
    other.last_inference_ms = one.last_inference_ms + 5
    mine, theirs = _document(one, "r0"), _document(other, "r1")
    before = copy.deepcopy(mine)
    total = add_statistics(mine, theirs)
    assert mine == before  # a new document; neither input changes
    assert total["router"] == "r0"
    p, a, b = total["model_stats"]
    assert [e["name"] for e in total["model_stats"]] == ["p", "a", "b"]
    assert p["execution_count"] == 4 and p["inference_count"] == 6
    assert p["last_inference"] == one.last_inference_ms + 5  # the later, not the sum
    assert p["inference_stats"]["success"] == {"count": 4, "ns": 220_000_000}
    assert p["inference_stats"]["fail"] == {"count": 1, "ns": 500_000_000}
    assert p["inference_stats"]["queue"] == {"count": 4, "ns": 16_000_000}
    assert [(x["batch_size"], x["compute_infer"]) for x in p["batch_stats"]] == [
        (1, {"count": 2, "ns": 110_000_000}),
        (2, {"count": 2, "ns": 110_000_000}),
    ]
    assert a["inference_count"] == 4 + 3 and a["execution_count"] == 2 + 2
    assert [(x["batch_size"], x["compute_infer"]["count"]) for x in a["batch_stats"]] == [
        (1, 2),
        (2, 1),
        (3, 1),
    ]
    assert all(x[f]["count"] for x in a["batch_stats"] for f in ("compute_input", "compute_output"))
    assert b == mine["model_stats"][2] | {"last_inference": p["last_inference"]}
    # Adding is order-free in the numbers: the other way round gives the same counts.
    reverse = add_statistics(theirs, mine)
    assert reverse["model_stats"] == total["model_stats"]


def test_a_model_or_field_only_one_side_has_adds_nothing() -> None:
    mine = _document(_stats(), "r0")
    theirs = copy.deepcopy(mine)
    theirs["model_stats"].append({"name": "new-stage", "execution_count": 9})
    del theirs["model_stats"][0]["inference_stats"]["cache_hit"]
    theirs["model_stats"][0]["inference_stats"]["extra"] = {"count": 1, "ns": 1}
    total = add_statistics(mine, theirs)
    assert [e["name"] for e in total["model_stats"]] == ["p", "a", "b"]
    inference = total["model_stats"][0]["inference_stats"]
    assert "extra" not in inference and inference["cache_hit"] == {"count": 0, "ns": 0}
    assert inference["success"]["count"] == 6


@pytest.mark.parametrize(
    "broken",
    [
        {},
        {"model_stats": {}},
        {"model_stats": [7]},
        {"model_stats": [{"name": "p", "execution_count": "3"}]},
        {"model_stats": [{"name": "p", "execution_count": True}]},
        {"model_stats": [{"name": "p", "inference_stats": []}]},
        {"model_stats": [{"name": "p", "batch_stats": {}}]},
        {"model_stats": [{"name": "p", "batch_stats": [{"batch_size": "1"}]}]},
    ],
)
def test_a_document_that_is_not_statistics_is_refused(broken: dict[str, Any]) -> None:
    mine = _document(_stats(), "r0")
    with pytest.raises((ValueError, KeyError)):
        add_statistics(mine, broken)
