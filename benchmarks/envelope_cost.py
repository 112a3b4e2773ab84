"""Cost of the streaming traffic envelope (InferLine §5) at 100, 10k and 1M arrivals/s.

Measures, for Poisson arrivals at each rate:

- ns per arrival (300k arrivals per run; 20k with ``--quick``) of
  ``StreamingEnvelope.observe(t)`` (one call per arrival, as a router
  calls it per request) and of ``observe_many(batch)`` with 10 ms batches;
- memory held by the envelope (``sys.getsizeof`` over every object it references) after
  1 min and after 10 min of arrivals: it does not grow with time or rate.

Timings are the best of ``--repeat`` runs (3), which filters out noise from other
processes on a shared machine.

Windows are T_s * 2^k up to 60 s with T_s = 10 ms (13 windows: 10 ms .. 40.96 s),
8 subdivisions, a 60 s look-back. Run ``python benchmarks/envelope_cost.py`` (a few
minutes) or ``--quick`` (seconds: shorter timing runs, memory after 10 s and 60 s).
Prints a markdown table and writes JSON to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sloline.common.envelope import StreamingEnvelope, window_sizes

RATES_RPS = (100, 10_000, 1_000_000)
WINDOWS_S = window_sizes(0.01, 60.0)
BATCH_S = 0.01
RESULTS = Path(__file__).parent / "results"


def poisson_chunks(
    rate_rps: float, duration_s: float, chunk_s: float, seed: int = 0
) -> Iterator[npt.NDArray[np.float64]]:
    """Poisson arrival timestamps in [0, duration_s), in chunks of ``chunk_s``."""
    rng = np.random.default_rng(seed)
    start = 0.0
    while start < duration_s:
        end = min(start + chunk_s, duration_s)
        n = rng.poisson(rate_rps * (end - start))
        yield np.sort(rng.uniform(start, end, n))
        start = end


def fresh() -> StreamingEnvelope:
    return StreamingEnvelope(WINDOWS_S, start_s=0.0, lookback_s=60.0)


def time_observe(rate_rps: float, duration_s: float) -> float:
    """ns per arrival, one observe() call per arrival."""
    env = fresh()
    arrivals = np.concatenate(list(poisson_chunks(rate_rps, duration_s, 1.0))).tolist()
    observe = env.observe
    started = time.perf_counter_ns()
    for t in arrivals:
        observe(t)
    env.rates(duration_s)
    return (time.perf_counter_ns() - started) / max(1, len(arrivals))


def time_observe_many(rate_rps: float, duration_s: float) -> float:
    """ns per arrival, one observe_many() call per 10 ms batch."""
    env = fresh()
    batches = list(poisson_chunks(rate_rps, duration_s, BATCH_S))
    n = sum(b.size for b in batches)
    started = time.perf_counter_ns()
    for batch in batches:
        env.observe_many(batch)
    env.rates(duration_s)
    return (time.perf_counter_ns() - started) / max(1, n)


def deep_size(root: object) -> int:
    """Bytes of ``root`` and of every object reachable through its slots and containers."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, list | tuple):
            stack.extend(obj)
        elif isinstance(obj, StreamingEnvelope):
            stack.extend(getattr(obj, name) for name in StreamingEnvelope.__slots__)
    return total


def memory_bytes(rate_rps: float, checkpoints_s: tuple[float, ...]) -> tuple[list[int], float]:
    """Bytes held by the envelope at each checkpoint; largest-window rate at the end."""
    env = fresh()
    held: list[int] = []
    fed_until = 0.0
    for checkpoint in checkpoints_s:
        for batch in poisson_chunks(rate_rps, checkpoint - fed_until, 1.0, seed=int(fed_until)):
            env.observe_many(batch + fed_until)
        fed_until = checkpoint
        env.rates(fed_until)
        held.append(deep_size(env))
    return held, env.rates(fed_until)[-1]


def best_of(
    repeat: int, run: Callable[[float, float], float], rate_rps: float, duration_s: float
) -> float:
    return min(run(rate_rps, duration_s) for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke mode: seconds, not minutes")
    parser.add_argument("--repeat", type=int, default=3, help="timing runs; the best counts")
    args = parser.parse_args()
    checkpoints = (10.0, 60.0) if args.quick else (60.0, 600.0)
    rows = []
    for rate in RATES_RPS:
        timing_s = (20_000 if args.quick else 300_000) / rate  # arrivals per timing run
        held, rate_top = memory_bytes(rate, checkpoints)
        observe_ns = best_of(args.repeat, time_observe, rate, timing_s)
        rows.append(
            {
                "rate_rps": rate,
                "timing_duration_s": timing_s,
                "observe_ns_per_arrival": round(observe_ns, 1),
                "observe_core_share": round(observe_ns * rate / 1e9, 4),
                "observe_many_ns_per_arrival": round(
                    best_of(args.repeat, time_observe_many, rate, timing_s), 1
                ),
                "memory_bytes": dict(zip([f"{c:g}s" for c in checkpoints], held, strict=True)),
                "largest_window_rate_rps": round(rate_top, 1),
            }
        )
    labels = [f"{c:g} s" for c in checkpoints]
    print(f"windows: {len(WINDOWS_S)} ({WINDOWS_S[0]:g} s .. {WINDOWS_S[-1]:g} s), 8 subdivisions")
    print(
        "| rate (rps) | observe() ns/arrival | observe() share of one core "
        "| observe_many() ns/arrival (10 ms batches) | "
        + " | ".join(f"memory after {label} (bytes)" for label in labels)
        + f" | {WINDOWS_S[-1]:g} s window max rate (rps) |"
    )
    print("|---:|---:|---:|---:|" + "---:|" * len(labels) + "---:|")
    for row in rows:
        mem = " | ".join(f"{v:,}" for v in row["memory_bytes"].values())
        print(
            f"| {row['rate_rps']:,} | {row['observe_ns_per_arrival']:,} | "
            f"{row['observe_core_share']:.2%} | "
            f"{row['observe_many_ns_per_arrival']:,} | {mem} | {row['largest_window_rate_rps']:,} |"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("envelope_cost_quick.json" if args.quick else "envelope_cost.json")
    meta = {
        "command": "python benchmarks/envelope_cost.py" + (" --quick" if args.quick else ""),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "windows_s": WINDOWS_S,
        "subdivisions": 8,
        "lookback_s": 60.0,
        "repeat": args.repeat,
        "load_average": os.getloadavg(),
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
