"""ONNX models through onnxruntime, with the thread budget the planner gave the replica.

onnxruntime's defaults suit a process that owns the machine: one intra-op thread per
core, spinning while idle. A replica shares the machine with other replicas and stages,
so the session gets exactly `threads` intra-op threads, one inter-op thread, sequential
execution and no spinning; otherwise measured profiles would not hold once replicas are
packed together. The model's input and output names are checked against the stage at
load time, so a mismatch is reported when the worker starts, not on the first request.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from sloline.runtimes.base import ModelError
from sloline.runtimes.conform import (
    datatype_name,
    dims_match,
    dtype_of,
    format_shape,
    safe_cast,
)
from sloline.spec.models import StageSpec, TensorSpec

_ONNX_TYPES: dict[str, np.dtype[Any]] = {
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
}


def session_options(threads: int) -> ort.SessionOptions:
    """Options that keep a session within `threads` cores and quiet while idle."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning threads burn a core each between batches, starving co-located replicas.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def providers_for(cuda_device: int | None) -> list[Any]:
    """CUDA on `cuda_device` (CPU as fallback for unsupported ops), or CPU alone.

    Warns and returns CPU alone when CUDA is asked for but this onnxruntime build has no
    CUDA provider.
    """
    if cuda_device is None:
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        warnings.warn(
            f"CUDA device {cuda_device} was requested but this onnxruntime build has no "
            "CUDAExecutionProvider (install onnxruntime-gpu instead of onnxruntime); "
            "running on the CPU",
            RuntimeWarning,
            stacklevel=3,
        )
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"device_id": cuda_device}), "CPUExecutionProvider"]


class OnnxRuntime:
    """One onnxruntime `InferenceSession` serving one stage (implements `Runtime`)."""

    def __init__(
        self,
        path: Path,
        stage: StageSpec,
        *,
        threads: int = 1,
        cuda_device: int | None = None,
        input_specs: Mapping[str, TensorSpec] | None = None,
    ) -> None:
        self.stage_name = stage.name
        if not path.is_file():
            raise ModelError(
                f"stage {stage.name!r}: ONNX model file {path} does not exist; fix "
                "model.uri (relative paths are resolved against the pipeline file) or "
                "build the model first"
            )
        providers = providers_for(cuda_device)
        try:
            self.session = ort.InferenceSession(
                str(path), session_options(threads), providers=providers
            )
        except Exception as exc:
            raise ModelError(
                f"stage {stage.name!r}: onnxruntime cannot load {path}: {exc}; check that "
                "the file is a valid ONNX model for this onnxruntime version"
            ) from exc
        if len(providers) > 1 and "CUDAExecutionProvider" not in self.session.get_providers():
            warnings.warn(
                f"stage {stage.name!r}: onnxruntime could not start CUDA device "
                f"{cuda_device} (see its log above); running on the CPU",
                RuntimeWarning,
                stacklevel=2,
            )
        self._input_types = {i.name: _ONNX_TYPES.get(i.type) for i in self.session.get_inputs()}
        _check_names(stage, self.session, path)
        _check_inputs(stage.name, self.session, input_specs or {})
        _check_outputs(stage, self.session)
        self._output_names = [t.name for t in stage.outputs]

    @property
    def intra_op_threads(self) -> int:
        return int(self.session.get_session_options().intra_op_num_threads)

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {name: self._convert(name, array) for name, array in inputs.items()}
        try:
            outputs = self.session.run(self._output_names, feed)
        except Exception as exc:
            shapes = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in feed.items())
            raise ModelError(
                f"stage {self.stage_name!r}: onnxruntime failed on a batch ({shapes}): {exc}"
            ) from exc
        return dict(zip(self._output_names, outputs, strict=True))

    def _convert(self, name: str, array: np.ndarray) -> np.ndarray:
        want = self._input_types.get(name)
        if want is None or array.dtype == want:
            return array
        if not safe_cast(array.dtype, want):
            raise ModelError(
                f"stage {self.stage_name!r}: input {name!r} is {array.dtype} but the model "
                f"expects {want}, and converting could change values; send {want} data "
                "or re-export the model with this input type"
            )
        return array.astype(want)


def _check_names(stage: StageSpec, session: Any, path: Path) -> None:
    model_inputs = [i.name for i in session.get_inputs()]
    model_outputs = [o.name for o in session.get_outputs()]
    declared_inputs = [i.name for i in stage.inputs]
    declared_outputs = [o.name for o in stage.outputs]
    problems = []
    if missing := [n for n in model_inputs if n not in declared_inputs]:
        problems.append(f"the model needs inputs the stage does not declare: {missing}")
    if extra := [n for n in declared_inputs if n not in model_inputs]:
        problems.append(f"the stage declares inputs the model does not have: {extra}")
    if extra := [n for n in declared_outputs if n not in model_outputs]:
        problems.append(f"the stage declares outputs the model does not have: {extra}")
    if problems:
        raise ModelError(
            f"stage {stage.name!r}: {path.name} does not match the stage: "
            + "; ".join(problems)
            + f". The model has inputs {model_inputs} and outputs {model_outputs}; set the "
            "stage's inputs[].name and outputs[].name to these names (a stage may declare "
            "a subset of the model's outputs)"
        )


def _check_inputs(stage: str, session: Any, specs: Mapping[str, TensorSpec]) -> None:
    for node in session.get_inputs():
        if not node.shape or isinstance(node.shape[0], int):
            raise ModelError(
                f"stage {stage!r}: model input {node.name!r} has shape "
                f"{format_shape(node.shape)} without a dynamic batch dimension first; "
                "re-export the model with a dynamic axis 0 (e.g. torch.onnx.export(..., "
                "dynamic_shapes=...) or skl2onnx FloatTensorType([None, ...]))"
            )
        if node.type not in _ONNX_TYPES:
            raise ModelError(
                f"stage {stage!r}: model input {node.name!r} has type {node.type}, which "
                "sloline cannot send; use a numeric or bool tensor input"
            )
        spec = specs.get(node.name)
        if spec is None:
            continue
        if not dims_match(spec.shape, node.shape[1:]):
            raise ModelError(
                f"stage {stage!r}: input {node.name!r} is declared upstream with shape "
                f"{spec.shape} per request but the model takes {format_shape(node.shape[1:])} "
                "per request (after the batch dimension); make them agree"
            )
        if not safe_cast(dtype_of(spec.datatype), _ONNX_TYPES[node.type]):
            raise ModelError(
                f"stage {stage!r}: input {node.name!r} arrives as {spec.datatype} but the "
                f"model takes {node.type}; declare a matching datatype upstream"
            )


def _check_outputs(stage: StageSpec, session: Any) -> None:
    nodes = {o.name: o for o in session.get_outputs()}
    for spec in stage.outputs:
        node = nodes[spec.name]
        got = _ONNX_TYPES.get(node.type)
        if got is None or not safe_cast(got, dtype_of(spec.datatype)):
            raise ModelError(
                f"stage {stage.name!r}: output {spec.name!r} is declared {spec.datatype} but "
                f"the model produces {node.type}, and converting could change values; "
                f"declare the model's datatype ({datatype_name(got)}) or re-export the model"
            )
        if node.shape and not dims_match(spec.shape, node.shape[1:]):
            raise ModelError(
                f"stage {stage.name!r}: output {spec.name!r} is declared with shape "
                f"{spec.shape} per request but the model gives {format_shape(node.shape[1:])} "
                "per request (after the batch dimension); fix outputs[].shape"
            )
