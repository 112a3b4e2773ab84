"""StageRunner: sub-batching, order, output checks and casts, warmup, pipeline loading."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.model_server.worker import WorkerSettings, warm_up
from sloline.runtimes import ModelError, StageRunner, load_pipeline_stage, load_stage
from sloline.runtimes.base import Item
from sloline.spec import load_pipeline
from sloline.spec.models import StageSpec, TensorSpec

StageFactory = Callable[..., StageSpec]


class Recorder:
    """A stacked runtime that records batch shapes and returns `fn(inputs)`."""

    def __init__(self, fn: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]) -> None:
        self.fn = fn
        self.batches: list[dict[str, tuple[int, ...]]] = []

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append({k: v.shape for k, v in inputs.items()})
        return self.fn(inputs)


def ragged_stage(make_stage: StageFactory) -> StageSpec:
    return make_stage(inputs=["x", "extra?"], outputs=[("y", "FP64", [-1])])


def test_ragged_requests_run_in_sub_batches_in_order(make_stage: StageFactory):
    runtime = Recorder(lambda inputs: {"y": inputs["x"] * 2})
    runner = StageRunner(ragged_stage(make_stage), runtime)
    lengths = [2, 3, 2, 3, 1]

    results = runner.run([{"x": np.full(n, float(i))} for i, n in enumerate(lengths)])

    assert [r["y"].tolist() for r in results] == [[2.0 * i] * n for i, n in enumerate(lengths)]
    assert runtime.batches == [{"x": (2, 2)}, {"x": (2, 3)}, {"x": (1, 1)}]


def test_absent_optional_input_gets_its_own_sub_batch(make_stage: StageFactory):
    runtime = Recorder(lambda inputs: {"y": inputs["x"] + inputs.get("extra", 0)})
    runner = StageRunner(ragged_stage(make_stage), runtime)

    results = runner.run(
        [{"x": np.ones(2)}, {"x": np.ones(2), "extra": np.full(2, 5.0)}, {"x": np.zeros(2)}]
    )

    assert [r["y"].tolist() for r in results] == [[1, 1], [6, 6], [0, 0]]
    assert runtime.batches == [{"x": (2, 2)}, {"x": (1, 2), "extra": (1, 2)}]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=12))
def test_results_follow_request_order_for_any_mix(requests: list[tuple[int, bool]]):
    stage = StageSpec.model_validate(
        {
            "name": "mix",
            "model": {"runtime": "python", "entrypoint": "m:f"},
            "inputs": [{"name": "x", "from": "x"}, {"name": "e", "from": "e", "optional": True}],
            "outputs": [{"name": "y", "datatype": "FP64", "shape": [-1]}],
        }
    )
    runtime = Recorder(lambda inputs: {"y": inputs["x"] + inputs.get("e", 0.0)})
    items: list[Item] = [
        {"x": np.full(n, float(i)), **({"e": np.full(n, 0.5)} if flag else {})}
        for i, (n, flag) in enumerate(requests)
    ]

    results = StageRunner(stage, runtime).run(items)

    expected = [[i + (0.5 if flag else 0.0)] * n for i, (n, flag) in enumerate(requests)]
    assert [r["y"].tolist() for r in results] == expected
    assert sum(shape["x"][0] for shape in runtime.batches) == len(requests)


def test_labels_and_float64_outputs_are_conformed(make_stage: StageFactory):
    stage = make_stage(outputs=[("p", "FP32", [2]), ("label", "INT64", [1])])
    runtime = Recorder(
        lambda inputs: {
            "p": np.tile([0.25, 0.75], (len(inputs["x"]), 1)),  # float64
            "label": np.ones(len(inputs["x"]), dtype=np.int64),  # (batch,) for [1]
        }
    )

    (result, _) = StageRunner(stage, runtime).run([{"x": np.zeros(3)}] * 2)

    assert result["p"].dtype == np.float32
    assert result["p"].tolist() == [0.25, 0.75]
    assert result["label"].dtype == np.int64
    assert result["label"].shape == (1,)


@pytest.mark.parametrize(
    ("value", "datatype", "message"),
    [
        (np.array([0.5]), "INT64", r"is float64 but declared INT64.*astype\(np.int64\)"),
        (np.array([1], dtype=np.int64), "INT32", r"is int64 but declared INT32.*declare .*INT64"),
        (np.array([-1], dtype=np.int8), "UINT8", "is int8 but declared UINT8"),
    ],
)
def test_unsafe_casts_are_refused(
    make_stage: StageFactory, value: np.ndarray, datatype: str, message: str
):
    stage = make_stage(outputs=[("y", datatype, [1])])
    runner = StageRunner(stage, Recorder(lambda _: {"y": value[np.newaxis]}))

    with pytest.raises(ModelError, match=message):
        runner.run([{"x": np.zeros(3)}])


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ({"z": np.zeros((1, 3))}, r"did not return declared output 'y' \(it returned \['z'\]\)"),
        ({"y": np.zeros((2, 3))}, r"shape \[2, 3\] for a batch of 1; its first dimension"),
        ({"y": np.zeros((1, 4))}, r"output 'y' has shape \[4\] per request but is declared \[3\]"),
        ({"y": np.float32(1.0)}, "its first dimension must be the batch size"),
    ],
)
def test_bad_outputs_are_explained(
    make_stage: StageFactory, outputs: dict[str, np.ndarray], message: str
):
    runner = StageRunner(make_stage(), Recorder(lambda _: outputs))

    with pytest.raises(ModelError, match=message):
        runner.run([{"x": np.zeros(3)}])


def test_a_malformed_hop_fails_its_batch_not_the_worker(make_stage: StageFactory):
    """Inputs are checked where they enter the pipeline, not again here: a request that
    lacks an input or has another shape only makes the model fail, as a `ModelError`."""
    runtime = Recorder(lambda i: {"y": np.zeros((len(i["x"]), 3))})
    runner = StageRunner(make_stage(), runtime)

    with pytest.raises(ModelError, match=r"the model raised KeyError: 'x'"):
        runner.run([{"z": np.zeros(3)}])
    results = runner.run([{"x": np.zeros(3)}, {"x": np.zeros((2, 2))}])  # never stacked together
    assert [r["y"].shape for r in results] == [(3,), (3,)]
    assert runtime.batches[-2:] == [{"x": (1, 3)}, {"x": (1, 2, 2)}]


def test_warmup_runs_zeros_of_the_declared_shapes(make_stage: StageFactory):
    specs = {
        "x": TensorSpec(name="x", datatype="UINT8", shape=[-1, 4, 3]),
        "e": TensorSpec(name="e", datatype="FP32", shape=[]),
    }
    seen: list[dict[str, tuple[tuple[int, ...], str]]] = []

    def record(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append({k: (v.shape, v.dtype.name) for k, v in inputs.items()})
        return {"y": np.zeros((len(inputs["x"]), 3))}

    runner = StageRunner(make_stage(inputs=["x", "e?"]), Recorder(record), specs)
    runner.warmup(batch_size=4)

    assert seen == [{"x": ((4, 1, 4, 3), "uint8"), "e": ((4,), "float32")}]


@pytest.mark.parametrize(("cuda_device", "sizes"), [(None, [1]), (0, [1, 2, 3, 4, 5])])
def test_a_worker_on_a_gpu_warms_up_every_batch_size(
    make_stage: StageFactory, cuda_device: int | None, sizes: list[int]
):
    """GPU libraries choose kernels per input shape on first use: a worker on a CUDA
    device runs a batch of every size up to `warmup_max_batch` before serving; on the
    CPU one batch of one."""
    runtime = Recorder(lambda inputs: {"y": np.zeros((len(inputs["x"]), 3))})
    specs = {"x": TensorSpec(name="x", datatype="FP32", shape=[2])}
    runner = StageRunner(make_stage(), runtime, specs)
    settings = WorkerSettings(
        Path("pipeline.yaml"), "s", (), cuda_device=cuda_device, warmup_max_batch=5
    )

    warm_up(runner, settings)

    assert [b["x"][0] for b in runtime.batches] == sizes


def test_warmup_without_shapes_asks_for_samples(make_stage: StageFactory):
    runtime = Recorder(lambda inputs: {"y": np.ones((len(inputs["x"]), 3))})
    runner = StageRunner(make_stage(), runtime)

    with pytest.raises(ModelError, match=r"needs the shapes of inputs \['x'\].*sample items"):
        runner.warmup()
    runner.warmup([{"x": np.ones(7)}])
    assert runtime.batches == [{"x": (1, 7)}]


def test_empty_batch(make_stage: StageFactory):
    runtime = Recorder(lambda inputs: inputs)
    assert StageRunner(make_stage(), runtime).run([]) == []
    assert runtime.batches == []


def test_load_pipeline_stage_resolves_input_shapes(tmp_path: Path):
    (tmp_path / "pipe_stages.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            def scale(inputs):
                return {"scaled": inputs["pixels"] / 16.0}
            def total(inputs):
                return {"sum": inputs["values"].sum(axis=1)}
            """
        )
    )
    (tmp_path / "pipeline.yaml").write_text(
        textwrap.dedent(
            """
            apiVersion: sloline.dev/v1alpha1
            kind: PredictionPipeline
            metadata: {name: two-step}
            spec:
              slo: {latencyMs: 20}
              workload: {rateRps: 10}
              inputs: [{name: pixels, datatype: FP32, shape: [4]}]
              stages:
                - name: scale
                  model: {runtime: python, entrypoint: "pipe_stages:scale"}
                  inputs: [{name: pixels, from: pixels}]
                  outputs: [{name: scaled, datatype: FP32, shape: [4]}]
                - name: total
                  model: {runtime: python, entrypoint: "pipe_stages:total"}
                  inputs: [{name: values, from: scale.scaled}]
                  outputs: [{name: sum, datatype: FP32, shape: []}]
              output: total
            """
        )
    )
    pipeline = load_pipeline(tmp_path / "pipeline.yaml")

    runner = load_pipeline_stage(pipeline, "total")
    runner.warmup()

    assert runner.input_specs == {"values": TensorSpec(name="values", datatype="FP32", shape=[4])}
    (result,) = runner.run([{"values": np.arange(4, dtype=np.float32)}])
    assert result["sum"].tolist() == 6.0
    assert result["sum"].dtype == np.float32
    with pytest.raises(
        ModelError, match=r"has no stage 'nope'; its stages are \['scale', 'total'\]"
    ):
        load_pipeline_stage(pipeline, "nope")


def test_load_stage_for_python_ignores_device_settings(make_stage: StageFactory, tmp_path: Path):
    (tmp_path / "plain_stage_mod.py").write_text("def f(inputs):\n    return {'y': inputs['x']}\n")

    runner = load_stage(
        make_stage(entrypoint="plain_stage_mod:f"), tmp_path, threads=2, cuda_device=0
    )

    assert runner.run([{"x": np.ones(3)}])[0]["y"].dtype == np.float32


class ShortList:
    def predict_list(self, items: Sequence[Item]) -> list[dict[str, np.ndarray]]:
        return [{"y": np.zeros(3)} for _ in items[1:]]


def test_list_runtime_must_answer_every_request(make_stage: StageFactory):
    runner = StageRunner(make_stage(), ShortList())

    with pytest.raises(ModelError, match="returned 1 results for 2 requests"):
        runner.run([{"x": np.zeros(3)}] * 2)


def test_models_get_writable_batches_even_for_read_only_requests(make_stage: StageFactory):
    def scale_in_place(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs["x"][...] *= 2
        return {"y": inputs["x"]}

    request = np.ones(3)
    request.flags.writeable = False

    (result,) = StageRunner(make_stage(), Recorder(scale_in_place)).run([{"x": request}])

    assert result["y"].tolist() == [2, 2, 2]
    assert request.tolist() == [1, 1, 1]


def test_importing_runtimes_does_not_import_torch():
    code = "import sys, sloline.runtimes; sys.exit('torch' in sys.modules)"
    repo = Path(__file__).resolve().parents[3]

    assert subprocess.run([sys.executable, "-c", code], cwd=repo, check=False).returncode == 0
