"""The example pipelines: their specs validate, their build scripts produce models that load
through `sloline.runtimes`, and chaining the stages by hand gives sensible answers.

Each example folder is copied to a temporary directory and built there, so tests never
write into the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sloline.runtimes import StageRunner, import_entrypoint, load_pipeline_stage
from sloline.spec import LoadedPipeline, load_pipeline

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"


def build_copy(name: str, destination: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Copy examples/<name> (without models) to `destination` and run its build.py there."""
    if not destination.exists():
        shutil.copytree(
            EXAMPLES / name, destination, ignore=shutil.ignore_patterns("models", "__pycache__")
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "build.py", *args],
        cwd=destination,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )


def load_all(pipeline: LoadedPipeline) -> dict[str, StageRunner]:
    runners = {name: load_pipeline_stage(pipeline, name) for name in pipeline.graph.order}
    for runner in runners.values():
        runner.warmup()
    return runners


@pytest.fixture(autouse=True)
def _isolate_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Python stages extend sys.path and TorchScript stages set torch's thread count."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    if torch is not None and threads is not None:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name", ["digits-cascade", "image-ensemble"])
def test_pipeline_files_validate(name: str):
    pipeline = load_pipeline(EXAMPLES / name / "pipeline.yaml")

    assert pipeline.name == name
    assert pipeline.pipeline.spec.samples is not None


def test_cascade_is_declared_conditional():
    graph = load_pipeline(EXAMPLES / "digits-cascade" / "pipeline.yaml").graph

    accurate = graph.stages["accurate"]
    assert accurate.condition is not None
    assert accurate.condition.refs == {("fast", "probabilities")}
    assert set(accurate.deps) == {"preprocess", "fast"}
    optional = {name: flag for name, _, flag in graph.stages["combine"].input_refs}
    assert optional == {"fast": False, "accurate": True}


def test_ensemble_members_are_declared_parallel():
    graph = load_pipeline(EXAMPLES / "image-ensemble" / "pipeline.yaml").graph

    assert graph.children["preprocess"] == ("small", "medium", "large")
    for member in ("small", "medium", "large"):
        assert graph.stages[member].deps == ("preprocess",)
        assert graph.stages[member].condition is None
    assert set(graph.stages["pick"].deps) == {"small", "medium", "large"}
    runtimes = {m: graph.stages[m].spec.model.runtime for m in ("small", "medium", "large")}
    assert runtimes == {"small": "torchscript", "medium": "onnx", "large": "torchscript"}


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    pytest.importorskip("skl2onnx")
    folder = tmp_path_factory.mktemp("examples") / "digits-cascade"
    return folder, build_copy("digits-cascade", folder).stdout


def test_digits_build_reports_and_is_idempotent(digits: tuple[Path, str]):
    folder, first = digits
    models = sorted((folder / "models").iterdir())
    stamps = [path.stat().st_mtime_ns for path in models]

    again = build_copy("digits-cascade", folder).stdout

    assert [p.name for p in models] == ["accurate.onnx", "fast.onnx"]
    assert "wrote" in first
    assert "models present" in again
    assert [path.stat().st_mtime_ns for path in models] == stamps
    assert "cascade   test accuracy" in again


def test_digits_cascade_beats_the_fast_model(digits: tuple[Path, str]):
    folder, _ = digits
    pipeline = load_pipeline(folder / "pipeline.yaml")
    runners = load_all(pipeline)
    condition = pipeline.graph.stages["accurate"].condition
    assert condition is not None
    x_test, y_test = import_entrypoint("digits_stages:labelled_test_split", folder)()

    features = runners["preprocess"].run([{"pixels": row} for row in x_test])
    fast = runners["fast"].run(features)
    escalate = [condition({"fast": f}) for f in fast]
    escalated_features = [f for f, e in zip(features, escalate, strict=True) if e]
    accurate = iter(runners["accurate"].run(escalated_features))
    inputs = []
    for result, escalated in zip(fast, escalate, strict=True):
        item = {"fast": result["probabilities"]}
        if escalated:  # a skipped stage's optional input is simply absent
            item["accurate"] = next(accurate)["probabilities"]
        inputs.append(item)
    combined = runners["combine"].run(inputs)

    fast_labels = np.array([f["probabilities"].argmax() for f in fast])
    labels = np.array([c["label"][0] for c in combined])
    fast_accuracy = np.mean(fast_labels == y_test)
    cascade_accuracy = np.mean(labels == y_test)
    assert fast_accuracy > 0.9
    assert cascade_accuracy >= fast_accuracy + 0.01
    assert 0.05 < np.mean(escalate) < 0.5  # only a minority reaches the accurate model
    assert all(c["probabilities"].shape == (10,) for c in combined)


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    folder = tmp_path_factory.mktemp("examples") / "image-ensemble"
    build_copy("image-ensemble", folder)
    return folder


def test_ensemble_picks_the_most_confident_member(ensemble: Path):
    pipeline = load_pipeline(ensemble / "pipeline.yaml")
    runners = load_all(pipeline)
    images = import_entrypoint("ensemble_stages:samples", ensemble)(count=12)["image"]

    preprocessed = runners["preprocess"].run([{"image": image} for image in images])
    members = {m: runners[m].run(preprocessed) for m in ("small", "medium", "large")}
    picked = runners["pick"].run(
        [{m: members[m][i]["probabilities"] for m in members} for i in range(len(images))]
    )

    assert preprocessed[0]["image"].shape == (3, 64, 64)
    for i, result in enumerate(picked):
        scores = [members[m][i]["probabilities"] for m in ("small", "medium", "large")]
        best = int(np.argmax([s.max() for s in scores]))
        assert result["winner"].tolist() == [best]
        np.testing.assert_array_equal(result["probabilities"], scores[best])
        assert result["label"].tolist() == [int(scores[best].argmax())]
        assert all(np.isclose(s.sum(), 1.0, atol=1e-5) for s in scores)  # softmax inside
    assert len({int(r["winner"][0]) for r in picked}) > 1  # members really disagree
