"""The router's CPU per request when requests find it idle, and when they find it busy.

The probe's pipelines (``sloline.measure.probe``: identity stages, batches of one, a gRPC
client in its own process) are served embedded, one after the other, ``--repeats`` times:

- **by stages**: 1, 2 and 3 identity stages in a chain; requests one at a time 5 ms
  apart, then in bursts of 8 (30 ms apart). If the saving of the bursts grows with the
  stages, it is paid per stage visit; if not, per request;
- **by idle gap**: one identity stage; bursts, then requests one at a time after gaps of
  0, 0.5, 1, 2, 5 and 20 ms. Per request, each gap's router CPU less the bursts' is the
  extra CPU of finding the router idle that long (the probe's ``routerIdlePenalty``
  measures four of these gaps the same way).

Router CPU is the serving process's CPU time over the run (median of 5 blocks), per
request. Results and analysis: docs/planner.md, "The router's idle penalty".

    python benchmarks/router_wake.py [--repeats 3]

Prints a table per repeat and writes benchmarks/results/router_wake.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from sloline.measure import probe
from sloline.serving import process

PAYLOAD = {"pixels": np.arange(64, dtype=np.float32)}  # digits-cascade's input
GAPS_S = (0.0, 0.0005, 0.001, 0.002, 0.005, 0.02)
BURST_GAP_S = 0.03
OUT = Path(__file__).parent / "results" / "router_wake.json"


async def _runs(served: Any, runs: list[tuple[str, int, float]]) -> list[float]:
    """Router CPU per request of each run (bursts: per burst / its size)."""
    done = await probe._through_front_door(served, PAYLOAD, runs)
    return [
        r.router_cpu_s / (probe.BURST if kind == "burst" else 1)
        for r, (kind, _, _) in zip(done, runs, strict=True)
    ]


async def measure() -> dict[str, Any]:
    by_stages = {}
    for n in (1, 2, 3):

        async def body(served: Any) -> list[float]:
            return await _runs(served, [("seq", 300, 0.005), ("burst", 40, BURST_GAP_S)])

        one_by_one, in_bursts = await probe._serve(PAYLOAD, ["identity"] * n, body, max_batch=1)
        by_stages[n] = {"spaced_ms": one_by_one * 1e3, "burst_ms": in_bursts * 1e3}

    async def gaps(served: Any) -> list[float]:
        runs = [("burst", 40, BURST_GAP_S)] + [("seq", 200, g) for g in GAPS_S]
        return await _runs(served, runs)

    burst, *spaced = await probe._serve(PAYLOAD, ["identity"], gaps, max_batch=1)
    by_gap = {f"{g * 1e3:g}": (s - burst) * 1e3 for g, s in zip(GAPS_S, spaced, strict=True)}
    return {"by_stages": by_stages, "burst_ms": burst * 1e3, "extra_by_gap_ms": by_gap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = []
    for k in range(args.repeats):
        start = time.perf_counter()
        result = process.run(measure())
        results.append(result)
        print(f"repeat {k + 1} ({time.perf_counter() - start:.0f} s)")
        print("| stages | spaced 5 ms, ms per request | bursts of 8 | saving |")
        print("|---:|---:|---:|---:|")
        for n, r in result["by_stages"].items():
            saving = r["spaced_ms"] - r["burst_ms"]
            print(f"| {n} | {r['spaced_ms']:.2f} | {r['burst_ms']:.2f} | {saving:.2f} |")
        print("| gap ms | extra over bursts, ms per request |\n|---:|---:|")
        for gap, extra in result["extra_by_gap_ms"].items():
            print(f"| {gap} | {extra:+.2f} |")
    OUT.write_text(json.dumps({"repeats": results}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
