"""The tuner's Prometheus source, against a real Prometheus scraping the router, yields the
same decisions as the router's in-process feed on the same traffic."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from sloline.measure.session import PlanningSession
from sloline.tuner.policy import StageState, TunerContext, TunerSettings, decide
from sloline.tuner.sources import PrometheusSource, StreamingSource
from tests.integration.test_tuner_live import open_loop
from tests.support.net import free_port
from tests.support.prometheus import Prometheus
from tests.support.serve import SLEEPY, BackgroundPipeline

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
