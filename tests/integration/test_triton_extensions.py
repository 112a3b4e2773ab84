"""Triton's configuration, statistics and repository extensions on the real embedded
stack, read with the real `tritonclient` HTTP and gRPC clients (what perf_analyzer asks
for)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sloline.serving.router import RouterSettings
from tests.support.serve import EXAMPLES, BackgroundPipeline, build_example

MAX_ROWS = RouterSettings().max_rows


@pytest.fixture(scope="module")
def served():
    build_example("digits-cascade")
    with BackgroundPipeline(EXAMPLES / "digits-cascade" / "pipeline.yaml") as pipeline:
        yield pipeline


def test_config_stats_and_index_follow_the_requests(served) -> None:
    client = httpclient.InferenceServerClient(served.http_url)
    meta = client.get_model_metadata("digits-cascade")
    name = meta["name"]
    config = client.get_model_config(name)
    assert config["name"] == name and config["max_batch_size"] == MAX_ROWS
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        (t["name"], f"TYPE_{t['datatype']}", t["shape"][1:]) for t in meta["inputs"]
    ]
    assert client.get_model_repository_index() == [
        {"name": name, "version": v, "state": "READY"} for v in meta["versions"]
    ]

    before = client.get_inference_statistics(name)["model_stats"][0]
    (spec,) = meta["inputs"]
    tensor = httpclient.InferInput(spec["name"], [1, *spec["shape"][1:]], spec["datatype"])
    tensor.set_data_from_numpy(np.zeros([1, *spec["shape"][1:]], dtype=np.float32))
    for _ in range(3):
        client.infer(name, [tensor])
    bad = httpclient.InferInput(spec["name"], [1, 3], spec["datatype"])
    bad.set_data_from_numpy(np.zeros([1, 3], dtype=np.float32))
    with pytest.raises(InferenceServerException):
        client.infer(name, [bad])
    two = httpclient.InferInput(spec["name"], [2, *spec["shape"][1:]], spec["datatype"])
    two.set_data_from_numpy(np.zeros([2, *spec["shape"][1:]], dtype=np.float32))
    client.infer(name, [two])  # one request of two rows
    every = client.get_inference_statistics()["model_stats"]
    after = every[0]
    assert after["name"] == name
    assert after["execution_count"] - before["execution_count"] == 4
    assert after["inference_count"] - before["inference_count"] == 5
    success = after["inference_stats"]["success"]
    assert success["count"] - before["inference_stats"]["success"]["count"] == 4
    assert success["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["last_inference"] > 0
    # The request's time splits into stage queues and model time, within its whole time.
    inf = after["inference_stats"]
    assert 0 < inf["compute_infer"]["ns"] < inf["success"]["ns"]
    assert inf["queue"]["ns"] + inf["compute_infer"]["ns"] <= inf["success"]["ns"]
    counts = {k: inf[k]["count"] for k in ("compute_input", "compute_infer", "compute_output")}
    assert set(counts.values()) == {success["count"]}
    rows = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert rows[2] >= 1 and sum(rows.values()) == success["count"]

    # Each stage is a model of its own: items, batches by exact size, queue and model time.
    stages = {m["name"]: m for m in every[1:]}
    assert set(stages) == {"preprocess", "fast", "accurate", "combine"}
    for stage in ("preprocess", "fast", "combine"):  # every row visits these
        entry = stages[stage]
        assert entry == client.get_inference_statistics(stage)["model_stats"][0]
        assert entry["inference_count"] == after["inference_count"], stage
        by_size = {b["batch_size"]: b for b in entry["batch_stats"]}
        assert (
            sum(size * b["compute_infer"]["count"] for size, b in by_size.items())
            == (entry["inference_count"])
        )
        assert (
            sum(b["compute_infer"]["count"] for b in by_size.values()) == (entry["execution_count"])
        )
        assert all(b["compute_infer"]["ns"] > 0 for b in by_size.values())
        assert entry["inference_stats"]["compute_infer"]["ns"] > 0
        assert entry["inference_stats"]["queue"]["count"] >= entry["inference_count"]


def test_unknown_model_and_load_are_clear_errors(served) -> None:
    client = httpclient.InferenceServerClient(served.http_url)
    with pytest.raises(InferenceServerException, match="ghost"):
        client.get_model_config("ghost")
    with pytest.raises(InferenceServerException, match="not supported"):
        client.load_model("digits-cascade")


def test_grpc_config_stats_and_index(served) -> None:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    meta = client.get_model_metadata("digits-cascade", as_json=True)
    name = meta["name"]
    config = client.get_model_config(name, as_json=True)["config"]
    assert config["name"] == name and config["max_batch_size"] == MAX_ROWS
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        (t["name"], f"TYPE_{t['datatype']}", t["shape"][1:]) for t in meta["inputs"]
    ]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [{"name": name, "version": v, "state": "READY"} for v in meta["versions"]]

    def executions() -> int:
        stats = client.get_inference_statistics(name, as_json=True)["model_stats"][0]
        return int(stats.get("execution_count", 0))

    before = executions()
    (spec,) = meta["inputs"]
    shape = [1, *(int(d) for d in spec["shape"][1:])]  # as_json: int64 as strings
    tensor = grpcclient.InferInput(spec["name"], shape, spec["datatype"])
    tensor.set_data_from_numpy(np.zeros(shape, dtype=np.float32))
    client.infer(name, [tensor])
    client.infer(name, [tensor])
    assert executions() - before == 2
    (fast,) = client.get_inference_statistics("fast", as_json=True)["model_stats"]
    assert fast["name"] == "fast" and int(fast["inference_count"]) >= 2
    assert sum(int(b["compute_infer"]["count"]) for b in fast["batch_stats"]) == int(
        fast["execution_count"]
    )
    with pytest.raises(InferenceServerException, match="not supported"):
        client.unload_model(name)
    with pytest.raises(InferenceServerException, match="ghost"):
        client.get_inference_statistics("ghost")
