"""`sloline simulate`, the lab's command plugin, run through `sloline.cli.main`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from sloline.cli import main
from sloline.common.trace import gamma_arrivals, mean_rate_rps
from sloline.lab import cli as lab_cli
from sloline.lab import simulate as lab_simulate
from sloline.lab.simulate import simulate
from sloline.lab.synthetic import random_problem
from sloline.lab.traces import Trace, standard_traces
from sloline.planner.estimator import Workload, estimate
from sloline.planner.overhead import ServingOverhead
from sloline.planner.plan import Plan
from sloline.planner.planner import plan
from sloline.planner.problem import PlanningProblem
from sloline.planner.workload import parse_arrival_times
from tests.unit.cli.test_parser import SIMULATE, plugins
from tests.unit.measure.test_session import BAD_TRACES


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


def write_trace(path: Path, rate_rps: float, duration_s: float) -> Path:
    """A trace file: a comment, then one arrival time per line (seconds, any origin)."""
    times = 1000.0 + gamma_arrivals(rate_rps, duration_s, seed=7)
    path.write_text("# recorded arrivals (s)\n" + "".join(f"{t:.6f}\n" for t in times))
    return path


@pytest.mark.usefixtures("planned")
def test_simulate_a_trace_file_from_a_plan_for_its_planning_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pipeline's workload is 40 rps; the file's is 100 rps: the plan every policy
    starts from is made for the file's first 25 % (InferLine §6), not for the workload."""
    path = write_trace(tmp_path / "recorded.txt", 100.0, 16.0)
    started: list[Plan] = []

    def recording(problem: PlanningProblem, traces: Any, *, plan: Plan, **kw: Any) -> Any:
        started.append(plan)
        return simulate(problem, traces, plan=plan, **kw)

    monkeypatch.setattr(lab_simulate, "simulate", recording)
    argv = ["simulate", "p.yaml", "--trace", str(path), "--policies", "plan,inferline"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| recorded | plan |" in out and "| recorded | inferline |" in out
    sample = Trace.from_timestamps("recorded", parse_arrival_times(path.read_text())).planning_s
    [start] = started
    assert start.rate_rps == pytest.approx(mean_rate_rps(sample))
    assert start.rate_rps > 80.0
    problem = random_problem(5, duration_s=20.0, rate_rps=40.0)
    problem = dataclasses.replace(problem, slo_s=problem.slo_s * 1.5, arrivals_s=sample)
    assert start.config == plan(problem).config
    assert f"at {start.rate_rps:.1f} rps (planning trace)" in out  # the plan's table


@pytest.mark.usefixtures("planned")
def test_simulate_a_trace_family_and_a_file_in_one_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_trace(tmp_path / "recorded.txt", 40.0, 16.0)
    argv = ["simulate", "p.yaml", "--trace", "spike", "--trace", str(path), "--scale", "0.1"]
    assert main([*argv, "--policies", "plan"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[:2] for row in rows[1:]] == [
        ["| spike", "plan"],
        ["| recorded", "plan"],
    ]


@pytest.mark.usefixtures("planned")
@pytest.mark.parametrize(("times", "reason"), BAD_TRACES)
def test_simulate_rejects_a_trace_file_the_planner_cannot_plan_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], times: list[float], reason: str
) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("".join(f"{t!r}\n" for t in times))
    assert main(["simulate", "p.yaml", "--trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--trace: {path}: " in err and reason in err and "Traceback" not in err


@pytest.mark.usefixtures("planned")
def test_simulate_json_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "p.yaml", "--trace", "spike", "--scale", "0.1", "--policies", "plan"]
    assert main([*argv, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (row,) = report["results"]
    assert row["trace"] == "spike" and row["policy"] == "plan" and 0 <= row["attainment"] <= 1


def test_simulate_pays_the_measured_serving_overhead_as_the_estimator_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan held through `sloline simulate` has the estimator's P99 on the same trace,
    with a measured router and without one, and a busier router raises both."""
    problem = random_problem(5, duration_s=20.0, rate_rps=40.0)
    problem = dataclasses.replace(problem, slo_s=problem.slo_s * 1.5)
    started = plan(problem)
    plugins(monkeypatch, SIMULATE)
    monkeypatch.setattr(lab_cli, "load_pipeline", lambda file: file)
    (spike,) = [t for t in standard_traces(started.rate_rps, scale=0.1) if t.name == "spike"]
    tails = []
    for router_cpu_s in (None, 0.001, 0.004):
        overhead = None
        if router_cpu_s is not None:
            overhead = ServingOverhead(router_cpu_s, 0.0002, 0.0001, 0.0001, (0.0004,), (0.0003,))
        chosen = dataclasses.replace(
            problem, profile=dataclasses.replace(problem.profile, overhead=overhead)
        )
        session = SimpleNamespace(problem=chosen, plan=started)
        monkeypatch.setattr(lab_cli, "plan_session", lambda *_, s=session: s)
        argv = ["simulate", "p.yaml", "--trace", "spike", "--scale", "0.1", "--policies", "plan"]
        assert main([*argv, "-o", "json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)["results"]
        workload = Workload.build(
            chosen.topology, chosen.profile, spike.arrivals_s, seed=chosen.seed
        )
        estimated = estimate(
            chosen.topology,
            chosen.profile,
            started.config,
            workload,
            service=chosen.service,
            seed=chosen.seed,
            routers=started.routers,
        )
        tail = np.percentile(estimated.latencies_s, chosen.percentile, method="inverted_cdf")
        p99_ms = float(tail) * 1e3
        assert row["tailMs"] == pytest.approx(p99_ms, rel=1e-9)
        tails.append(row["tailMs"])
    assert tails[0] < tails[1] < tails[2]
