"""onnxruntime adapter: real tiny ONNX graphs (onnx.helper) and a real skl2onnx model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from sloline.runtimes import ModelError, OnnxRuntime, load_stage
from sloline.spec.models import StageSpec, TensorSpec

StageFactory = Callable[..., StageSpec]

skl2onnx = pytest.importorskip("skl2onnx")
linear_model = pytest.importorskip("sklearn.linear_model")
datasets = pytest.importorskip("sklearn.datasets")


def test_batch_is_stacked_and_split_per_request(make_stage: StageFactory, double_onnx: Path):
    stage = make_stage(
        "onnx", uri=double_onnx.name, outputs=[("y", "FP32", [3]), ("label", "INT64", [1])]
    )
    runner = load_stage(stage, double_onnx.parent)
    items = [{"x": np.array([i, 2 * i, -i], dtype=np.float32)} for i in range(1, 5)]

    results = runner.run(items)

    assert len(results) == 4
    for i, result in enumerate(results, start=1):
        np.testing.assert_array_equal(result["y"], [2 * i, 4 * i, -2 * i])
        assert result["label"].dtype == np.int64
        np.testing.assert_array_equal(result["label"], [1])  # (batch,) declared [1]


def test_single_request_batch(make_stage: StageFactory, double_onnx: Path):
    runner = load_stage(make_stage("onnx", uri=double_onnx.name), double_onnx.parent)

    (result,) = runner.run([{"x": np.ones(3, dtype=np.float32)}])

    np.testing.assert_array_equal(result["y"], [2, 2, 2])
    assert set(result) == {"y"}  # a stage may declare a subset of the model's outputs


def test_name_mismatch_says_exactly_what_differs(make_stage: StageFactory, double_onnx: Path):
    stage = make_stage(
        "onnx", uri=double_onnx.name, inputs=["pixels"], outputs=[("probs", "FP32", [3])]
    )

    with pytest.raises(ModelError) as info:
        load_stage(stage, double_onnx.parent)

    message = str(info.value)
    assert "the model needs inputs the stage does not declare: ['x']" in message
    assert "the stage declares inputs the model does not have: ['pixels']" in message
    assert "the stage declares outputs the model does not have: ['probs']" in message
    assert "inputs ['x'] and outputs ['y', 'label']" in message


def test_threads_and_quiet_session_options_are_applied(make_stage: StageFactory, double_onnx: Path):
    runtime = OnnxRuntime(double_onnx, make_stage("onnx", uri="-"), threads=2)

    options = runtime.session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert runtime.intra_op_threads == 2


def test_unavailable_cuda_falls_back_to_cpu_with_a_warning(
    make_stage: StageFactory, double_onnx: Path
):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has CUDA")

    with pytest.warns(RuntimeWarning, match="onnxruntime-gpu"):
        runner = load_stage(
            make_stage("onnx", uri=double_onnx.name), double_onnx.parent, cuda_device=0
        )

    assert runner.run([{"x": np.zeros(3, np.float32)}])[0]["y"].shape == (3,)


def test_inputs_are_converted_to_the_model_type_only_when_safe(
    make_stage: StageFactory, double_onnx: Path
):
    runner = load_stage(make_stage("onnx", uri=double_onnx.name), double_onnx.parent)

    (result,) = runner.run([{"x": np.array([0.5, 1.0, 1.5], dtype=np.float64)}])
    np.testing.assert_allclose(result["y"], [1, 2, 3])
    with pytest.raises(ModelError, match=r"input 'x' is int64 but the model expects float32"):
        runner.run([{"x": np.array([1, 2, 3], dtype=np.int64)}])


def test_missing_file_names_the_path(make_stage: StageFactory, tmp_path: Path):
    with pytest.raises(ModelError, match=r"missing\.onnx does not exist; fix model\.uri"):
        load_stage(make_stage("onnx", uri="models/missing.onnx"), tmp_path)


def test_fixed_batch_dimension_is_rejected_with_a_fix(
    make_stage: StageFactory, save_onnx: Callable[..., Path], tmp_path: Path
):
    path = save_onnx(
        tmp_path / "fixed.onnx",
        [helper.make_node("Identity", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, [1, 3])],
        [("y", TensorProto.FLOAT, [1, 3])],
    )

    with pytest.raises(ModelError, match="without a dynamic batch dimension first; re-export"):
        load_stage(make_stage("onnx", uri=path.name), tmp_path)


def test_declared_shapes_and_types_are_checked_at_load(make_stage: StageFactory, double_onnx: Path):
    with pytest.raises(ModelError, match=r"output 'y' is declared with shape \[4\]"):
        load_stage(
            make_stage("onnx", uri=double_onnx.name, outputs=[("y", "FP32", [4])]),
            double_onnx.parent,
        )
    with pytest.raises(ModelError, match=r"output 'label' is declared INT32 .* tensor\(int64\)"):
        load_stage(
            make_stage("onnx", uri=double_onnx.name, outputs=[("label", "INT32", [1])]),
            double_onnx.parent,
        )
    with pytest.raises(ModelError, match=r"input 'x' is declared upstream with shape \[5\]"):
        load_stage(
            make_stage("onnx", uri=double_onnx.name),
            double_onnx.parent,
            input_specs={"x": TensorSpec(name="x", datatype="FP32", shape=[5])},
        )


def test_failure_inside_the_model_is_a_model_error(make_stage: StageFactory, double_onnx: Path):
    stage = make_stage("onnx", uri=double_onnx.name, outputs=[("y", "FP32", [-1])])
    runner = load_stage(stage, double_onnx.parent)

    with pytest.raises(ModelError, match=r"onnxruntime failed on a batch \(x: float32\[1, 4\]\)"):
        runner.run([{"x": np.zeros(4, np.float32)}])


def test_skl2onnx_classifier_labels_and_probabilities(make_stage: StageFactory, tmp_path: Path):
    x, y = datasets.load_iris(return_X_y=True)
    model = linear_model.LogisticRegression(max_iter=500).fit(x, y)
    onx = skl2onnx.to_onnx(
        model,
        initial_types=[("features", skl2onnx.common.data_types.FloatTensorType([None, 4]))],
        options={"zipmap": False},
        target_opset=17,
    )
    (tmp_path / "iris.onnx").write_bytes(onx.SerializeToString())
    stage = make_stage(
        "onnx",
        uri="iris.onnx",
        inputs=["features"],
        outputs=[("label", "INT64", [1]), ("probabilities", "FP32", [3])],
    )
    runner = load_stage(stage, tmp_path)

    results = runner.run([{"features": row} for row in x[:20]])  # float64 rows

    labels = np.array([r["label"][0] for r in results])
    np.testing.assert_array_equal(labels, model.predict(x[:20]))
    probabilities = np.stack([r["probabilities"] for r in results])
    np.testing.assert_allclose(probabilities, model.predict_proba(x[:20]), atol=1e-4)
