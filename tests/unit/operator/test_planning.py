"""Planning on Kubernetes: cache keys re-profile exactly what a spec change can affect,
the cluster-specific checks name their fields, and real profiling Jobs' messages plan."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sloline.operator.naming import Target
from sloline.operator.planning import (
    CacheEntry,
    ProfileTask,
    assemble,
    catalog_file,
    dataflow_digest,
    operator_issues,
    plan_from_profile,
    plan_inputs,
    profile_tasks,
    read_cache,
)
from sloline.operator.render import pipeline_file
from sloline.operator.settings import OperatorSettings
from sloline.planner.profile import StageProfile
from sloline.planner.profile_message import encode_profile
from tests.support.profile_jobs import profile_message
from tests.unit.operator.helpers import DIGITS, NOOP, gpu_settings, pipeline_object

SETTINGS = OperatorSettings()


def keys(doc: dict, settings: OperatorSettings = SETTINGS) -> dict[tuple[str, str], str]:
    return {(t.stage, t.hardware): t.key for t in profile_tasks(Target.of(doc), settings)}


def rekeyed(doc: dict, changed_doc: dict, settings: OperatorSettings = SETTINGS) -> set[str]:
    before, after = keys(doc, settings), keys(changed_doc, settings)
    assert before.keys() == after.keys()
    return {stage for (stage, _), key in before.items() if after[(stage, _)] != key}


def test_one_key_per_stage_and_allowed_class() -> None:
    found = keys(pipeline_object(DIGITS))
    assert set(found) == {
        (s, hw) for s in ("preprocess", "fast", "accurate", "combine") for hw in ("cpu-1", "cpu-2")
    }
    for (stage, hw), key in found.items():
        assert key.startswith(f"{stage}.{hw}.") and len(key.split(".")[-1]) == 16
    assert keys(pipeline_object(DIGITS)) == found  # stable


def test_a_stage_change_rekeys_it_and_everything_downstream() -> None:
    doc = pipeline_object(DIGITS)
    fast = copy.deepcopy(doc)
    fast["spec"]["stages"][1]["model"]["uri"] = "models/fast-v2.onnx"
    # accurate runs on fast's answer, combine reads both: their profiles may change.
    assert rekeyed(doc, fast) == {"fast", "accurate", "combine"}
    combine = copy.deepcopy(doc)
    combine["spec"]["stages"][3]["model"]["batching"] = "stacked"
    assert rekeyed(doc, combine) == {"combine"}
    slo = copy.deepcopy(doc)
    slo["spec"]["slo"]["latencyMs"] = 80  # planning input only: nothing to measure again
    assert rekeyed(doc, slo) == set()
    samples = copy.deepcopy(doc)
    samples["spec"]["samples"] = {"uri": "samples.npz"}
    assert rekeyed(doc, samples) == {"preprocess", "fast", "accurate", "combine"}
    image = SETTINGS.model_copy(update={"runtime_image": "r:2"})
    assert set(keys(doc)) == set(keys(doc, image))
    assert not set(keys(doc).values()) & set(keys(doc, image).values())


def test_pins_and_allowed_classes_limit_the_jobs() -> None:
    doc = pipeline_object(DIGITS)
    doc["spec"]["hardware"] = ["cpu-2"]
    doc["spec"]["stages"][0]["hardware"] = "cpu-2"
    assert {hw for _, hw in keys(doc)} == {"cpu-2"}
    settings = gpu_settings()
    doc = pipeline_object(DIGITS)
    doc["spec"]["stages"][1]["hardware"] = "gpu-l4"
    found = keys(doc, settings)
    assert [hw for stage, hw in found if stage == "fast"] == ["gpu-l4"]
    assert sorted(hw for stage, hw in found if stage == "accurate") == ["cpu-2", "gpu-l4"]


def test_cluster_checks_name_their_fields() -> None:
    doc = pipeline_object(NOOP, name="1noop")
    doc["spec"]["hardware"] = ["cpu-1", "tpu-9"]
    doc["spec"]["stages"][0]["hardware"] = "cpu-2"
    doc["spec"]["stages"][1]["name"] = "router"
    doc["spec"]["stages"][2]["inputs"][0]["from"] = "router.x"
    doc["spec"]["workload"] = {"traceUri": "trace.txt"}
    issues = {i.path: i.reason for i in operator_issues(Target.of(doc), SETTINGS)}
    assert set(issues) == {
        "spec.hardware[1]",
        "spec.stages[0].hardware",
        "spec.stages[1].name",
        "metadata.name",
        "spec.workload.traceUri",
    }
    assert "tpu-9" in issues["spec.hardware[1]"]
    assert "reserved" in issues["spec.stages[1].name"]
    assert operator_issues(Target.of(pipeline_object(DIGITS)), SETTINGS) == []


@pytest.fixture(scope="module")
def noop_cache() -> tuple[Target, tuple[ProfileTask, ...], dict[str, CacheEntry]]:
    """Real profiling Jobs' messages for the no-op pipeline (`sloline profile-job`'s body
    on the files a Job mounts)."""
    t = Target.of(pipeline_object(NOOP))
    tasks = profile_tasks(t, SETTINGS)
    dataflow = dataflow_digest(t, SETTINGS)
    files = (pipeline_file(t.graph), catalog_file(SETTINGS))
    model_dir = str(NOOP.parent)
    cache = {
        task.key: CacheEntry.of(
            profile_message(*files, task.stage, task.hardware, model_dir), dataflow
        )
        for task in tasks
    }
    return t, tasks, cache


def test_plan_from_real_profiling_messages(noop_cache) -> None:
    t, tasks, cache = noop_cache
    stored = {k: e.to_text() for k, e in cache.items()} | {"pipeline.yaml": "x", "a.b.c": "junk"}
    assert read_cache(stored) == cache  # the ConfigMap round trip, junk dropped
    profile = assemble(tasks, cache, dataflow_digest(t, SETTINGS), SETTINGS)
    assert set(profile.stages) == {"s1", "s2", "s3"}
    assert all(set(per_hw) == {"cpu-1", "cpu-2"} for per_hw in profile.stages.values())
    assert dict(profile.scale_factors) == {"s1": 1.0, "s2": 1.0, "s3": 1.0}
    plan = plan_from_profile(t, profile, SETTINGS)
    assert [s.name for s in plan.stages] == ["s1", "s2", "s3"]
    assert plan.tail_s <= plan.slo_s
    assert plan.cost_per_hour > 0
    assert plan_inputs(t, SETTINGS, tasks) == plan_inputs(t, SETTINGS, tasks)


def test_routing_comes_from_a_message_of_the_current_dataflow() -> None:
    profile = StageProfile.from_latencies("cpu-1", {1: 0.001, 2: 0.0015})
    stages = ("a", "b")
    tasks = (ProfileTask("a", "cpu-1", "a.cpu-1.1"), ProfileTask("b", "cpu-1", "b.cpu-1.2"))
    stale = encode_profile("b", "cpu-1", profile, visits=np.ones((4, 2), bool), visit_stages=stages)
    current_visits = np.array([[1, 0], [1, 1], [1, 0], [1, 0]], bool)
    current = encode_profile("a", "cpu-1", profile, visits=current_visits, visit_stages=stages)
    cache = {
        "a.cpu-1.1": CacheEntry.of(current, "now"),
        "b.cpu-1.2": CacheEntry.of(stale, "before"),
    }
    assembled = assemble(tasks, cache, "now", SETTINGS)
    assert assembled.scale_factors["b"] == 0.25
