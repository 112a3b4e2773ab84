"""The tuner daemon's pure parts: tuning parameters from the deployed plan and spec, and
the attainment it reports."""

from __future__ import annotations

import copy
import math

from sloline.operator.naming import Target
from sloline.operator.settings import parse_settings
from sloline.operator.tuner import attainment_query, format_attainment, tuning_for
from tests.unit.operator.helpers import make_plan, pipeline_object


def test_tuning_follows_the_plan_and_the_spec_bounds() -> None:
    doc = pipeline_object()
    doc["spec"]["stages"][0]["replicas"] = 3  # pinned: the tuner leaves it alone
    doc["spec"]["stages"][1].update(minReplicas=2, maxReplicas=5)
    t = Target.of(doc)
    plan = make_plan(t, replicas=2)
    settings = parse_settings({"tuner": {"maxReplicas": 12, "stabilizationS": 20}})
    stages, tuner = tuning_for(plan, t.graph, settings)
    assert [s.name for s in stages] == ["s2", "s3"]
    s2, s3 = stages
    assert (s2.min_replicas, s2.max_replicas, s3.min_replicas, s3.max_replicas) == (2, 5, 1, 12)
    assert s2.throughput_rps == plan.stage("s2").throughput_rps
    # s2 is planned at its floor (2 replicas, min 2): it gets the others' rho, not a smaller one.
    assert s2.max_provisioning_ratio >= plan.stage("s2").rho
    assert tuner.windows_s == plan.envelope.windows_s
    assert tuner.stabilization_s == 20


def test_no_pinned_stage_no_exclusion() -> None:
    t = Target.of(copy.deepcopy(pipeline_object()))
    stages, _ = tuning_for(make_plan(t), t.graph, parse_settings({}))
    assert [s.name for s in stages] == ["s1", "s2", "s3"]
    assert all(s.max_replicas == 8 for s in stages)


def test_attainment_text_and_query() -> None:
    assert format_attainment(0.99523) == "99.52%"
    assert format_attainment(1.0000001) == "100.00%"
    assert format_attainment(math.nan) is None
    query = attainment_query("team-a", "noop")
    assert 'sloline_slo_miss_total{namespace="team-a", pipeline="noop"}[5m]' in query
    assert 'sloline_requests_total{namespace="team-a", pipeline="noop"}[5m]' in query
