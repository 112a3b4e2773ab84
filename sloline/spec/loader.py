"""Reading pipeline files: YAML text -> validated `PredictionPipeline` + its DAG.

Pydantic's errors and the DAG checks are merged into one `PipelineError` whose issues
carry wire-format field paths (`spec.stages[1].model.runtime`), so every entry point
(CLI, router, operator) reports problems the same way.

Paths in a pipeline (model URIs, the samples URI, the workload's trace URI) and Python
entrypoint modules resolve against one *model directory*, and must stay inside it
(`paths.py`; `LoadedPipeline.check_files` checks the files): the pipeline file's own
directory, or `$SLOLINE_MODEL_DIR` when set. On Kubernetes the pipeline file is mounted
from a ConfigMap (`/etc/sloline`) while the models live on a volume, so every pod sets
the variable (docs/kubernetes.md); this module is the only place that reads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sloline.spec.models import PredictionPipeline
from sloline.spec.paths import PathEscape, locate_module, resolve_inside, spec_files
from sloline.spec.validate import (
    Issue,
    PipelineError,
    PipelineGraph,
    build_graph,
    reference_issues,
)

MODEL_DIR_ENV = "SLOLINE_MODEL_DIR"


@dataclass(frozen=True, slots=True)
class LoadedPipeline:
    """A validated pipeline and the directory its relative paths are resolved against."""

    graph: PipelineGraph
    file: Path  # absolute path of the pipeline file (workers load it too)
    model_dir: Path | None = None  # base of relative paths; None: the file's directory

    @property
    def base_dir(self) -> Path:
        """Where relative model/sample/trace URIs and Python entrypoint modules live."""
        return self.model_dir or self.file.parent

    @property
    def pipeline(self) -> PredictionPipeline:
        return self.graph.pipeline

    @property
    def name(self) -> str:
        return self.graph.name

    def resolve(self, uri: str, field: str = "uri") -> Path:
        """`uri` in the model directory, symlinks resolved; raises `PipelineError` naming
        `field` when it leads outside (`sloline.spec.paths`)."""
        try:
            return resolve_inside(self.base_dir, uri)
        except PathEscape as exc:
            raise PipelineError([Issue(field, str(exc))], self.name) from None

    def check_files(self) -> list[Issue]:
        """Every path and entrypoint of the spec checked against the model directory's
        files: paths must stay inside it after symlinks (they need not exist yet: models
        may still have to be built), entrypoint modules must be files inside it."""
        issues = []
        for path, kind, value in spec_files(self.pipeline):
            try:
                if kind == "uri":
                    resolve_inside(self.base_dir, value)
                else:
                    locate_module(self.base_dir, value.partition(":")[0])
            except PathEscape as exc:
                issues.append(Issue(path, str(exc)))
        return issues


def parse_pipeline(data: Any, source: str = "pipeline") -> PipelineGraph:
    """Validate a decoded document (dict) and return its graph, or raise `PipelineError`."""
    if not isinstance(data, dict):
        raise PipelineError([Issue("(document)", "expected a mapping at the top level")], source)
    try:
        pipeline = PredictionPipeline.model_validate(data)
    except ValidationError as exc:
        issues = [_issue(e) for e in exc.errors()]
        seen = {issue.path for issue in issues}  # a reference check of a mistyped field
        issues += [i for i in reference_issues(data) if i.path not in seen]
        raise PipelineError(issues, source) from None
    try:
        return build_graph(pipeline)
    except PipelineError as exc:
        raise PipelineError(exc.issues, source) from None


def load_pipeline(
    path: str | Path,
    *,
    model_dir: str | Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> LoadedPipeline:
    """Read and validate a pipeline YAML file.

    Relative paths resolve against `model_dir`, else `environ["SLOLINE_MODEL_DIR"]` when
    set and non-empty, else the file's directory.
    """
    file = Path(path)
    source = str(file)
    try:
        text = file.read_text()
    except OSError as exc:
        raise PipelineError([Issue("(file)", f"cannot read: {exc.strerror}")], source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        reason = getattr(exc, "problem", None) or str(exc)
        raise PipelineError([Issue(where, f"not valid YAML: {reason}")], source) from None
    base = model_dir or environ.get(MODEL_DIR_ENV) or None
    return LoadedPipeline(
        parse_pipeline(data, source), file.resolve(), Path(base).resolve() if base else None
    )


def _issue(error: Any) -> Issue:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    reason = error["msg"]
    if error["type"] == "extra_forbidden":
        reason = "unknown field"
    elif error["type"] == "literal_error":
        reason = f"{error['msg']} (got {error['input']!r})"
    return Issue(path or "(document)", reason)
