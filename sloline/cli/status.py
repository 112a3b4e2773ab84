"""The compact live status `sloline run` draws: one line per stage, one for the pipeline."""

from __future__ import annotations

from collections.abc import Mapping

from sloline.backends.base import ReplicaStatus
from sloline.serving.stats import Window


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
