"""`sloline profile-job` as a Kubernetes profiling Job runs it: the pipeline file in one
folder, the stages under SLOLINE_MODEL_DIR, the profile written to the termination log
in the compact format the operator decodes; an unwritable log path fails at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sloline.planner.profile_message import MAX_MESSAGE_BYTES, decode_message
from tests.support.serve import SLEEPY


def profile_job(tmp_path: Path, log: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "etc"
    config.mkdir(exist_ok=True)
    (config / "pipeline.yaml").write_text(SLEEPY.read_text())
    env = {
        **os.environ,
        "SLOLINE_MODEL_DIR": str(SLEEPY.parent),
        "SLOLINE_TERMINATION_LOG": str(log),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sloline",
            "profile-job",
            "--pipeline",
            str(config / "pipeline.yaml"),
            *flags,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_profile_job_writes_a_decodable_message(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    flags = ("--stage", "slow", "--hardware", "cpu-1", "--cap", "4", "--repeats", "3")
    done = profile_job(tmp_path, log, *flags, "--budget-s", "0.1", "--hop-requests", "0")
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    message = decode_message(text)
    assert (message.stage, message.hardware, message.hop_s) == ("slow", "cpu-1", None)
    assert message.profile.batch_sizes == (1, 2, 4)
    # The stage sleeps 20 ms per request.
    assert message.profile.latency_s(4) == pytest.approx(0.080, rel=0.5)
    assert message.visit_stages == ("parse", "slow")
    assert message.visits is not None and message.visits.shape == (16, 2)
    assert np.all(message.visits)


@pytest.mark.parametrize(
    ("flags", "code", "needle"),
    [
        (("--stage", "ghost", "--hardware", "cpu-1"), 2, "no stage 'ghost'"),
        (("--stage", "slow", "--hardware", "tpu"), 2, "'tpu' is not in the catalog"),
    ],
)
def test_profile_job_reports_bad_flags_in_the_log(
    tmp_path: Path, flags: tuple[str, ...], code: int, needle: str
) -> None:
    log = tmp_path / "termination-log"
    done = profile_job(tmp_path, log, *flags)
    assert done.returncode == code
    assert needle in done.stderr and needle in log.read_text()


def test_profile_job_fails_at_once_when_the_log_is_not_writable(tmp_path: Path) -> None:
    done = profile_job(
        tmp_path, tmp_path / "missing" / "log", "--stage", "slow", "--hardware", "cpu-1"
    )
    assert done.returncode == 1
    assert "SLOLINE_TERMINATION_LOG" in done.stderr and "missing/log" in done.stderr
