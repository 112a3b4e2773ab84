"""The profiler's serving-overhead cache: measured once, then read back exactly, so a plan
made from the stored overhead is the plan made from the measured one. A GPU class is
timed on its GPU."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from sloline.lab.synthetic import random_problem
from sloline.measure.profiler import (
    ProfilerSettings,
    _profile_in_worker,
    _save_inputs,
    cached_overhead,
)
from sloline.planner.overhead import ServingOverhead
from sloline.planner.planner import plan
from sloline.planner.profile import PipelineProfile
from sloline.spec import load_pipeline
from sloline.spec.hardware import EmbeddedPlacement, HardwareClass


def _measured(seed: int) -> ServingOverhead:
    """An overhead with full-precision floats, as a probe gives them."""
    rng = np.random.default_rng(seed)
    return ServingOverhead(
        router_request_cpu_s=float(rng.uniform(2e-4, 1e-3)),
        router_batch_cpu_s=float(rng.uniform(1e-4, 5e-4)),
        router_item_cpu_s=float(rng.uniform(0.0, 5e-5)),
        worker_batch_cpu_s=float(rng.uniform(1e-4, 5e-4)),
        hop_s=tuple(float(v) for v in rng.lognormal(np.log(1e-4), 1.0, 300)),
        request_s=tuple(float(v) for v in rng.lognormal(np.log(4e-4), 1.0, 300)),
        client_cpu_s=float(rng.uniform(2e-4, 1e-3)),
        cores=2,
    )


def test_the_overhead_is_measured_once_then_read_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "overhead.json"
    measured: list[ServingOverhead] = []

    def measure() -> ServingOverhead:
        measured.append(_measured(len(measured)))
        return measured[-1]

    first = cached_overhead(path, measure)
    again = cached_overhead(path, measure)
    assert len(measured) == 1
    assert again == first
    forced = cached_overhead(path, measure, force=True)
    assert len(measured) == 2
    assert forced == measured[1] != first
    assert cached_overhead(path, measure) == forced


def test_a_plan_from_the_stored_overhead_is_the_plan_from_the_measured_one(
    tmp_path: Path,
) -> None:
    measured = _measured(7)
    stored = cached_overhead(tmp_path / "overhead.json", lambda: measured)
    read = cached_overhead(tmp_path / "overhead.json", lambda: _measured(8))
    base = random_problem(0, duration_s=4.0, max_replicas=8)

    def planned(overhead: ServingOverhead) -> dict[str, object]:
        profile = PipelineProfile(
            base.profile.stages,
            base.profile.scale_factors,
            hop_s=overhead.visit_s(),
            overhead=overhead,
        )
        return plan(dataclasses.replace(base, profile=profile)).to_dict()

    assert stored is measured
    assert planned(read) == planned(measured)


def test_a_gpu_class_is_timed_on_its_cuda_device(tmp_path: Path) -> None:
    """The profiling worker gets the class's CUDA device: where torch sees none, the
    runtime's fallback to the CPU reaches the progress output (the profile would
    otherwise pass CPU latencies off as the GPU's); where it sees one, nothing warns."""
    torch = pytest.importorskip("torch")

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated upstream
        torch.jit.script(Double()).save(str(tmp_path / "double.pt"))
    tensor = {"datatype": "FP32", "shape": [4]}
    doc = {
        "apiVersion": "sloline.dev/v1alpha1",
        "kind": "PredictionPipeline",
        "metadata": {"name": "double"},
        "spec": {
            "slo": {"latencyMs": 50},
            "workload": {"rateRps": 10},
            "inputs": [{"name": "x", **tensor}],
            "stages": [
                {
                    "name": "double",
                    "model": {"runtime": "torchscript", "uri": "double.pt"},
                    "inputs": [{"name": "x", "from": "x"}],
                    "outputs": [{"name": "y", **tensor}],
                }
            ],
            "output": "double",
        },
    }
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(doc))
    inputs = tmp_path / "inputs.npz"
    _save_inputs(inputs, [{"x": np.ones(4, np.float32)}])
    gpu = HardwareClass(
        name="gpu-0",
        accelerator="gpu",
        cost_per_hour=1.0,
        embedded=EmbeddedPlacement(cuda_device=0),
    )
    messages: list[str] = []
    profile = _profile_in_worker(
        load_pipeline(tmp_path / "pipeline.yaml"),
        "double",
        gpu,
        inputs,
        ProfilerSettings(max_batch_cap=2, repeats=3, budget_s=0.05),
        messages.append,
    )
    assert [p.batch_size for p in profile.points] == [1, 2]
    assert profile.cores == 1
    warned = [m for m in messages if m.startswith("warning: double on gpu-0: ")]
    if torch.cuda.is_available():
        assert warned == []
    else:
        assert len(warned) == 1 and "CUDA device 0 was requested" in warned[0], messages
