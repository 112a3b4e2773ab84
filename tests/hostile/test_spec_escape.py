"""A pipeline spec cannot run code or read files outside its model directory: entrypoints
load only module files inside it (never the standard library, an installed package or
sloline, not through a symlink), paths stay inside it, and the operator accepts a
`sloline.dev/model-dir` annotation only under its models root. Each attack is rejected
where the spec is validated (`sloline validate`, the operator's reconcile, with the field
and the reason) and again where a worker would load it."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from sloline.cli import main
from sloline.operator.kube import KubeApi
from sloline.operator.naming import Target
from sloline.operator.reconcile import Failed, OperatorContext, reconcile
from sloline.operator.settings import parse_settings
from sloline.runtimes import ModelError, import_entrypoint, load_pipeline_stage, load_stage
from sloline.spec import PipelineError, load_pipeline, parse_pipeline
from sloline.spec.models import StageSpec
from tests.support.kube import KubeEmulator
from tests.support.serve import NOOP

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "helm" / "sloline-crds" / "files" / "predictionpipelines.sloline.dev.yaml"
POPEN = {
    "runtime": "python",
    "entrypoint": "subprocess:Popen",
    "config": {"args": "id > pwned", "shell": True},
}


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the noop pipeline's folder (its module renamed, so no cached module of
    another test stands in for it); the working directory is its parent."""
    folder = tmp_path / "models" / "p"
    folder.mkdir(parents=True)
    source = (NOOP.parent / "noop_stages.py").read_text()
    (folder / "escape_test_stages.py").write_text(source)
    text = NOOP.read_text().replace("noop_stages", "escape_test_stages")
    (folder / "pipeline.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    return folder


def write(folder: Path, doc: dict[str, Any]) -> Path:
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def doc_of(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((folder / "pipeline.yaml").read_text())
    return doc


def validate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


def outside_module(tmp_path: Path, name: str) -> Path:
    """A module outside the model directory that leaves a marker file when executed."""
    marker = tmp_path / f"{name}.ran"
    module = tmp_path / "outside" / f"{name}.py"
    module.parent.mkdir(exist_ok=True)
    module.write_text(f"open({str(marker)!r}, 'w').close()\ndef f(inputs):\n    return inputs\n")
    return marker


# ------------------------------------------------------------------ entrypoints


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (POPEN, "'subprocess' is a standard-library module"),
        ({"runtime": "python", "entrypoint": "os:system"}, "'os' is a standard-library module"),
        ({"runtime": "python", "entrypoint": "shlex:split"}, "'shlex' is a standard-library"),
        ({"runtime": "python", "entrypoint": "yaml:safe_load"}, "'yaml' is an installed package"),
        ({"runtime": "python", "entrypoint": "sloline.cli:main"}, "'sloline' is sloline's own"),
    ],
)
def test_entrypoints_outside_the_model_directory_fail_validation(
    folder: Path, capsys: pytest.CaptureFixture[str], model: dict[str, Any], reason: str
) -> None:
    doc = doc_of(folder)
    doc["spec"]["stages"][0]["model"] = model
    code, err = validate(write(folder, doc), capsys)
    assert code == 2, err
    assert f"spec.stages[0].model.entrypoint: module {reason}" in err, err
    assert not (folder.parent.parent / "pwned").exists() and not (folder / "pwned").exists()


def test_samples_entrypoint_is_checked_too(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = doc_of(folder)
    doc["spec"]["samples"] = {"entrypoint": "os:getcwd"}
    code, err = validate(write(folder, doc), capsys)
    assert code == 2 and "spec.samples.entrypoint: module 'os' is a standard-library" in err


def test_a_module_the_model_directory_lacks_fails_validation(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = doc_of(folder)
    doc["spec"]["stages"][1]["model"]["entrypoint"] = "not_here_stages:f"
    code, err = validate(write(folder, doc), capsys)
    assert code == 2
    assert "spec.stages[1].model.entrypoint: there is no not_here_stages.py" in err


@pytest.mark.parametrize(
    "entrypoint", ["subprocess:Popen", "os:system", "shlex:split", "yaml:safe_load", "sloline:cli"]
)
def test_the_worker_refuses_them_too(folder: Path, entrypoint: str) -> None:
    """Defence in depth: a stage that skipped validation (built directly) still cannot
    import anything outside the model directory."""
    stage = StageSpec.model_validate(
        {
            "name": "s",
            "model": {"runtime": "python", "entrypoint": entrypoint},
            "inputs": [{"name": "x", "from": "x"}],
            "outputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        }
    )
    with pytest.raises(ModelError, match=r"rename your module|model directory"):
        load_stage(stage, folder)
    with pytest.raises(ModelError):
        import_entrypoint(entrypoint, folder)


def test_a_model_file_shadowing_the_standard_library_is_refused(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_module = sys.modules["json"]
    (folder / "json.py").write_text("def f(inputs):\n    return inputs\n")
    doc = doc_of(folder)
    doc["spec"]["stages"][0]["model"]["entrypoint"] = "json:f"
    code, err = validate(write(folder, doc), capsys)
    assert code == 2 and "module 'json' is a standard-library module" in err
    with pytest.raises(ModelError, match="standard-library"):
        import_entrypoint("json:f", folder)
    assert sys.modules["json"] is json_module


def test_a_symlinked_module_pointing_outside_is_refused(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = outside_module(tmp_path, "evil_stages")
    (folder / "evil_stages.py").symlink_to(tmp_path / "outside" / "evil_stages.py")
    (folder / "evil_pkg").symlink_to(tmp_path / "outside", target_is_directory=True)
    doc = doc_of(folder)
    doc["spec"]["stages"][0]["model"]["entrypoint"] = "evil_stages:f"
    doc["spec"]["stages"][1]["model"]["entrypoint"] = "evil_pkg.evil_stages:f"
    code, err = validate(write(folder, doc), capsys)
    assert code == 2, err
    assert "spec.stages[0].model.entrypoint: evil_stages.py leads to" in err
    assert "spec.stages[1].model.entrypoint: evil_pkg leads to" in err
    assert "outside the model directory" in err
    for entrypoint in ("evil_stages:f", "evil_pkg.evil_stages:f"):
        with pytest.raises(ModelError, match="outside the model directory"):
            import_entrypoint(entrypoint, folder)
    assert not marker.exists()


def test_modules_and_packages_inside_the_model_directory_still_load(folder: Path) -> None:
    package = folder / "inside_pkg" / "sub"
    package.mkdir(parents=True)
    (folder / "inside_pkg" / "__init__.py").write_text("LEVEL = 'top'\n")
    (package / "stages.py").write_text("from . import helper\nVALUE = helper.VALUE\n")
    (package / "helper.py").write_text("VALUE = 42\n")
    assert import_entrypoint("inside_pkg.sub.stages:VALUE", folder) == 42
    assert import_entrypoint("inside_pkg:LEVEL", folder) == "top"
    loaded = load_pipeline(folder / "pipeline.yaml")
    assert loaded.check_files() == []
    runner = load_pipeline_stage(loaded, "s1")
    assert runner.run([{"x": np.ones(2, np.float32)}])[0]["x"].tolist() == [1.0, 1.0]


# ------------------------------------------------------------------ paths


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("../../../etc/hostname", "contains '..'"),
        ("models/../../x.onnx", "contains '..'"),
        ("/etc/hostname", "is an absolute path"),
        ("", "is empty"),
    ],
)
def test_paths_leaving_the_model_directory_fail_validation(
    folder: Path, capsys: pytest.CaptureFixture[str], uri: str, reason: str
) -> None:
    doc = doc_of(folder)
    doc["spec"]["stages"][2]["model"] = {"runtime": "onnx", "uri": uri}
    doc["spec"]["samples"] = {"uri": uri}
    doc["spec"]["workload"] = {"traceUri": uri}
    code, err = validate(write(folder, doc), capsys)
    assert code == 2
    for field in ("spec.stages[2].model.uri", "spec.samples.uri", "spec.workload.traceUri"):
        assert f"{field}: " in err and reason in err, (field, err)


def test_an_absolute_path_inside_the_model_directory_is_refused_too(folder: Path) -> None:
    doc = doc_of(folder)
    doc["spec"]["stages"][2]["model"] = {"runtime": "onnx", "uri": str(folder / "m.onnx")}
    with pytest.raises(PipelineError, match=r"spec.stages\[2\].model.uri: .* absolute path"):
        parse_pipeline(doc)


def test_a_symlinked_path_pointing_outside_is_refused(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret.onnx"
    secret.write_bytes(b"not yours")
    (folder / "models").mkdir()
    (folder / "models" / "m.onnx").symlink_to(secret)
    doc = doc_of(folder)
    doc["spec"]["stages"][2]["model"] = {"runtime": "onnx", "uri": "models/m.onnx"}
    code, err = validate(write(folder, doc), capsys)
    assert code == 2
    assert "spec.stages[2].model.uri: 'models/m.onnx' leads to" in err
    assert "outside the model directory" in err
    loaded = load_pipeline(folder / "pipeline.yaml")
    with pytest.raises(PipelineError, match="outside the model directory"):
        loaded.resolve("models/m.onnx", "spec.stages[2].model.uri")
    # A worker given this stage (as on a pod) refuses it before opening the file.
    with pytest.raises(ModelError, match="outside the model directory"):
        load_pipeline_stage(loaded, "s3")
    # The run refuses to start.
    assert main(["run", str(folder / "pipeline.yaml"), "--no-plan"]) == 2


def test_the_worker_refuses_escaping_paths(folder: Path) -> None:
    for uri in ("../../../etc/hostname", "/etc/hostname"):
        stage = StageSpec.model_validate(
            {
                "name": "s",
                "model": {"runtime": "onnx", "uri": uri},
                "inputs": [{"name": "x", "from": "x"}],
                "outputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
            }
        )
        with pytest.raises(ModelError, match=r"model.uri .*(\.\.|absolute)"):
            load_stage(stage, folder)


def test_the_probe_pipelines_use_no_internal_entrypoint() -> None:
    """The profiler's probe serves its own stages from a file it writes into its model
    directory, not through an entrypoint into sloline's package."""
    from sloline.measure.probe import STAGES_MODULE, _pipeline_doc

    doc = yaml.safe_load(_pipeline_doc({"x": np.ones(2, np.float32)}, ["identity", "hold"], 4))
    entrypoints = [s["model"]["entrypoint"] for s in doc["spec"]["stages"]]
    assert entrypoints == [f"{STAGES_MODULE}:identity", f"{STAGES_MODULE}:hold"]
    parse_pipeline(doc)


# ------------------------------------------------------------------ operator


@pytest.fixture
def cluster(kube: KubeEmulator) -> tuple[KubeEmulator, OperatorContext]:
    kube.register_crd(CRD)
    settings = parse_settings({"models": {"root": "/models"}})
    return kube, OperatorContext(KubeApi.connect(str(kube.kubeconfig_path)), settings)


def pipeline_object(annotations: dict[str, str] | None = None, **stage0: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(NOOP.read_text())
    doc["spec"]["stages"][0]["model"].update(stage0)
    if annotations:
        doc["metadata"]["annotations"] = annotations
    return doc


def reconcile_once(kube: KubeEmulator, ctx: OperatorContext, obj: dict[str, Any]) -> Any:
    created = kube.create(obj)
    events: list[tuple[str, str, str]] = []
    with pytest.raises(Failed) as info:
        reconcile(ctx, created, lambda *e: events.append(e))
    live = kube.get("predictionpipelines", "default", obj["metadata"]["name"])
    conditions = {c["type"]: c for c in live["status"]["conditions"]}
    return info.value, conditions, events


@pytest.mark.parametrize(
    ("obj", "field", "reason"),
    [
        (
            pipeline_object(None, **POPEN),
            "spec.stages[0].model.entrypoint",
            "'subprocess' is a standard-library module",
        ),
        (
            pipeline_object(runtime="onnx", entrypoint=None, uri="../../../etc/hostname"),
            "spec.stages[0].model.uri",
            "contains '..'",
        ),
        (
            pipeline_object({"sloline.dev/model-dir": "../../etc"}),
            "metadata.annotations[sloline.dev/model-dir]",
            "contains '..'",
        ),
        (
            pipeline_object({"sloline.dev/model-dir": "/etc"}),
            "metadata.annotations[sloline.dev/model-dir]",
            "is not under the operator's models root /models",
        ),
    ],
)
def test_the_operator_reports_escaping_specs_as_invalid(
    cluster: tuple[KubeEmulator, OperatorContext], obj: dict[str, Any], field: str, reason: str
) -> None:
    kube, ctx = cluster
    if obj["spec"]["stages"][0]["model"].get("entrypoint") is None:
        obj["spec"]["stages"][0]["model"].pop("entrypoint", None)
    error, conditions, events = reconcile_once(kube, ctx, obj)
    assert error.reason == "InvalidSpec"
    valid = conditions["Valid"]
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert f"{field}: " in valid["message"] and reason in valid["message"], valid["message"]
    assert [(t, r) for t, r, _ in events] == [("Warning", "InvalidSpec")]
    for kind in ("jobs", "deployments", "configmaps"):
        assert kube.list(kind, "default") == [], kind


def test_the_annotation_under_the_root_is_used() -> None:
    settings = parse_settings({"models": {"root": "/models"}})
    for given, expected in (("shared/d", "/models/shared/d"), ("/models/x", "/models/x")):
        target = Target.of(pipeline_object({"sloline.dev/model-dir": given}))
        assert target.model_dir(settings) == expected
    with pytest.raises(ValueError, match=r"sloline\.dev/model-dir"):
        Target.of(pipeline_object({"sloline.dev/model-dir": "/etc"})).model_dir(settings)


def test_an_unexpected_error_is_reported_once_not_raised(
    cluster: tuple[KubeEmulator, OperatorContext],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Anything reconcile did not foresee ends that object's reconcile as `Failed`
    (kopf: permanent until the object changes), with the reason in the status and an
    event, and its traceback logged once at ERROR."""
    kube, ctx = cluster

    def broken(*_: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("sloline.operator.reconcile.profile_tasks", broken)
    with caplog.at_level(logging.ERROR, logger="sloline.operator.reconcile"):
        error, conditions, events = reconcile_once(kube, ctx, pipeline_object())
    assert error.reason == "InternalError"
    assert conditions["Ready"]["reason"] == "InternalError"
    assert "RecursionError: maximum recursion depth exceeded" in conditions["Ready"]["message"]
    assert kube.get("predictionpipelines", "default", "noop")["status"]["phase"] == "Failed"
    assert [(t, r) for t, r, _ in events] == [("Warning", "InternalError")]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None


def test_an_unexpected_error_in_validation_is_an_invalid_spec(
    cluster: tuple[KubeEmulator, OperatorContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube, ctx = cluster

    def broken(*_: object) -> None:
        raise MemoryError

    monkeypatch.setattr("sloline.operator.planning.operator_issues", broken)
    error, conditions, _ = reconcile_once(kube, ctx, pipeline_object())
    assert error.reason == "InvalidSpec"
    assert "validation failed: MemoryError" in conditions["Valid"]["message"]


def test_minus_signs_in_a_condition_do_not_wedge_the_operator(
    cluster: tuple[KubeEmulator, OperatorContext],
) -> None:
    kube, ctx = cluster
    obj = pipeline_object()
    obj["spec"]["stages"][1]["when"] = "-" * 1000 + "1 > 0"
    error, conditions, _ = reconcile_once(kube, ctx, obj)
    assert error.reason == "InvalidSpec"
    assert "spec.stages[1].when: " in conditions["Valid"]["message"]
    assert "the limit is 32" in conditions["Valid"]["message"]


def test_copy_of_the_noop_folder_is_valid(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fixture itself passes, so every rejection above is the attack's doing."""
    code, err = validate(folder / "pipeline.yaml", capsys)
    assert code == 0, err
    shutil.rmtree(folder)


# ------------------------------------------------------------------ admission (CRD rules)


@pytest.mark.parametrize(
    ("where", "uri", "message"),
    [
        ("stage", "../../../etc/hostname", ".spec.stages[2]: model.uri must be a path relative"),
        ("stage", "/etc/hostname", ".spec.stages[2]: model.uri must be a path relative"),
        ("stage", "models/..", ".spec.stages[2]: model.uri must be a path relative"),
        ("samples", "a/../../b.npz", ".spec.samples: samples.uri must be a path relative"),
        ("trace", "/etc/passwd", ".spec.workload: traceUri must be a path relative"),
    ],
)
def test_the_crd_rejects_escaping_paths_at_admission(where: str, uri: str, message: str) -> None:
    from tests.unit.spec.test_crd_validation import failed_rules, schema_errors

    doc = yaml.safe_load(NOOP.read_text())
    assert failed_rules(doc) == []
    if where == "stage":
        doc["spec"]["stages"][2]["model"] = {"runtime": "onnx", "uri": uri}
    elif where == "samples":
        doc["spec"]["samples"] = {"uri": uri}
    else:
        doc["spec"]["workload"] = {"traceUri": uri}
    assert schema_errors(doc) == []
    (failed,) = failed_rules(doc)
    assert failed.startswith(message), failed
    doc_ok = yaml.safe_load(NOOP.read_text())
    doc_ok["spec"]["stages"][2]["model"] = {"runtime": "onnx", "uri": "models/a..b.onnx"}
    assert failed_rules(doc_ok) == []
