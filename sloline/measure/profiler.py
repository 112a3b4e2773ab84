"""The profiler (InferLine §4.1): measure every stage on every allowed hardware class.

1. The pipeline's own sample requests (`spec.samples`) run through the pipeline in
   process; this records what each stage actually receives and which stages each sample
   visits (the visit matrix, hence the scale factors s_m, conditional edges included).
2. For each (stage, hardware class) a real worker process is started with that class's
   thread budget and CPU affinity (`sloline profile-stage`), and it times one batch at
   batch sizes 1, 2, 4, ... up to the cap, or until doubling the batch stops paying off
   (throughput gain under 5% twice in a row). Then the idle penalty: batch 1 timed after
   idle gaps of 0.5 to 50 ms against back to back (a worker serves a batch after waiting
   for it; caches cool down and the core goes idle meanwhile).
3. The serving overhead is measured on a real router with real workers and a real gRPC
   client through the front door (`probe.py`): the router's CPU per request, per batch
   and per item, the workers' CPU per batch, and the distributions of the hop and of the
   request path outside the router; with the cores the embedded mode's processes share.

On Kubernetes, `profile_job` does steps 1-2 for one (stage, class) inside a Job's pod,
and measures the per-hop overhead as one constant on loopback,
which runs on that class's nodes; the result becomes a termination message
(`profile_message.py`).

Results are cached on disk per (stage, hardware class), keyed by a digest of the stage's
spec, its model file or Python module, the hardware class, the runtime versions and the
sample inputs, so re-profiling happens only when one of those changes (or `force`). The
serving overhead is cached the same way, keyed by the request it sends (the first
sample), the shared cores and the versions: measuring it takes ~20 s, which `sloline plan`
and `sloline run` would otherwise pay at every start (docs/planner.md, "Benchmarks").
This is the only part of the planner that does I/O.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sloline.common.tensors import Arrays
from sloline.measure.inprocess import InProcessPipeline
from sloline.measure.probe import measure_overhead
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import BatchLatency, IdlePenalty, PipelineProfile, StageProfile
from sloline.planner.profile_message import ProfileMessage
from sloline.runtimes import StageRunner, import_entrypoint, load_pipeline_stage
from sloline.spec import HardwareCatalog, HardwareClass, Issue, LoadedPipeline, PipelineError
from sloline.spec.paths import PathEscape, locate_module

Progress = Callable[[str], None]
# Part of the cache key: bump it when stages are timed differently (2: the idle penalty;
# 3: GPU classes on their device).
PROFILE_FORMAT = b"3"
# Part of the serving overhead's cache key: bump it when the probe measures differently.
OVERHEAD_FORMAT = b"5"


@dataclass(frozen=True, slots=True)
class ProfilerSettings:
    hardware: tuple[str, ...] = ()  # classes to profile; empty: the pipeline's allowed ones
    max_batch_cap: int = 32
    repeats: int = 20  # timed batches per batch size (fewer if the time budget runs out)
    budget_s: float = 2.0  # wall time per (stage, class, batch size)
    samples: int = 256  # sample requests used at most
    cache_dir: Path | None = None
    force: bool = False  # measure everything again, whatever the cache holds
    force_overhead: bool = False  # measure the serving overhead again (the stages: cached)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sloline" / "profiles"


def load_samples(loaded: LoadedPipeline, limit: int) -> list[Arrays]:
    """The pipeline's sample requests (one dict per request), or zeros with a warning
    printed by the caller when the spec declares none."""
    spec = loaded.pipeline.spec
    samples = spec.samples
    if samples is None:
        return [
            {
                t.name: np.zeros([d if d > 0 else 1 for d in t.shape], dtype=_dtype(t.datatype))
                for t in spec.inputs
            }
        ]
    if samples.entrypoint:
        data = import_entrypoint(samples.entrypoint, loaded.base_dir, what="spec.samples")()
    elif samples.uri:
        with np.load(loaded.resolve(samples.uri, "spec.samples.uri"), allow_pickle=False) as npz:
            data = {k: npz[k] for k in npz.files}
    else:
        raise PipelineError([Issue("spec.samples", "give uri or entrypoint")], loaded.name)
    missing = sorted({t.name for t in spec.inputs} - set(data))
    if missing:
        raise PipelineError(
            [Issue("spec.samples", f"samples lack input(s) {missing}")], loaded.name
        )
    count = min(len(next(iter(data.values()))), limit)
    return [
        {t.name: np.asarray(data[t.name][i], dtype=_dtype(t.datatype)) for t in spec.inputs}
        for i in range(count)
    ]


def _dtype(datatype: str) -> np.dtype[Any]:
    from sloline.common.tensors import DTYPES

    return DTYPES[datatype]


def trace_samples(
    loaded: LoadedPipeline, samples: Sequence[Arrays]
) -> tuple[dict[str, list[Arrays]], np.ndarray]:
    """Run the samples in process; return each stage's inputs and the visit matrix
    [n_samples, n_stages in graph order]."""
    return InProcessPipeline(loaded).trace(samples)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:24]


def _model_bytes(loaded: LoadedPipeline, stage: str) -> bytes:
    node = loaded.graph.stages[stage]
    model = node.spec.model
    if model.uri:
        return loaded.resolve(model.uri, f"spec.stages[{node.index}].model.uri").read_bytes()
    entrypoint = model.entrypoint or ""
    try:
        file = locate_module(loaded.base_dir, entrypoint.partition(":")[0])[-1].file
    except PathEscape:
        file = None
    return file.read_bytes() if file is not None else entrypoint.encode()


def _versions() -> bytes:
    found = []
    for package in ("onnxruntime", "torch", "numpy", "sloline"):
        try:
            found.append(f"{package}={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package}=none")
    return ",".join(found).encode()


def _save_inputs(path: Path, items: Sequence[Arrays]) -> None:
    arrays = {f"{i}/{name}": value for i, item in enumerate(items) for name, value in item.items()}
    np.savez(path, **arrays)  # type: ignore[arg-type]


def _load_inputs(path: Path) -> list[Arrays]:
    items: dict[int, Arrays] = {}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            index, _, name = key.partition("/")
            items.setdefault(int(index), {})[name] = npz[key]
    return [items[i] for i in sorted(items)]


@dataclass(frozen=True, slots=True)
class StageMeasurement:
    """What `sloline profile-stage` measures: batch latencies and the idle penalty."""

    points: tuple[BatchLatency, ...]
    idle: IdlePenalty

    def to_dict(self) -> dict[str, Any]:
        return {
            "batches": [p.to_dict() for p in self.points],
            "idlePenalty": self.idle.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageMeasurement:
        return cls(
            tuple(BatchLatency.from_dict(p) for p in data["batches"]),
            IdlePenalty.from_dict(data["idlePenalty"]),
        )


def measure_stage(
    pipeline_file: Path,
    stage: str,
    inputs_file: Path,
    *,
    threads: int,
    cap: int,
    repeats: int,
    budget_s: float,
    cuda_device: int | None = None,
) -> StageMeasurement:
    """Time one stage in this process (the body of `sloline profile-stage`)."""
    from sloline.spec import load_pipeline

    runner = load_pipeline_stage(
        load_pipeline(pipeline_file), stage, threads=threads, cuda_device=cuda_device
    )
    items = _load_inputs(inputs_file)
    points = time_batches(runner, items, cap=cap, repeats=repeats, budget_s=budget_s)
    return StageMeasurement(tuple(points), time_idle_penalty(runner, items))


# Idle gaps after which batch 1 is timed: from about one hop (a replica that takes queued
# work waits that long for it) to the gaps between requests at a few rps.
IDLE_GAPS_S = (0.0005, 0.002, 0.01, 0.05)


def time_idle_penalty(
    runner: StageRunner, items: Sequence[Arrays], *, repeats: int = 30
) -> IdlePenalty:
    """How much longer batch 1 takes after sleeping each of IDLE_GAPS_S than back to back
    (medians; the back-to-back runs are interleaved with the idle ones so that both see
    the same machine). The sleep stands in for a worker blocked on its stream."""
    chunk = [items[0]]
    runner.run(chunk)
    gaps, extras = [], []
    for gap in IDLE_GAPS_S:
        slept, cold, warm = [], [], []
        for _ in range(repeats):
            start = time.perf_counter()
            time.sleep(gap)
            woke = time.perf_counter()
            runner.run(chunk)
            ran = time.perf_counter()
            runner.run(chunk)
            warm.append(time.perf_counter() - ran)
            slept.append(woke - start)
            cold.append(ran - woke)
        gaps.append(float(np.median(slept)))
        extras.append(float(np.median(cold) - np.median(warm)))
    return IdlePenalty.from_medians(gaps, extras)


def time_batches(
    runner: StageRunner, items: Sequence[Arrays], *, cap: int, repeats: int, budget_s: float
) -> list[BatchLatency]:
    """Latency of one batch at sizes 1, 2, 4, ... up to `cap` (inputs cycled from `items`),
    stopping early once doubling the batch gains under 5% throughput twice in a row."""
    points: list[BatchLatency] = []
    batch, slow_gains = 1, 0
    while batch <= cap:
        chunk = [items[i % len(items)] for i in range(batch)]
        runner.run(chunk)  # warm-up at this size
        samples: list[float] = []
        deadline = time.perf_counter() + budget_s
        while len(samples) < repeats and (len(samples) < 3 or time.perf_counter() < deadline):
            start = time.perf_counter()
            runner.run(chunk)
            samples.append(time.perf_counter() - start)
        points.append(BatchLatency.from_samples(batch, samples))
        if len(points) > 1:
            before, now = points[-2], points[-1]
            gain = (now.batch_size / now.p50_s) / (before.batch_size / before.p50_s)
            slow_gains = slow_gains + 1 if gain < 1.05 else 0
            if slow_gains >= 2:
                break
        batch *= 2
    return points


def _profile_in_worker(
    loaded: LoadedPipeline,
    stage: str,
    hw: HardwareClass,
    inputs_file: Path,
    settings: ProfilerSettings,
    progress: Progress,
) -> StageProfile:
    with tempfile.TemporaryDirectory(prefix="sloline-profile-") as tmp:
        out = Path(tmp) / "profile.json"
        cmd = [
            sys.executable,
            "-m",
            "sloline",
            "profile-stage",
            "--pipeline",
            str(loaded.file),
            "--stage",
            stage,
            "--inputs",
            str(inputs_file),
            "--out",
            str(out),
            "--threads",
            str(hw.embedded.threads),
            "--cap",
            str(settings.max_batch_cap),
            "--repeats",
            str(settings.repeats),
            "--budget-s",
            str(settings.budget_s),
        ]
        if hw.embedded.cpus:
            cmd += ["--cpus", ",".join(map(str, hw.embedded.cpus))]
        if hw.embedded.cuda_device is not None:
            cmd += ["--cuda-device", str(hw.embedded.cuda_device)]
        threads = str(hw.embedded.threads)
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f"profiling stage {stage!r} on {hw.name!r} failed:\n{done.stderr.strip()[-2000:]}"
            )
        # E.g. a GPU class whose device the runtime could not get: measured on the CPU.
        for line in done.stderr.splitlines():
            if "Warning: " in line:
                progress(f"warning: {stage} on {hw.name}: {line.split('Warning: ', 1)[1]}")
        measured = StageMeasurement.from_dict(json.loads(out.read_text()))
    return StageProfile(
        hardware=hw.name, points=measured.points, idle=measured.idle, cores=_cores(hw)
    )


def _cores(hw: HardwareClass) -> int:
    """Cores a replica of ``hw`` keeps busy while serving: its thread budget on a CPU
    class; one on an accelerator (the thread that feeds it)."""
    return hw.embedded.threads if hw.accelerator == "cpu" else 1


def usable_cores() -> int:
    """The cores this process (and the workers it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def profile_pipeline(
    loaded: LoadedPipeline,
    catalog: HardwareCatalog,
    settings: ProfilerSettings | None = None,
    progress: Progress = lambda _msg: None,
) -> PipelineProfile:
    """Profile every stage on every class in `settings.hardware` (or the allowed ones)."""
    settings = settings or ProfilerSettings()
    classes = settings.hardware or tuple(loaded.pipeline.spec.hardware or catalog.names())
    cache = settings.cache_dir or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    samples = load_samples(loaded, settings.samples)
    stage_inputs, visits = trace_samples(loaded, samples)
    sample_digest = hashlib.sha256()
    for item in samples:
        for name in sorted(item):
            sample_digest.update(name.encode() + item[name].tobytes())
    versions = _versions()
    stages: dict[str, dict[str, StageProfile]] = {}
    order = loaded.graph.order
    total, done = len(order) * len(classes), 0
    with tempfile.TemporaryDirectory(prefix="sloline-inputs-") as tmp:
        for stage in order:
            stages[stage] = {}
            inputs = stage_inputs[stage] or _fallback_inputs(loaded, stage)
            inputs_file = Path(tmp) / f"{stage}.npz"
            _save_inputs(inputs_file, inputs[: settings.max_batch_cap * 2])
            node = loaded.graph.stages[stage]
            for name in classes:
                hw = catalog.get(name)
                key = _digest(
                    PROFILE_FORMAT,
                    node.spec.model_dump_json().encode(),
                    _model_bytes(loaded, stage),
                    hw.model_dump_json().encode(),
                    versions,
                    sample_digest.digest(),
                    str(settings.max_batch_cap).encode(),
                )
                path = cache / f"{loaded.name}-{stage}-{name}-{key}.json"
                done += 1
                if path.exists() and not settings.force:
                    profile = StageProfile.from_dict(json.loads(path.read_text()))
                    progress(f"[{done}/{total}] {stage} on {name}: cached")
                else:
                    progress(f"[{done}/{total}] {stage} on {name}: measuring ...")
                    profile = _profile_in_worker(loaded, stage, hw, inputs_file, settings, progress)
                    path.write_text(json.dumps(profile.to_dict()))
                stages[stage][name] = profile
    cores = usable_cores()
    overhead_key = _digest(
        OVERHEAD_FORMAT,
        versions,
        b"".join(name.encode() + samples[0][name].tobytes() for name in sorted(samples[0])),
        str(cores).encode(),
    )
    overhead = cached_overhead(
        cache / f"{loaded.name}-serving-overhead-{overhead_key}.json",
        lambda: measure_overhead(samples[0], cores=cores),
        force=settings.force or settings.force_overhead,
        progress=progress,
    )
    return PipelineProfile(
        stages=stages,
        hop_s=overhead.visit_s(),
        visits=visits,
        visit_stages=order,
        overhead=overhead,
    )


def cached_overhead(
    path: Path,
    measure: Callable[[], ServingOverhead],
    *,
    force: bool = False,
    progress: Progress = lambda _msg: None,
) -> ServingOverhead:
    """The serving overhead stored at ``path``, else (or with ``force``) ``measure()``d
    and stored there. The JSON round trip is exact, so a plan from the stored overhead is
    the plan from the one measured."""
    if path.exists() and not force:
        progress("serving overhead (router, hops, request path): cached")
        return ServingOverhead.from_dict(json.loads(path.read_text()))
    progress("measuring the serving overhead (router, hops, request path) ...")
    overhead = measure()
    path.write_text(json.dumps(overhead.to_dict()))
    return overhead


def profile_job(
    loaded: LoadedPipeline,
    stage: str,
    hw: HardwareClass,
    settings: ProfilerSettings | None = None,
    *,
    hop_requests: int = 300,
    cuda_device: int | None = None,
    progress: Progress = lambda _msg: None,
) -> ProfileMessage:
    """Profile one stage on the hardware this process runs on (`sloline profile-job`, the
    body of a Kubernetes profiling Job): trace the samples in process for the stage's
    inputs and the visit matrix, time the stage with the class's thread budget (on GPU
    `cuda_device`, if given), and measure the per-hop overhead on loopback (skipped when
    `hop_requests` is 0)."""
    settings = settings or ProfilerSettings()
    samples = load_samples(loaded, settings.samples)
    progress(f"tracing {len(samples)} sample(s) through {loaded.name!r} ...")
    stage_inputs, visits = trace_samples(loaded, samples)
    inputs = (stage_inputs[stage] or _fallback_inputs(loaded, stage))[: settings.max_batch_cap * 2]
    progress(f"timing {stage} with {hw.embedded.threads} thread(s) ...")
    runner = load_pipeline_stage(
        loaded, stage, threads=hw.embedded.threads, cuda_device=cuda_device
    )
    points = time_batches(
        runner,
        inputs,
        cap=settings.max_batch_cap,
        repeats=settings.repeats,
        budget_s=settings.budget_s,
    )
    idle = time_idle_penalty(runner, inputs)
    hop_s = None
    if hop_requests > 0:
        progress("measuring the router's per-hop overhead ...")
        hop_s = measure_overhead(samples[0], requests=hop_requests, batching=False).visit_s()
    return ProfileMessage(
        stage=stage,
        profile=StageProfile(hardware=hw.name, points=tuple(points), idle=idle, cores=_cores(hw)),
        hop_s=hop_s,
        visits=visits,
        visit_stages=loaded.graph.order,
    )


def _fallback_inputs(loaded: LoadedPipeline, stage: str) -> list[Arrays]:
    """A stage no sample reached (e.g. a cascade branch never taken): zeros of its
    declared input shapes, so it still gets a latency profile."""
    from sloline.runtimes import stage_input_specs

    specs = stage_input_specs(loaded.graph, stage)
    return [
        {
            n: np.zeros([d if d > 0 else 1 for d in t.shape], dtype=_dtype(t.datatype))
            for n, t in specs.items()
        }
    ]
