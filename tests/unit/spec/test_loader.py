"""Where relative paths resolve: the pipeline file's folder, or SLOLINE_MODEL_DIR (the
Kubernetes layout: pipeline from a ConfigMap, models on a volume)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sloline.runtimes import ModelError, load_pipeline_stage
from sloline.spec import PipelineError, load_pipeline

NOOP = Path(__file__).resolve().parents[2] / "support" / "pipelines" / "noop"


def test_relative_paths_resolve_against_the_model_dir_when_set(tmp_path: Path) -> None:
    config, models = tmp_path / "etc", tmp_path / "models"
    config.mkdir()
    models.mkdir()
    # A module name no other test imports, so no cached module can stand in for it.
    text = (NOOP / "pipeline.yaml").read_text().replace("noop_stages", "loader_test_stages")
    (config / "pipeline.yaml").write_text(text)
    (models / "loader_test_stages.py").write_text((NOOP / "noop_stages.py").read_text())

    beside = load_pipeline(config / "pipeline.yaml", environ={})
    assert beside.base_dir == config.resolve()
    assert beside.resolve("models/a.onnx") == config.resolve() / "models/a.onnx"
    with pytest.raises(ModelError, match="loader_test_stages"):
        load_pipeline_stage(beside, "s1")

    loaded = load_pipeline(config / "pipeline.yaml", environ={"SLOLINE_MODEL_DIR": str(models)})
    assert loaded.base_dir == models.resolve()
    assert loaded.resolve("models/a.onnx") == models.resolve() / "models/a.onnx"
    with pytest.raises(PipelineError, match="absolute path"):  # tests/hostile has the rest
        loaded.resolve("/abs/a.onnx")
    runner = load_pipeline_stage(loaded, "s1")  # the module is found in the model dir
    assert runner.run([{"x": np.ones(2, np.float32)}])[0]["x"].tolist() == [1.0, 1.0]

    explicit = load_pipeline(
        config / "pipeline.yaml", model_dir=tmp_path, environ={"SLOLINE_MODEL_DIR": str(models)}
    )
    assert explicit.base_dir == tmp_path.resolve()
    empty = load_pipeline(config / "pipeline.yaml", environ={"SLOLINE_MODEL_DIR": ""})
    assert empty.base_dir == config.resolve()
