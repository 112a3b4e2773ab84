"""Factories for the runtime tests: stage specs, tiny ONNX graphs and Python stage modules."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from sloline.spec.models import StageSpec

# Old enough for every onnxruntime sloline supports.
OPSET = 17
IR_VERSION = 8


def _stage(
    runtime: str = "python",
    *,
    inputs: Sequence[str] = ("x",),
    outputs: Sequence[tuple[str, str, list[int]]] = (("y", "FP32", [3]),),
    name: str = "stage",
    uri: str | None = None,
    entrypoint: str | None = None,
    batching: str = "stacked",
    config: dict[str, Any] | None = None,
) -> StageSpec:
    """A stage; an input name ending in `?` is optional. Inputs read pipeline inputs."""
    model: dict[str, Any] = {"runtime": runtime, "batching": batching}
    if uri is not None:
        model["uri"] = uri
    if entrypoint is not None:
        model["entrypoint"] = entrypoint
    if config:
        model["config"] = config
    return StageSpec.model_validate(
        {
            "name": name,
            "model": model,
            "inputs": [
                {"name": n.rstrip("?"), "from": n.rstrip("?"), "optional": n.endswith("?")}
                for n in inputs
            ],
            "outputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in outputs],
        }
    )


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python stages put their directory on sys.path; keep that within each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def make_stage() -> Callable[..., StageSpec]:
    return _stage


@pytest.fixture
def write_module(tmp_path: Path) -> Callable[[str], str]:
    """Write Python source into tmp_path under a fresh module name; returns the name.

    Unique names keep tests independent of each other's entries in `sys.modules`.
    """

    def write(source: str) -> str:
        name = f"stage_{uuid.uuid4().hex[:12]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


def _save_onnx(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[int | str | None]]],
    outputs: list[tuple[str, int, list[int | str | None]]],
    initializers: list[onnx.TensorProto] | None = None,
) -> Path:
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=initializers or [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def save_onnx() -> Callable[..., Path]:
    """`save_onnx(path, nodes, inputs, outputs)`: a checked ONNX model file."""
    return _save_onnx


@pytest.fixture
def double_onnx(tmp_path: Path) -> Path:
    """x: float[batch, 3] -> y = x + x (float[batch, 3]), label = argmax(x) (int64[batch])."""
    return _save_onnx(
        tmp_path / "double.onnx",
        [
            helper.make_node("Add", ["x", "x"], ["y"]),
            helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0),
        ],
        [("x", TensorProto.FLOAT, ["batch", 3])],
        [("y", TensorProto.FLOAT, ["batch", 3]), ("label", TensorProto.INT64, ["batch"])],
    )
