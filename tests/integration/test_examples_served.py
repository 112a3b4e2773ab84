"""The two examples served end to end by the real embedded stack, queried with the real
tritonclient HTTP and gRPC clients, checked against the in-process pipeline."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient

from sloline.embedded import WARMUP_BATCHES
from sloline.measure.inprocess import InProcessPipeline
from sloline.planner.calibration import MIN_BATCHES, Calibration
from sloline.serving.router import RouterSettings
from sloline.spec import load_pipeline
from tests.support.net import free_port
from tests.support.serve import EXAMPLES, BackgroundPipeline, build_example


def wait_ready(url: str, process: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError("sloline run did not become ready")


@pytest.fixture(scope="module")
def digits_module():
    build_example("digits-cascade")
    path = EXAMPLES / "digits-cascade" / "digits_stages.py"
    spec = importlib.util.spec_from_file_location("served_digits_stages", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_cascade_via_cli_with_tritonclient(
    digits_module, record_property, tmp_path: Path
) -> None:
    """`sloline run` (the README's command: profile, plan, serve) serves the cascade; HTTP
    and gRPC clients get the test split's predictions; the cascade is at least as accurate
    as the fast model. On stop it writes a calibration (``--calibration-out``) that counts
    exactly the batches served, and ``sloline plan --calibration`` plans with it."""
    x_test, y_test = digits_module.labelled_test_split()
    http_port, grpc_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sloline",
            "run",
            str(EXAMPLES / "digits-cascade" / "pipeline.yaml"),
            "--port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--status-interval",
            "0",
            "--cache-dir",
            str(tmp_path / "profiles"),
            "--calibration-out",
            str(tmp_path / "calibration.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_ready(f"127.0.0.1:{http_port}", process, timeout_s=240)
        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        labels = {}
        for proto, client, mod in (("http", http, httpclient), ("grpc", grpc, grpcclient)):
            predicted = []
            for row in x_test:
                pixels = mod.InferInput("pixels", [1, 64], "FP32")
                pixels.set_data_from_numpy(row[None].astype(np.float32))
                # A generous deadline: this test checks predictions, not the SLO.
                out = client.infer("digits-cascade", [pixels], parameters={"timeout_ms": 10_000})
                assert out.as_numpy("probabilities").shape == (1, 10)
                predicted.append(int(out.as_numpy("label").ravel()[0]))
            labels[proto] = np.array(predicted)
        assert (labels["http"] == labels["grpc"]).all()
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert process.returncode == 0, output

    cascade_accuracy = float((labels["http"] == y_test).mean())
    fast = ort.InferenceSession(str(EXAMPLES / "digits-cascade" / "models" / "fast.onnx"))
    features = digits_module.scale(x_test)
    fast_probs = fast.run(None, {"features": features})[-1]
    fast_accuracy = float((fast_probs.argmax(axis=1) == y_test).mean())

    def items(stage: str) -> float:
        m = re.search(
            rf'^sloline_stage_batch_size_sum\{{pipeline="digits-cascade",stage="{stage}"\}} (\S+)$',
            metrics,
            re.M,
        )
        assert m, f"no batch-size sum for {stage}"
        return float(m.group(1))

    reached = items("accurate") / items("fast")
    record_property("cascade_accuracy", cascade_accuracy)
    record_property("fast_accuracy", fast_accuracy)
    record_property("fraction_reaching_accurate", reached)
    print(
        f"\ndigits-cascade: cascade accuracy {cascade_accuracy:.4f}, fast model "
        f"{fast_accuracy:.4f}, {reached:.1%} of requests reached the accurate model"
    )
    assert items("fast") == 2 * len(x_test)
    assert cascade_accuracy >= fast_accuracy
    assert 0.0 < reached < 0.5

    # One request at a time: every batch holds one item, so the calibration counts every
    # request the fast stage served, less the warm-up batches it leaves out.
    calibration = Calibration.load(tmp_path / "calibration.json")
    fast_stage = calibration.stages["fast"]
    assert fast_stage.batches == 2 * len(x_test) - WARMUP_BATCHES, output
    assert fast_stage.mean_batch == 1.0 and fast_stage.extra_s >= 0.0
    # On a CPU class the model time is the worker's CPU time, at most its wall time.
    assert 0.0 < fast_stage.service_mean_s < fast_stage.wall_mean_s
    assert calibration.stages["accurate"].batches == items("accurate") - WARMUP_BATCHES
    assert len(calibration.hop_s) > 0 and min(calibration.hop_s) >= 0.0
    assert calibration.router_cpu_s is None and calibration.router_scale == 1.0  # no arrivals
    assert "calibration written to" in output
    planned = subprocess.run(
        [sys.executable, "-m", "sloline", "plan",
         str(EXAMPLES / "digits-cascade" / "pipeline.yaml"),
         "--cache-dir", str(tmp_path / "profiles"),
         "--calibration", str(tmp_path / "calibration.json")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert "calibration of 'digits-cascade'" in planned.stderr
    assert "plan for digits-cascade" in planned.stdout

    # `sloline calibrate`: the plan served under its own planning load (100 rps here), the
    # request path outside the router measured too; then the plan made again with it, and
    # served again while that changes it (at most two rounds).
    in_situ = subprocess.run(
        [sys.executable, "-m", "sloline", "calibrate",
         str(EXAMPLES / "digits-cascade" / "pipeline.yaml"),
         "--cache-dir", str(tmp_path / "profiles"),
         "--duration", "4", "--rounds", "2", "-o", str(tmp_path / "in-situ.json")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert in_situ.returncode == 0, in_situ.stdout + in_situ.stderr
    # One round when the re-plan is the plan just served, else a second and a verdict.
    served = in_situ.stdout.count("serving this plan for 4 s")
    outcome = [line.split(":")[0] for line in in_situ.stdout.splitlines() if "settled" in line]
    assert "(round 1 of 2)" in in_situ.stdout, in_situ.stdout
    assert (served, outcome) in (
        (1, ["settled"]),
        (2, ["settled"]),
        (2, ["not settled after 2 rounds"]),
    ), in_situ.stdout
    measured = Calibration.load(tmp_path / "in-situ.json")
    assert 300 <= measured.requests <= 500, in_situ.stdout  # 4 s of ~100 rps
    assert measured.stages["fast"].batches >= MIN_BATCHES and measured.hop_s
    # Open-loop arrivals leave the workers idle for varied times: the batches fall into
    # several idle-time groups (every one of them: a worker's first batch, which has no
    # idle time, is in the warm-up), so the stage has an in-situ idle penalty.
    fast_measured = measured.stages["fast"]
    assert len(fast_measured.idle_gaps_s) >= 2, fast_measured
    assert sum(fast_measured.idle_batches) == fast_measured.batches
    assert fast_measured.idle is not None and "ms idle)" in in_situ.stdout
    assert len(measured.request_s) == 1000 and min(measured.request_s) >= 0.0
    # The router's CPU over the run, and its scale against the estimator's.
    assert measured.router_cpu_s is not None and measured.router_cpu_s > 0.0
    assert 0.25 <= measured.router_scale <= 4.0
    assert "router CPU in situ" in in_situ.stdout
    assert f"of {measured.requests} requests" in in_situ.stdout  # none lost
    assert "estimated P99 of this plan: on the same arrivals" in in_situ.stdout
    assert in_situ.stdout.count("plan for digits-cascade") == 1 + served


def test_image_ensemble_1000_concurrent_requests_match_in_process() -> None:
    path = build_example("image-ensemble")
    loaded = load_pipeline(path)
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, size=(1000, 64, 64, 3), dtype=np.uint8)
    reference = InProcessPipeline(loaded).infer_many(
        [{"image": im} for im in images], max_batch={"small": 8, "medium": 8, "large": 8}
    )
    batches = {"preprocess": 16, "small": 8, "medium": 8, "large": 8, "pick": 16}
    with BackgroundPipeline(
        path, max_batch=batches, router=RouterSettings(queue_capacity=2048)
    ) as served:

        async def fire() -> list[grpcaio.InferResult]:
            async with grpcaio.InferenceServerClient(served.grpc_url) as client:

                async def one(i: int) -> grpcaio.InferResult:
                    image = grpcaio.InferInput("image", [1, 64, 64, 3], "UINT8")
                    image.set_data_from_numpy(images[i][None])
                    return await client.infer(
                        "image-ensemble",
                        [image],
                        request_id=str(i),
                        parameters={"timeout_ms": 300_000},
                    )

                return await asyncio.gather(*(one(i) for i in range(len(images))))

        start = time.perf_counter()
        results = asyncio.run(fire())
        elapsed_s = time.perf_counter() - start
        assert served.pipeline is not None
        stats = served.pipeline.router.stats

        async def per_batch() -> dict[str, tuple[np.ndarray, ...]]:
            rings = (
                stats.stage_batch,
                stats.stage_service,
                stats.stage_cpu,
                stats.stage_roundtrip,
                stats.stage_idle,
            )
            return {s: tuple(r[s].since(0.0) for r in rings) for s in batches}

        per_stage = served.call(per_batch())
    assert len(results) == 1000
    # One record of each per answered batch: its size (every image visits every stage
    # once), the model time the worker measured, the worker's CPU time over it (the
    # models run on the worker's one thread, so at most the wall time plus the
    # scheduler's tick granularity), the round trip, which covers the model time, and how
    # long the worker sat idle before the batch: unknown (NaN) on each worker's first
    # batch, and a worker's idle and model times fit in the time the requests took.
    for stage, (sizes, service, cpu, roundtrip, idle) in per_stage.items():
        assert sizes.size == service.size == cpu.size == roundtrip.size == idle.size > 0, stage
        assert sizes.sum() == 1000, stage
        assert np.all(roundtrip >= service), stage
        assert 0.0 < cpu.sum() <= service.sum() + 0.01 * cpu.size, stage
        workers = int(np.isnan(idle).sum())
        assert workers >= 1 and np.all(idle[np.isfinite(idle)] >= 0.0), stage
        assert np.nansum(idle) + service.sum() <= workers * elapsed_s, stage
    for i, result in enumerate(results):
        assert result.get_response().id == str(i)
        probs = result.as_numpy("probabilities")[0]
        np.testing.assert_allclose(probs, reference[i]["probabilities"], rtol=1e-4, atol=1e-5)
        if np.sort(probs)[-1] - np.sort(probs)[-2] > 1e-4:
            assert int(result.as_numpy("label").ravel()[0]) == int(reference[i]["label"].ravel()[0])
