"""Python stages: entrypoints written into tmp_path, stacked and list batching."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sloline.runtimes import ModelError, import_entrypoint, load_stage
from sloline.spec.models import StageSpec

StageFactory = Callable[..., StageSpec]
ModuleWriter = Callable[[str], str]


def test_stacked_function_gets_stacked_arrays(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module(
        """
        import numpy as np
        def predict(inputs):
            assert inputs["x"].shape == (3, 3)
            return {"y": inputs["x"] * 10}
        """
    )
    runner = load_stage(make_stage(entrypoint=f"{module}:predict"), tmp_path)

    results = runner.run([{"x": np.full(3, i, np.float32)} for i in range(3)])

    assert [r["y"].tolist() for r in results] == [[0] * 3, [10] * 3, [20] * 3]


def test_class_is_instantiated_once_with_config_and_predict_is_used(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module(
        """
        class Scale:
            instances = 0
            def __init__(self, factor):
                Scale.instances += 1
                self.factor = factor
            def predict(self, inputs):
                return {"y": inputs["x"] * self.factor}
            def __call__(self, inputs):
                raise AssertionError("predict takes precedence")
        """
    )
    stage = make_stage(entrypoint=f"{module}:Scale", config={"factor": 3})
    runner = load_stage(stage, tmp_path)

    runner.run([{"x": np.ones(3, np.float32)}])
    (result,) = runner.run([{"x": np.ones(3, np.float32)}])

    np.testing.assert_array_equal(result["y"], [3, 3, 3])
    assert import_entrypoint(f"{module}:Scale", tmp_path).instances == 1


def test_callable_class_without_predict(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module(
        """
        class Negate:
            def __call__(self, inputs):
                return {"y": -inputs["x"]}
        """
    )
    runner = load_stage(make_stage(entrypoint=f"{module}:Negate"), tmp_path)

    (result,) = runner.run([{"x": np.ones(3, np.float32)}])

    np.testing.assert_array_equal(result["y"], [-1, -1, -1])


def test_list_batching_gets_ragged_requests_and_optional_inputs(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module(
        """
        import numpy as np
        calls = []
        def combine(items):
            calls.append([sorted(item) for item in items])
            return [
                {"total": np.array([item["x"].sum() + item.get("bonus", np.zeros(1)).sum()])}
                for item in items
            ]
        """
    )
    stage = make_stage(
        entrypoint=f"{module}:combine",
        batching="list",
        inputs=["x", "bonus?"],
        outputs=[("total", "FP64", [1])],
    )
    runner = load_stage(stage, tmp_path)

    results = runner.run(
        [
            {"x": np.arange(3.0)},
            {"x": np.arange(5.0), "bonus": np.array([100.0])},
            {"x": np.arange(1.0)},
        ]
    )

    assert [r["total"].tolist() for r in results] == [[3.0], [110.0], [0.0]]
    calls = import_entrypoint(f"{module}:calls", tmp_path)
    assert calls == [[["x"], ["bonus", "x"], ["x"]]]  # one call, requests as they came


def test_list_batching_result_count_must_match(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module("def bad(items):\n    return items[:1]\n")
    stage = make_stage(entrypoint=f"{module}:bad", batching="list", outputs=[("x", "FP32", [3])])
    runner = load_stage(stage, tmp_path)

    with pytest.raises(ModelError, match="returned 1 results for 2 requests"):
        runner.run([{"x": np.zeros(3, np.float32)}] * 2)


def test_stacked_must_return_a_dict(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module("def bad(inputs):\n    return [inputs['x']]\n")
    runner = load_stage(make_stage(entrypoint=f"{module}:bad"), tmp_path)

    with pytest.raises(ModelError, match="with batching: stacked it must return a dict"):
        runner.run([{"x": np.zeros(3, np.float32)}])


def test_exceptions_in_user_code_become_model_errors(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module("def boom(inputs):\n    raise ValueError('bad pixel')\n")
    runner = load_stage(make_stage(entrypoint=f"{module}:boom"), tmp_path)

    with pytest.raises(ModelError, match="stage 'stage': the model raised ValueError: bad pixel"):
        runner.run([{"x": np.zeros(3, np.float32)}])


def test_config_for_a_function_is_rejected(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module("def f(inputs):\n    return inputs\n")

    with pytest.raises(ModelError, match="config is passed to classes only"):
        load_stage(make_stage(entrypoint=f"{module}:f", config={"k": 1}), tmp_path)


def test_bad_config_keywords_are_explained(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module("class C:\n    def __init__(self):\n        pass\n")

    with pytest.raises(ModelError, match=r"C\(k=\.\.\.\) raised TypeError"):
        load_stage(make_stage(entrypoint=f"{module}:C", config={"k": 1}), tmp_path)


def test_missing_module_and_attribute(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    with pytest.raises(ModelError, match=r"there is no nowhere_xyz\.py .* beside the pipeline"):
        load_stage(make_stage(entrypoint="nowhere_xyz:f"), tmp_path)
    module = write_module("def f(inputs):\n    return inputs\n")
    with pytest.raises(ModelError, match=f"module '{module}' .* has no attribute 'g'"):
        load_stage(make_stage(entrypoint=f"{module}:g"), tmp_path)


def test_missing_dependency_of_the_module(
    make_stage: StageFactory, write_module: ModuleWriter, tmp_path: Path
):
    module = write_module("import not_installed_pkg_xyz\n")

    with pytest.raises(ModelError, match="needs 'not_installed_pkg_xyz', which is not installed"):
        load_stage(make_stage(entrypoint=f"{module}:f"), tmp_path)


def test_same_module_name_in_two_pipeline_dirs(tmp_path: Path):
    first, second = tmp_path / "one", tmp_path / "two"
    for directory, value in ((first, 1), (second, 2)):
        directory.mkdir()
        (directory / "shared_name_stages.py").write_text(f"VALUE = {value}\n")

    assert import_entrypoint("shared_name_stages:VALUE", first) == 1
    assert import_entrypoint("shared_name_stages:VALUE", second) == 2
    assert import_entrypoint("shared_name_stages:VALUE", first) == 1
