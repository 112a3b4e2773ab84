"""TorchScript adapter: real scripted and traced modules saved into tmp_path."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from sloline.runtimes import ModelError, TorchScriptRuntime, load_stage
from sloline.runtimes.torchscript import import_torch
from sloline.spec.models import StageSpec

torch = pytest.importorskip("torch")

StageFactory = Callable[..., StageSpec]


class Difference(torch.nn.Module):
    """Order-sensitive: a - b, so swapped inputs would show."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - b


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sum(dim=1, keepdim=True), x.argmax(dim=1)


class Named(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"double": x.double() * 2, "count": torch.ones_like(x[:, 0], dtype=torch.int64)}


def save(module: torch.nn.Module, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated upstream
        torch.jit.script(module).save(str(path))
    return path


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_inputs_are_passed_positionally_in_declared_order(make_stage: StageFactory, tmp_path: Path):
    save(Difference(), tmp_path / "diff.pt")
    stage = make_stage("torchscript", uri="diff.pt", inputs=["a", "b"])
    runner = load_stage(stage, tmp_path)

    results = runner.run(
        [{"b": np.full(3, i, np.float32), "a": np.full(3, 10, np.float32)} for i in range(3)]
    )

    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["y"], np.full(3, 10 - i))


def test_tuple_outputs_map_to_declared_outputs_in_order(make_stage: StageFactory, tmp_path: Path):
    save(Pair(), tmp_path / "pair.pt")
    stage = make_stage(
        "torchscript", uri="pair.pt", outputs=[("total", "FP32", [1]), ("index", "INT64", [])]
    )
    runner = load_stage(stage, tmp_path)

    first, second = runner.run(
        [{"x": np.array([1, 5, 2], np.float32)}, {"x": np.array([7, 0, 0], np.float32)}]
    )

    assert (first["total"].tolist(), first["index"].tolist()) == ([8], 1)
    assert (second["total"].tolist(), second["index"].tolist()) == ([7], 0)


def test_dict_outputs_are_cast_to_declared_types(make_stage: StageFactory, tmp_path: Path):
    save(Named(), tmp_path / "named.pt")
    stage = make_stage(
        "torchscript",
        uri="named.pt",
        outputs=[("double", "FP32", [3]), ("count", "INT64", [1])],
    )
    runner = load_stage(stage, tmp_path)

    (result,) = runner.run([{"x": np.array([1, 2, 3], np.float32)}])

    assert result["double"].dtype == np.float32  # float64 narrowed to the declared FP32
    np.testing.assert_array_equal(result["double"], [2, 4, 6])
    np.testing.assert_array_equal(result["count"], [1])


def test_thread_budget_is_applied(make_stage: StageFactory, tmp_path: Path):
    save(Difference(), tmp_path / "diff.pt")
    torch.set_num_threads(1)

    stage = make_stage("torchscript", inputs=["a", "b"], uri="-")
    TorchScriptRuntime(tmp_path / "diff.pt", stage, threads=2)

    assert torch.get_num_threads() == 2


def test_read_only_request_arrays_are_accepted(make_stage: StageFactory, tmp_path: Path):
    save(Difference(), tmp_path / "diff.pt")
    runtime = TorchScriptRuntime(
        tmp_path / "diff.pt", make_stage("torchscript", inputs=["a", "b"], uri="-")
    )
    a = np.frombuffer(np.ones((2, 3), np.float32).tobytes(), np.float32).reshape(2, 3)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outputs = runtime.predict({"a": a, "b": a})

    np.testing.assert_array_equal(outputs["y"], np.zeros((2, 3)))


def test_output_count_mismatch_is_explained(make_stage: StageFactory, tmp_path: Path):
    save(Pair(), tmp_path / "pair.pt")
    runner = load_stage(make_stage("torchscript", uri="pair.pt"), tmp_path)

    with pytest.raises(ModelError, match=r"returned 2 values but the stage declares 1 outputs"):
        runner.run([{"x": np.zeros(3, np.float32)}])


def test_model_failure_names_the_batch_shapes(make_stage: StageFactory, tmp_path: Path):
    save(Difference(), tmp_path / "diff.pt")
    runtime = TorchScriptRuntime(
        tmp_path / "diff.pt", make_stage("torchscript", inputs=["a", "b"], uri="-")
    )

    with pytest.raises(ModelError, match=r"failed on a batch \(a: torch.float32\[2, 3\]"):
        runtime.predict({"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 4), np.float32)})


def test_not_a_torchscript_file(make_stage: StageFactory, tmp_path: Path):
    (tmp_path / "bad.pt").write_bytes(b"not a zip archive")

    with pytest.raises(ModelError, match=r"torch\.jit\.load cannot load"):
        load_stage(make_stage("torchscript", uri="bad.pt"), tmp_path)


def test_unavailable_cuda_falls_back_to_cpu(make_stage: StageFactory, tmp_path: Path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    save(Difference(), tmp_path / "diff.pt")

    with pytest.warns(RuntimeWarning, match="CUDA device 0 was requested"):
        runtime = TorchScriptRuntime(
            tmp_path / "diff.pt",
            make_stage("torchscript", inputs=["a", "b"], uri="-"),
            cuda_device=0,
        )

    assert runtime.device == "cpu"


def test_missing_torch_says_how_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError

    with pytest.raises(ModelError, match=r"pip install 'sloline\[torch\]'"):
        import_torch("classify")
