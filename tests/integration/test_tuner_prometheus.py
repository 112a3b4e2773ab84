"""The tuner's Prometheus source, against a real Prometheus scraping the router, yields the
same decisions as the router's in-process feed on the same traffic, and tunes pipelines of
the same name in two namespaces apart."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from sloline.measure.session import PlanningSession
from sloline.operator.tuner import attainment_query
from sloline.tuner.policy import StageState, TunerContext, TunerSettings, decide
from sloline.tuner.sources import PrometheusSource, StreamingSource
from tests.integration.test_tuner_live import open_loop
from tests.support.net import free_port
from tests.support.prometheus import Prometheus
from tests.support.serve import SLEEPY, BackgroundPipeline
from tests.support.synthetic_router import SyntheticRouter

LOOKBACK_S = 20.0


def test_prometheus_source_matches_live_feed(
    tmp_path: Path, sleepy_session: PlanningSession
) -> None:
    plan = sleepy_session.plan
    windows = plan.envelope.windows_s
    settings = TunerSettings(window_base_s=windows[0], window_max_s=windows[-1])
    stages = tuple(
        StageState(
            s.name, s.replicas, s.replicas, 1, 8, s.scale_factor, s.throughput_rps, max(s.rho, 0.5)
        )
        for s in plan.stages
    )

    def decisions(observation, now_s: float) -> dict[str, int]:
        context = TunerContext(
            now_s,
            stages,
            plan.envelope,
            observation.observed_envelope,
            observation.recent_lambdas_rps,
            last_change_s=now_s,
        )
        return {d.stage: d.to_replicas for d in decide(context, settings).decisions}

    with BackgroundPipeline(SLEEPY, plan=plan, run_tuner=False) as served:
        prometheus = Prometheus(
            tmp_path,
            [],
            free_port(),
            scrape_configs=[
                {
                    "job_name": "sloline",
                    "static_configs": [
                        {"targets": [served.http_url], "labels": {"namespace": "team-a"}}
                    ],
                }
            ],
        )
        try:
            prometheus.wait_ready()
            live = StreamingSource(served.p.envelope, lookback_s=LOOKBACK_S)
            remote = PrometheusSource(
                prometheus.url,
                "team-a",
                "sleepy",
                windows_s=windows,
                lookback_s=LOOKBACK_S - 1.0,
            )
            load = threading.Thread(
                target=lambda: asyncio.run(
                    open_loop(served.grpc_url, [(25.0, 8.0), (70.0, 10.0), (25.0, 6.0)])
                )
            )
            started = time.monotonic()
            load.start()
            compared = []
            # Before the burst, and after it while it is inside both look-backs (during a
            # rising burst the scraped series lags the live one by up to a scrape).
            for at in (6.0, 20.0, 23.0):
                time.sleep(max(0.0, started + at - time.monotonic()))
                now = served.p.router.clock()
                mine = decisions(served.call(live.observe(now)), now)
                theirs = decisions(asyncio.run(remote.observe(now)), now)
                compared.append((now, mine, theirs))
            load.join(60)
        finally:
            prometheus.stop()
    for _, mine, theirs in compared:
        assert mine == theirs, compared
    assert any(mine for _, mine, _ in compared), f"the burst triggered no decision: {compared}"


def test_same_named_pipelines_in_two_namespaces_are_tuned_apart(
    tmp_path: Path, sleepy_session: PlanningSession
) -> None:
    """Two routers of pipeline "sleepy", one per namespace, scraped by one Prometheus: a
    burst in team-a scales team-a up and leaves team-b alone, and each namespace's
    attainment counts its own requests only."""
    plan = sleepy_session.plan
    windows = plan.envelope.windows_s
    settings = TunerSettings(window_base_s=windows[0], window_max_s=windows[-1])
    stages = tuple(
        StageState(
            s.name, s.replicas, s.replicas, 1, 8, s.scale_factor, s.throughput_rps, max(s.rho, 0.5)
        )
        for s in plan.stages
    )
    names = [s.name for s in plan.stages]
    with (
        SyntheticRouter("sleepy", names, windows) as burst,
        SyntheticRouter("sleepy", names, windows) as calm,
    ):
        prometheus = Prometheus(
            tmp_path,
            [],
            free_port(),
            scrape_configs=[
                {
                    "job_name": f"router-{namespace}",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{r.port}"], "labels": {"namespace": namespace}}
                    ],
                }
                for namespace, r in (("team-a", burst), ("team-b", calm))
            ],
        )
        try:
            prometheus.wait_ready()
            burst.rate_rps = 10 * plan.rate_rps  # ten times the plan at every window
            burst.envelope = {
                w: 10 * r for w, r in zip(windows, plan.envelope.rates_rps, strict=True)
            }
            calm.rate_rps = 0.5 * plan.rate_rps
            calm.envelope = {
                w: 0.5 * r for w, r in zip(windows, plan.envelope.rates_rps, strict=True)
            }
            # Scraped before team-b's misses, so increase() counts them.
            deadline = time.monotonic() + 30.0
            while len(prometheus.query("sloline_slo_miss_total")) < 2:
                assert time.monotonic() < deadline, "Prometheus never scraped both routers"
                time.sleep(0.25)
            for _ in range(20):  # team-b's only misses: 20 failed requests
                calm.metrics.answered(504, None, 1.0)
            time.sleep(5.0)  # a few scrapes: rate() and the look-back see both
            sources = {
                namespace: PrometheusSource(
                    prometheus.url,
                    namespace,
                    "sleepy",
                    windows_s=windows,
                    lookback_s=5.0,
                    lambda_window_s=1.0,
                    lambda_lookback_s=4.0,
                    lambda_rate_window_s=3.0,
                )
                for namespace in ("team-a", "team-b")
            }
            observed = {ns: asyncio.run(s.observe(0.0)) for ns, s in sources.items()}
            attainment = {
                ns: prometheus.query(attainment_query(ns, "sleepy", "1m")) for ns in sources
            }
        finally:
            prometheus.stop()
    decided = {}
    for namespace, observation in observed.items():
        context = TunerContext(
            100.0,
            stages,
            plan.envelope,
            observation.observed_envelope,
            observation.recent_lambdas_rps,
            last_change_s=100.0,
        )
        decided[namespace] = {d.stage: d.to_replicas for d in decide(context, settings).decisions}
    ours = dict(zip(windows, plan.envelope.rates_rps, strict=True))
    assert observed["team-a"].observed_envelope.rates_rps == pytest.approx(
        [10 * ours[w] for w in windows]
    )
    assert observed["team-b"].observed_envelope.rates_rps == pytest.approx(
        [0.5 * ours[w] for w in windows]
    )
    planned = {s.name: s.replicas for s in plan.stages}
    assert decided["team-a"], decided
    assert all(to > planned[stage] for stage, to in decided["team-a"].items()), decided
    assert all(to <= planned[stage] for stage, to in decided["team-b"].items()), decided
    # team-a answered everything within the SLO; team-b's misses stay in team-b.
    (a,) = attainment["team-a"]
    (b,) = attainment["team-b"]
    assert float(a["value"][1]) == 1.0
    assert float(b["value"][1]) < 1.0, attainment
