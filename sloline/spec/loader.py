"""Reading pipeline files: YAML text -> validated `PredictionPipeline` + its DAG.

Pydantic's errors and the DAG checks are merged into one `PipelineError` whose issues
carry wire-format field paths (`spec.stages[1].model.runtime`), so every entry point
(CLI, router, operator) reports problems the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sloline.spec.models import PredictionPipeline
from sloline.spec.validate import Issue, PipelineError, PipelineGraph, build_graph


@dataclass(frozen=True, slots=True)
class LoadedPipeline:
    """A validated pipeline and the directory its relative paths are resolved against."""

    graph: PipelineGraph
    file: Path  # absolute path of the pipeline file (workers load it too)

    @property
    def base_dir(self) -> Path:
        return self.file.parent

    @property
    def pipeline(self) -> PredictionPipeline:
        return self.graph.pipeline

    @property
    def name(self) -> str:
        return self.graph.name

    def resolve(self, uri: str) -> Path:
        path = Path(uri)
        return path if path.is_absolute() else self.base_dir / path


def parse_pipeline(data: Any, source: str = "pipeline") -> PipelineGraph:
    """Validate a decoded document (dict) and return its graph, or raise `PipelineError`."""
    if not isinstance(data, dict):
        raise PipelineError([Issue("(document)", "expected a mapping at the top level")], source)
    try:
        pipeline = PredictionPipeline.model_validate(data)
    except ValidationError as exc:
        raise PipelineError([_issue(e) for e in exc.errors()], source) from None
    try:
        return build_graph(pipeline)
    except PipelineError as exc:
        raise PipelineError(exc.issues, source) from None


def load_pipeline(path: str | Path) -> LoadedPipeline:
    """Read and validate a pipeline YAML file."""
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
    return LoadedPipeline(parse_pipeline(data, source), file.resolve())


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
