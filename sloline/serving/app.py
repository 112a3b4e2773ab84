"""One router process, composed once: the `Router`, its streaming arrival envelope (read
by the metrics and the tuner), the SLO/plan target gauges and its servers (front doors,
worker stream service, metrics). With a plan, the envelope uses the plan's window sizes,
so observed and planned envelopes compare window by window.

The embedded mode (`embedded.py`) adds local worker processes and the tuner around it;
on Kubernetes `sloline router` (`standalone.py`) runs it alone and workers in other pods
dial in. Both stop the same way: readiness turns 503, the client ports take no new
connection, requests in flight and any still sent on open connections are answered (each
connection then closes), within a bound, then every port closes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from sloline.common.envelope import Envelope, StreamingEnvelope, window_sizes
from sloline.serving.metrics import TargetCollector, new_registry
from sloline.serving.router import Router, RouterSettings
from sloline.serving.server import RouterServer, ServerSettings
from sloline.spec import LoadedPipeline

# The envelope gauges report the max over this look-back; Prometheus adds its own
# max_over_time on top, so keep it near a scrape interval.
ENVELOPE_GAUGE_LOOKBACK_S = 15.0


def default_windows_s(slo_s: float) -> tuple[float, ...]:
    """Envelope windows T_s * 2^k up to 60 s (InferLine §5) when no plan gives them: T_s
    is the SLO, capped at 100 ms so sub-second bursts are always visible."""
    return tuple(window_sizes(min(0.1, slo_s), 60.0))


def envelope_windows_s(plan_envelope: Envelope | None, slo_s: float) -> tuple[float, ...]:
    """The router's envelope windows: the plan's, so observed and planned envelopes compare
    window by window; without a plan, :func:`default_windows_s`."""
    return tuple(plan_envelope.windows_s) if plan_envelope else default_windows_s(slo_s)


class RouterApp:
    """`async with RouterApp(...) as app:` serves until the block ends, then drains."""

    def __init__(
        self,
        loaded: LoadedPipeline,
        *,
        max_batch: Mapping[str, int],
        server: ServerSettings,
        router: RouterSettings,
        plan_envelope: Envelope | None = None,
        lambda_windows_s: tuple[float, float] = (5.0, 30.0),
        registry: CollectorRegistry | None = None,
        desired_replicas: Callable[[], Mapping[str, int]] | None = None,
        cost_per_hour: Callable[[], Mapping[str, float]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        drain_s: float = 5.0,
        on_arrival: Callable[[float], None] | None = None,
        observe_arrivals: bool = True,
    ) -> None:
        self.loaded = loaded
        self.settings = server
        self.drain_s = drain_s
        self.registry = registry or new_registry()
        slo = loaded.pipeline.spec.slo
        slo_s = slo.latency_ms / 1000.0
        windows_s = envelope_windows_s(plan_envelope, slo_s)
        # Algorithm 4's λ windows (width, look-back) as the tuner reads them.
        width_s, lookback_s = lambda_windows_s
        self.envelope = StreamingEnvelope(
            windows_s, start_s=clock(), lambda_window_s=width_s, lambda_lookback_s=lookback_s
        )
        # `observe_arrivals=False`: arrivals go to `on_arrival` only, which feeds the
        # envelope itself (embedded router 0 merges every router's in time order).
        arrived = self.envelope.observe if observe_arrivals else on_arrival
        if observe_arrivals and on_arrival is not None:  # also told (embedded: routers 1..)
            observe, told = self.envelope.observe, on_arrival

            def both(t_s: float) -> None:
                observe(t_s)
                told(t_s)

            arrived = both
        self.router = Router(
            loaded.graph,
            max_batch=max_batch,
            settings=router,
            registry=self.registry,
            desired_replicas=desired_replicas,
            clock=clock,
            on_arrival=arrived,
            envelope=lambda: dict(
                zip(
                    self.envelope.windows_s,
                    self.envelope.rates(clock(), ENVELOPE_GAUGE_LOOKBACK_S),
                    strict=True,
                )
            ),
            cost_per_hour=cost_per_hour,
        )
        self.registry.register(TargetCollector(loaded.name, slo_s, slo.percentile, plan_envelope))
        self.server = RouterServer(self.router, self.registry, server)

    async def start(self) -> None:
        await self.server.start()

    async def drain(self, timeout_s: float | None = None) -> None:
        """Turn unready, close the client doors to new connections, and wait (at most
        `timeout_s`) until the requests in flight are answered and the clients have left
        (`RouterServer.close_doors`: what still arrives on an open connection is served,
        with `Connection: close` or after a GOAWAY, so no client sees its request fail)."""
        timeout_s = self.drain_s if timeout_s is None else timeout_s
        self.router.draining = True
        self.server.close_doors(timeout_s)
        deadline = time.monotonic() + timeout_s
        while (self.router.inflight or not self.server.doors_closed()) and (
            time.monotonic() < deadline
        ):
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        await self.server.stop()

    async def __aenter__(self) -> RouterApp:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain()
        await self.stop()

    @property
    def http_url(self) -> str:
        return f"{self.settings.host}:{self.server.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.settings.host}:{self.server.grpc_port}"

    @property
    def worker_url(self) -> str:
        """Where workers dial (`WorkerService`, with the worker token)."""
        return f"{self.settings.worker_host}:{self.server.worker_port}"

    @property
    def metrics_url(self) -> str:
        """Where `/metrics` is scraped: the metrics port if any, else the HTTP port."""
        port = self.server.metrics_port or self.server.http_port
        return f"{self.settings.host}:{port}"
