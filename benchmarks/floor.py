"""The in-process floor of the serving benchmark: the same pipeline called in one process,
no network, no router, no workers (`sloline.measure.inprocess.InProcessPipeline`).

Runs as its own process and speaks the same JSON-lines protocol as `loadgen.py`, so the
orchestrator treats it like any other system. The three load shapes mean here:

- ``sequential``: `infer()` one request at a time.
- ``closed``: `infer_many()` on one full batch (the largest stage max batch) after
  another for ``duration_s``: the most the stages do per second with these batch sizes
  and thread budget.
- ``open``: the same Poisson schedule a client would send, served by this one thread
  with the queue's rule (when free, take every arrived request up to the max batch);
  latency = completion - scheduled arrival.

CPU seconds are this process's own (`time.process_time`), the floor's "server CPU".
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import summarize

from sloline.measure.inprocess import InProcessPipeline
from sloline.spec import load_pipeline


class Floor:
    def __init__(self, pipeline_file: str, threads: int, max_batch: dict[str, int]) -> None:
        self.pipeline = InProcessPipeline(load_pipeline(pipeline_file), threads=threads)
        self.max_batch = max_batch
        self.batch = max(max_batch.values(), default=1)
        for runner in self.pipeline.runners.values():
            runner.warmup()

    def sequential(self, inputs: dict[str, np.ndarray], count: int, warmup: int,
                   max_s: float) -> dict[str, Any]:  # fmt: skip
        for _ in range(warmup):
            self.pipeline.infer(inputs)
        latencies = []
        cpu0, start = time.process_time(), time.perf_counter()
        for _ in range(count):
            t0 = time.perf_counter()
            self.pipeline.infer(inputs)
            latencies.append(time.perf_counter() - t0)
            if t0 - start > max_s:
                break
        return {**summarize(latencies), "wall_s": time.perf_counter() - start,
                "server_cpu_s": time.process_time() - cpu0, "ok_total": len(latencies)}  # fmt: skip

    def closed(self, inputs: dict[str, np.ndarray], duration_s: float,
               warmup_s: float) -> dict[str, Any]:  # fmt: skip
        chunk = [inputs] * self.batch
        end = time.perf_counter() + warmup_s
        while time.perf_counter() < end:
            self.pipeline.infer_many(chunk, self.max_batch)
        latencies: list[float] = []
        cpu0, start = time.process_time(), time.perf_counter()
        done = 0
        while (t0 := time.perf_counter()) - start < duration_s:
            self.pipeline.infer_many(chunk, self.max_batch)
            latencies += [time.perf_counter() - t0] * len(chunk)
            done += len(chunk)
        wall = time.perf_counter() - start
        return {**summarize(latencies), "concurrency": self.batch, "window_s": wall,
                "rps": done / wall, "server_cpu_s": time.process_time() - cpu0,
                "ok_total": done}  # fmt: skip

    def open(self, inputs: dict[str, np.ndarray], rate_rps: float, count: int,
             seed: int) -> dict[str, Any]:  # fmt: skip
        arrivals = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate_rps, count))
        latencies: list[float] = []
        cpu0, start = time.process_time(), time.perf_counter()
        i = 0
        while i < count:
            now = time.perf_counter() - start
            if arrivals[i] > now:
                time.sleep(arrivals[i] - now)
                now = time.perf_counter() - start
            n = int(np.searchsorted(arrivals, now, side="right")) - i
            n = max(1, min(n, self.batch))
            self.pipeline.infer_many([inputs] * n, self.max_batch)
            finished = time.perf_counter() - start
            latencies += [finished - float(a) for a in arrivals[i : i + n]]
            i += n
        wall = time.perf_counter() - start
        return {**summarize(latencies), "rate_rps": rate_rps, "achieved_rps": count / wall,
                "wall_s": wall, "server_cpu_s": time.process_time() - cpu0,
                "ok_total": count}  # fmt: skip


def handle(floor: Floor | None, command: dict[str, Any]) -> tuple[Floor | None, dict[str, Any]]:
    kind = command["kind"]
    if kind == "load":
        start = time.perf_counter()
        floor = Floor(command["pipeline"], command["threads"], command["max_batch"])
        return floor, {"load_s": time.perf_counter() - start}
    if floor is None:
        raise ValueError("send a 'load' command first")
    with np.load(command["inputs_file"]) as npz:
        inputs = {k: npz[k] for k in npz.files}
    if kind == "sequential":
        return floor, floor.sequential(inputs, command["count"], command.get("warmup", 20),
                                       command.get("max_s", 60.0))  # fmt: skip
    if kind == "closed":
        return floor, floor.closed(inputs, command["duration_s"], command.get("warmup_s", 0.5))
    if kind == "open":
        return floor, floor.open(inputs, command["rate_rps"], command["count"],
                                 command.get("seed", 0))  # fmt: skip
    raise ValueError(f"unknown command kind {kind!r}")


def main() -> None:
    floor: Floor | None = None
    for line in sys.stdin:
        try:
            floor, result = handle(floor, json.loads(line))
        except Exception as exc:
            result = {"failed": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
