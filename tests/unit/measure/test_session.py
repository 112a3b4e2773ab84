"""The planning trace of a pipeline whose workload is a trace file (`traceUri`): read at
plan time and held to the inline trace's rules, with the same reasons."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sloline.measure.session import planning_trace
from sloline.spec import PipelineError, load_pipeline
from tests.unit.cli.test_workload_limits import pipeline_with
from tests.unit.spec.test_validate import BAD_WORKLOADS

BAD_TRACES = [(w["trace"], reason) for w, _, reason in BAD_WORKLOADS if "trace" in w]


def trace_file_pipeline(tmp_path: Path, text: str) -> Path:
    (tmp_path / "trace.txt").write_text(text)
    return pipeline_with(tmp_path, {"traceUri": "trace.txt"})


def test_a_trace_file_is_read_at_plan_time(tmp_path: Path) -> None:
    text = "# arrival times (s)\n10.0\n10.5\n\n12.0  # the last one\n"
    loaded = load_pipeline(trace_file_pipeline(tmp_path, text))
    np.testing.assert_array_equal(planning_trace(loaded), [0.0, 0.5, 2.0])


@pytest.mark.parametrize(("times", "reason"), BAD_TRACES)
def test_a_trace_file_follows_the_inline_traces_rules(
    tmp_path: Path, times: list[float], reason: str
) -> None:
    text = "".join(f"{t!r}\n" for t in times)
    loaded = load_pipeline(trace_file_pipeline(tmp_path, text))  # valid until read
    with pytest.raises(PipelineError) as info:
        planning_trace(loaded)
    [issue] = info.value.issues
    assert issue.path == "spec.workload.traceUri"
    assert issue.reason.startswith(f"{tmp_path / 'trace.txt'}: ") and reason in issue.reason


@pytest.mark.parametrize("text", ["0.0\nsoon\n", "0.0 1.0\n2.0\n", "0.0 1.0\n2.0 3.0\n"])
def test_a_trace_file_that_is_not_one_number_per_line_cannot_be_read(
    tmp_path: Path, text: str
) -> None:
    loaded = load_pipeline(trace_file_pipeline(tmp_path, text))
    with pytest.raises(PipelineError, match=r"spec.workload.traceUri: cannot read .*trace.txt"):
        planning_trace(loaded)
