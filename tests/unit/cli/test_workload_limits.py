"""`sloline validate` and `sloline plan` on workloads the planner cannot plan for: exit 2
with the field and the reason, never a traceback, before anything is profiled."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from sloline.cli import main
from tests.unit.cli.test_parser import NOOP
from tests.unit.spec.test_validate import BAD_WORKLOADS


def pipeline_with(tmp_path: Path, workload: dict[str, Any]) -> Path:
    """The no-op pipeline (and its stages' module) with ``workload`` as its spec.workload."""
    shutil.copytree(NOOP.parent, tmp_path, dirs_exist_ok=True)
    doc = yaml.safe_load(NOOP.read_text())
    doc["spec"]["workload"] = workload
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("command", ["validate", "plan"])
@pytest.mark.parametrize(("workload", "path", "reason"), BAD_WORKLOADS)
def test_an_unplannable_workload_exits_2_with_the_reason(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    workload: dict[str, Any],
    path: str,
    reason: str,
) -> None:
    assert main([command, str(pipeline_with(tmp_path, workload))]) == 2
    out, err = capsys.readouterr()
    assert f"  - {path}: " in err and reason in err, err
    assert "Traceback" not in err and "ok:" not in out
