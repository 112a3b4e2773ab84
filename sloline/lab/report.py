"""What a closed-loop comparison reports, per (trace, policy), and how it renders.

Metrics, computed from a :class:`~sloline.lab.loop.Run`:

- **SLO attainment**: the fraction of the trace's queries answered within the SLO;
- **cost**: billed replica-seconds (starting, serving and leaving replicas) times each
  stage's hardware price per hour, over the trace, in dollars;
- **time to recover**: after each load change, how long until the rolling tail latency
  (the SLO percentile of the queries that arrived in the last ``window_s``, 5 s, evaluated
  every tick) is back within the SLO for good — 0 when it never left, ``inf`` when it is
  still out at the next change or at the end of the trace.

:meth:`SimulationReport.to_markdown` renders the table; :meth:`SimulationReport.plot`
draws one figure per trace (rate, replicas per stage and rolling tail latency per policy)
with matplotlib's Agg canvas — the only I/O of the simulator, and matplotlib is imported
only there (``pip install sloline[plot]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sloline.lab.loop import Run
from sloline.lab.traces import Trace
from sloline.planner.config import StageConfig

__all__ = ["PolicyResult", "SimulationReport", "recovery_times", "rolling_tail"]

FloatArray = npt.NDArray[np.float64]


def rolling_tail(
    arrivals_s: FloatArray,
    latencies_s: FloatArray,
    ticks_s: FloatArray,
    *,
    window_s: float,
    percentile: float,
) -> FloatArray:
    """Per tick t, the ``percentile`` of the latencies of queries that arrived in
    [t - window_s, t) (inverted CDF, as the estimator's); NaN where none arrived."""
    lo = np.searchsorted(arrivals_s, ticks_s - window_s, side="left")
    hi = np.searchsorted(arrivals_s, ticks_s, side="left")
    out = np.full(ticks_s.size, np.nan)
    for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        if b > a:
            out[i] = np.percentile(latencies_s[a:b], percentile, method="inverted_cdf")
    return out


def recovery_times(
    ticks_s: FloatArray, tail_s: FloatArray, changes_s: tuple[float, ...], slo_s: float
) -> tuple[float, ...]:
    """Seconds from each load change until the rolling tail is back within the SLO for
    the rest of the segment (up to the next change): the end of the segment's last
    violating tick minus the change; 0 if none; inf if it still violates at the end.
    A trace without load changes has no recovery times."""
    if not changes_s:
        return ()
    tick = float(ticks_s[1] - ticks_s[0]) if ticks_s.size > 1 else 1.0
    ends = (*changes_s[1:], float(ticks_s[-1]) + tick)
    out: list[float] = []
    for change, end in zip(changes_s, ends, strict=True):
        inside = (ticks_s > change) & (ticks_s < end)
        bad = ticks_s[inside & (tail_s > slo_s)]
        if bad.size == 0:
            out.append(0.0)
        elif float(bad[-1]) + tick >= end:
            out.append(math.inf)
        else:
            out.append(float(bad[-1]) + tick - change)
    return tuple(out)


@dataclass(frozen=True, slots=True, eq=False)
class PolicyResult:
    """One policy on one trace."""

    trace: str
    policy: str
    queries: int
    attainment: float  # fraction of queries within the SLO
    cost_usd: float
    tail_s: float  # latency at the SLO percentile over the whole trace
    recovery_s: tuple[float, ...]  # per load change of the trace
    scale_events: int
    stages: tuple[str, ...]
    config: tuple[StageConfig, ...]  # hardware, max batch and initial replicas per stage
    run: Run
    rolling_tail_s: FloatArray  # per tick of ``run``

    @property
    def miss_rate(self) -> float:
        """Fraction of queries that missed the SLO."""
        return 1.0 - self.attainment

    @property
    def worst_recovery_s(self) -> float:
        """The longest time to recover over the trace's load changes (0 if none)."""
        return max(self.recovery_s, default=0.0)


def _seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.0f}"


@dataclass(frozen=True, slots=True, eq=False)
class SimulationReport:
    """All (trace, policy) results of one pipeline, plus what could not be simulated."""

    pipeline: str
    slo_s: float
    percentile: float
    traces: tuple[Trace, ...]
    results: tuple[PolicyResult, ...]
    skipped: tuple[tuple[str, str, str], ...] = ()  # (trace, policy, why)

    def result(self, trace: str, policy: str) -> PolicyResult | None:
        """The result of ``policy`` on ``trace``, if it was simulated."""
        for r in self.results:
            if r.trace == trace and r.policy == policy:
                return r
        return None

    def to_markdown(self) -> str:
        """One row per (trace, policy); cost also relative to the oracle planner's."""
        p = f"P{self.percentile:g}"
        lines = [
            f"| trace | policy | SLO attainment | miss rate | cost ($) | cost / oracle "
            f"| {p} (ms) | worst recovery (s) | scale actions |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.results:
            oracle = self.result(r.trace, "oracle")
            relative = f"{r.cost_usd / oracle.cost_usd:.2f}" if oracle and oracle.cost_usd else "-"
            lines.append(
                f"| {r.trace} | {r.policy} | {r.attainment:.2%} | {r.miss_rate:.2%} "
                f"| {r.cost_usd:.3f} | {relative} | {r.tail_s * 1e3:.0f} "
                f"| {_seconds(r.worst_recovery_s)} | {r.scale_events} |"
            )
        lines += [
            f"| {t} | {policy} | skipped: {why} | | | | | | |" for t, policy, why in self.skipped
        ]
        return "\n".join(lines)

    def plot(self, directory: str | Path, *, dpi: int = 50) -> tuple[Path, ...]:
        """One PNG per trace in ``directory`` (``<pipeline>-<trace>.png``): the arrival
        rate and every policy's cost rate on top, then one row per policy with its
        replicas per stage (left) and rolling tail latency against the SLO (right)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter, ScalarFormatter

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for trace in self.traces:
            rows = [r for r in self.results if r.trace == trace.name]
            if not rows:
                continue
            fig = Figure(figsize=(11.0, 1.9 * (len(rows) + 1)), layout="constrained")
            FigureCanvasAgg(fig)
            axes = fig.subplots(len(rows) + 1, 2, sharex=True, squeeze=False)
            edges = np.arange(0.0, trace.duration_s + 2.0, 2.0)
            counts, _ = np.histogram(trace.arrivals_s, bins=edges)
            axes[0, 0].plot(edges[:-1], counts / 2.0, lw=0.6, color="0.3")
            axes[0, 0].set_ylabel("arrivals / s (2 s bins)")
            axes[0, 0].set_title(f"{self.pipeline} — {trace.name}: {trace.description}", loc="left")
            for r in rows:
                axes[0, 1].step(
                    r.run.ticks_s, r.run.cost_per_hour, where="post", lw=0.9, label=r.policy
                )
            axes[0, 1].set_ylabel("$ / hour")
            axes[0, 1].legend(fontsize=7, ncol=2)
            for i, r in enumerate(rows, start=1):
                left, right = axes[i, 0], axes[i, 1]
                for m, stage in enumerate(r.stages):
                    left.step(r.run.ticks_s, r.run.desired[:, m], where="post", lw=0.9, label=stage)
                left.set_ylabel("replicas")
                left.set_ylim(bottom=0)
                left.yaxis.set_major_locator(MaxNLocator(integer=True))
                left.set_title(
                    f"{r.policy}: {r.attainment:.2%} within SLO, ${r.cost_usd:.2f}",
                    loc="left",
                    fontsize=9,
                )
                right.plot(r.run.ticks_s, r.rolling_tail_s * 1e3, lw=0.7, color="C3")
                slo_ms = self.slo_s * 1e3
                right.axhline(slo_ms, color="k", ls="--", lw=0.7, label=f"SLO {slo_ms:g} ms")
                right.set_yscale("log")
                # The SLO line inside the axes, not on its edge, whatever the latencies.
                bottom, top = right.get_ylim()
                right.set_ylim(min(bottom, slo_ms / 2.0), max(top, slo_ms * 1.6))
                right.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                right.yaxis.set_major_formatter(ScalarFormatter())
                right.yaxis.set_minor_formatter(NullFormatter())
                right.set_ylabel(f"rolling P{self.percentile:g} (ms)")
                for change in trace.changes_s:
                    left.axvline(change, color="0.6", lw=0.5, ls=":")
                    right.axvline(change, color="0.6", lw=0.5, ls=":")
            axes[1, 0].legend(fontsize=7, ncol=len(rows[0].stages))
            axes[1, 1].legend(fontsize=7, loc="upper right")
            axes[-1, 0].set_xlabel("time (s)")
            axes[-1, 1].set_xlabel("time (s)")
            path = out / f"{self.pipeline}-{trace.name}.png"
            fig.savefig(path, dpi=dpi)
            written.append(path)
        return tuple(written)
