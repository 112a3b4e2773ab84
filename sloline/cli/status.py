"""The compact live status `sloline run` draws: one line per stage, one for the pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sloline.backends.base import ReplicaStatus
from sloline.serving.stats import Window

if TYPE_CHECKING:
    from sloline.embedded import EmbeddedPipeline


def render_status(
    pipeline: str,
    slo_ms: float,
    request: Window,
    attainment: float,
    stages: Mapping[str, tuple[ReplicaStatus, int, int, Window, Window]],
    notes: list[str],
) -> str:
    """stages: name -> (replica status, ready workers, queue length, visit latency, batch)."""
    ok = "ok" if request.p99_s * 1000 <= slo_ms else "MISS"
    lines = [
        f"{pipeline}: {request.rate_rps:7.1f} rps  p50 {request.p50_s * 1000:6.1f} ms  "
        f"p99 {request.p99_s * 1000:6.1f} ms / SLO {slo_ms:.0f} ms [{ok}]  "
        f"attainment {attainment * 100:6.2f}%",
        f"  {'stage':<16}{'replicas':>10}{'queue':>7}{'batch':>7}{'p99 ms':>9}{'restarts':>9}",
    ]
    for name, (replicas, ready, queue, visit, batch) in stages.items():
        lines.append(
            f"  {name:<16}{f'{ready}/{replicas.desired}':>10}{queue:>7}{batch.mean:>7.1f}"
            f"{visit.p99_s * 1000:>9.1f}{replicas.restarts:>9}"
        )
    lines.extend(f"  ! {note}" for note in notes)
    return "\n".join(lines)


def status_text(p: EmbeddedPipeline, now: float, interval: float) -> str:
    """``p``'s status block: the last ``5 * interval`` seconds' traffic, the last minute's
    attainment, and the latest worker errors, tuner decisions and adopted re-plan."""
    spec = p.loaded.pipeline.spec
    stats, router = p.router.stats, p.router
    status = p.backend.status() if p.backend else {}
    replicas = router.replicas()
    window = interval * 5
    return render_status(
        p.loaded.name,
        spec.slo.latency_ms,
        Window.of(stats.latency.since(now - window), window),
        stats.attainment(now, 60.0, router.slo_s),
        {
            n: (
                status[n],
                replicas[n][1],
                len(router.queues[n]),
                Window.of(stats.stage_latency[n].since(now - window), window),
                Window.of(stats.stage_batch[n].since(now - window), window),
            )
            for n in router.queues
        },
        [f"{n}: {s.last_error}" for n, s in status.items() if s.last_error]
        + [
            f"tuner {now - t:4.0f}s ago: {d.stage} {d.from_replicas}->{d.to_replicas}: {d.reason}"
            for t, d in list(p.tuner.history if p.tuner else [])[-3:]
        ]
        + [
            f"re-plan {now - t:4.0f}s ago: ${a.cost_per_hour:.3f}/hour for "
            f"{a.rate_rps:.1f} rps: "
            + ", ".join(f"{s.name} {s.replicas}x{s.hardware}/b{s.max_batch}" for s in a.stages)
            for t, a in (p.replanner.adopted if p.replanner else [])[-1:]
        ],
    )


async def status_loop(
    p: EmbeddedPipeline, stop: asyncio.Event, *, interval: float, duration: float
) -> None:
    """Print ``p``'s status every ``interval`` seconds (0: never) until ``stop`` is set or
    ``duration`` seconds have passed (0: no limit); on a terminal, redrawn in place."""
    started = time.monotonic()
    redraw = sys.stdout.isatty()
    drawn = 0
    while not stop.is_set():
        # Without a status line, sleep until stopped (or until the duration ends).
        timeout = interval if interval > 0 else None
        if duration:
            left = max(0.0, duration - (time.monotonic() - started))
            timeout = left if timeout is None else min(timeout, left)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout)
        if duration and time.monotonic() - started >= duration:
            break
        if interval <= 0 or stop.is_set():
            continue
        text = status_text(p, time.monotonic(), interval)
        if redraw and drawn:
            sys.stdout.write(f"\x1b[{drawn}F\x1b[J")  # redraw the status block in place
        print(text, flush=True)
        drawn = text.count("\n") + 1
