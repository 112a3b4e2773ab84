"""`sloline router`'s composition: max batch from the plan (a spec pin wins), a plan for
another pipeline or other stages is refused with the fix, and the cost gauge prices the
connected workers at the plan's price per replica."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sloline.common.envelope import Envelope
from sloline.planner.plan import Plan, StagePlan
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.spec import PipelineError, load_pipeline
from sloline.standalone import load_plan, max_batches, replica_prices, standalone_router

NOOP = Path(__file__).resolve().parents[1] / "support" / "pipelines" / "noop" / "pipeline.yaml"


def a_plan(pipeline: str = "noop", stages: tuple[str, ...] = ("s1", "s2", "s3")) -> Plan:
    return Plan(
        pipeline=pipeline,
        stages=tuple(
            StagePlan(n, "cpu-2", 8, 2, 0.2, 100.0, 0.5, 1.0, 0.01, 2.0, 0.4) for n in stages
        ),
        slo_s=0.1,
        percentile=99.0,
        cost_per_hour=0.6,
        p50_s=0.01,
        p99_s=0.02,
        tail_s=0.02,
        attainment=1.0,
        rate_rps=50.0,
        envelope=Envelope((0.05, 0.1), (80.0, 70.0)),
    )


def test_max_batch_pin_beats_the_plan_which_beats_one(tmp_path: Path) -> None:
    text = NOOP.read_text().replace("    - name: s2\n", "    - name: s2\n      maxBatch: 3\n")
    (tmp_path / "pipeline.yaml").write_text(text)
    loaded = load_pipeline(tmp_path / "pipeline.yaml", model_dir=NOOP.parent)
    assert max_batches(loaded, a_plan()) == {"s1": 8, "s2": 3, "s3": 8}
    assert max_batches(loaded, None) == {"s1": 1, "s2": 3, "s3": 1}
    assert replica_prices(a_plan()) == {"s1": 0.1, "s2": 0.1, "s3": 0.1}


@pytest.mark.parametrize(
    ("plan", "needle"),
    [(a_plan(pipeline="other"), "for 'other'"), (a_plan(stages=("s1", "s2")), "re-plan")],
)
def test_a_plan_for_something_else_is_refused(plan: Plan, needle: str) -> None:
    with pytest.raises(PipelineError, match=needle):
        standalone_router(
            load_pipeline(NOOP), plan, server=ServerSettings(), router=RouterSettings()
        )


def test_plan_files_are_read_as_json_or_yaml_and_garbage_is_explained(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(a_plan().to_dict()))
    assert load_plan(path) == a_plan()
    path.write_text("stages: []\n")
    with pytest.raises(PipelineError, match="sloline plan"):
        load_plan(path)
    with pytest.raises(PipelineError, match="cannot read"):
        load_plan(tmp_path / "missing.json")


def test_gauges_report_connected_workers_and_their_cost_but_no_desired_count() -> None:
    app = standalone_router(
        load_pipeline(NOOP), a_plan(), server=ServerSettings(), router=RouterSettings()
    )
    queue = app.router.queues["s2"]
    queue.add_worker("w1", 0.0)
    queue.add_worker("w2", 0.0)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in app.registry.collect()
        for s in family.samples
    }
    ready = ("pipeline", "noop"), ("stage", "s2"), ("state", "ready")
    assert samples[("sloline_stage_replicas", ready)] == 2
    assert not [k for k in samples if ("state", "desired") in k[1]]
    cost = ("pipeline", "noop"), ("stage", "s2")
    assert samples[("sloline_stage_cost_per_hour", cost)] == pytest.approx(0.2)
