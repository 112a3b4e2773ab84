"""`sloline simulate`, the lab's command plugin, run through `sloline.cli.main`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from sloline.cli import main
from sloline.lab import cli as lab_cli
from sloline.lab.synthetic import random_problem
from sloline.planner.planner import plan
from tests.unit.cli.test_parser import SIMULATE, plugins


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab plugin installed, and a small synthetic pipeline's plan in place of the
    pipeline file's (profiling and planning are the other commands' tests)."""
    problem = random_problem(5, duration_s=20.0, rate_rps=40.0)
    problem = dataclasses.replace(problem, slo_s=problem.slo_s * 1.5)
    session = SimpleNamespace(problem=problem, plan=plan(problem))
    plugins(monkeypatch, SIMULATE)
    monkeypatch.setattr(lab_cli, "load_pipeline", lambda file: file)
    monkeypatch.setattr(lab_cli, "plan_session", lambda *_: session)


@pytest.mark.usefixtures("planned")
def test_simulate_compares_policies_on_a_trace_family(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "p.yaml", "--trace", "spike", "--scale", "0.1", "--policies", "plan,hpa"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| spike | plan |" in out and "| spike | hpa |" in out


@pytest.mark.usefixtures("planned")
def test_simulate_rejects_a_trace_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "p.yaml", "--trace", str(tmp_path / "absent.txt")]) == 2
    err = capsys.readouterr().err
    assert "--trace: " in err and "absent.txt" in err and "Traceback" not in err
