"""The `sloline` command as a user runs it: exit codes, messages, shutdown, no orphans."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import psutil

from tests.integration.test_examples_served import wait_ready
from tests.support.net import free_port
from tests.support.serve import NOOP


def sloline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sloline", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_validate_ok_and_invalid_files(tmp_path: Path) -> None:
    ok = sloline("validate", str(NOOP))
    assert ok.returncode == 0 and "  s1 -> s2\n  s2 -> s3" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        NOOP.read_text().replace("from: s1.x", "from: s9.x").replace("output: s3", "output: nope")
    )
    result = sloline("validate", str(bad))
    assert result.returncode == 2
    assert "spec.stages[1].inputs[0].from" in result.stderr
    assert "spec.output: no stage named 'nope'" in result.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    result = sloline("validate", str(broken))
    assert result.returncode == 2 and "not valid YAML" in result.stderr
    missing = sloline("validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_run_rejects_bad_flags_with_exit_2() -> None:
    result = sloline("run", str(NOOP), "--replicas", "ghost=2")
    assert result.returncode == 2 and "--replicas: no stage named 'ghost'" in result.stderr
    result = sloline("run", str(NOOP), "--max-batch", "s1=zero")
    assert result.returncode == 2 and "not a valid int" in result.stderr
    result = sloline("run", str(NOOP), "--worker-nice", "-1")
    assert result.returncode == 2 and "--worker-nice: must be 0-19, got -1" in result.stderr
    result = sloline("run", str(NOOP), "--replan", "--no-tuner")
    assert (
        result.returncode == 2 and "--replan: cannot be combined with --no-tuner" in result.stderr
    )
    result = sloline("run", str(NOOP), "--replan", "0")
    assert result.returncode == 2 and "--replan: the interval must be > 0 seconds" in result.stderr


def test_calibration_flags_are_checked_before_anything_is_profiled(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.json")
    for command in ("run", "plan"):
        result = sloline(command, str(NOOP), "--calibration", missing)
        assert result.returncode == 2, result.stderr
        assert f"--calibration: {missing}: not a sloline calibration" in result.stderr
        assert "[1/" not in result.stderr  # no profiling progress
    other = tmp_path / "other.json"
    other.write_text(
        '{"format": 1, "pipeline": "other", "durationSeconds": 1, "requests": 1, '
        '"stages": {}, "hopSeconds": []}'
    )
    result = sloline("plan", str(NOOP), "--calibration", str(other))
    assert result.returncode == 2 and "calibrates pipeline 'other', not 'noop'" in result.stderr
    result = sloline("run", str(NOOP), "--no-plan", "--calibration-out", str(other))
    assert result.returncode == 2 and "--calibration-out: compares serving" in result.stderr
    result = sloline("calibrate", str(NOOP), "--duration", "0")
    assert result.returncode == 2 and "--duration: must be > 0 seconds" in result.stderr
    result = sloline("calibrate", str(NOOP), "--rounds", "0")
    assert result.returncode == 2 and "--rounds: must be at least 1, got 0" in result.stderr
    result = sloline("calibrate", str(NOOP), "-o", str(tmp_path / "no" / "c.json"))
    assert result.returncode == 2 and "--out:" in result.stderr
    assert "no such directory" in result.stderr


def test_calibrate_serves_the_plan_on_the_catalog_it_was_made_with(tmp_path: Path) -> None:
    """A plan on a class only the user's catalog has (as a GPU class is) is served on
    that catalog, not rejected as unknown by the default one."""
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("classes:\n  - {name: solo, costPerHour: 0.05, embedded: {threads: 1}}\n")
    result = subprocess.run(
        [sys.executable, "-m", "sloline", "calibrate", str(NOOP), "--catalog", str(catalog),
         "--cache-dir", str(tmp_path / "profiles"), "--duration", "2",
         "-o", str(tmp_path / "c.json")],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^s1 +solo ", result.stdout, re.MULTILINE), result.stdout
    assert "measured: P99" in result.stdout and (tmp_path / "c.json").is_file()


def test_missing_model_file_says_how_to_build(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "pipeline.yaml").write_text(
        NOOP.read_text().replace(
            '{runtime: python, entrypoint: "noop_stages:identity"}',
            "{runtime: onnx, uri: models/m.onnx}",
            1,
        )
    )
    (folder / "build.py").write_text("")
    result = sloline("run", str(folder / "pipeline.yaml"), "--no-plan")
    assert result.returncode == 2
    assert "models/m.onnx does not exist; build it with: python" in result.stderr


def _one_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit 2 and ``message`` as the one error line on stderr, without a traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if "error:" in line] == [lines[-1]]
    assert re.fullmatch(message, lines[-1]), lines[-1]


def test_user_mistakes_are_one_error_line_and_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(NOOP.parent, broken)
    pipeline = broken / NOOP.name
    pipeline.write_text(pipeline.read_text().replace("noop_stages:identity", "noop_stages:nope", 1))
    _one_error(
        sloline("profile", str(pipeline), "--cache-dir", str(tmp_path / "profiles")),
        r"error: stage 's1': module 'noop_stages' .* has no attribute 'nope'; .*",
    )
    _one_error(
        sloline("run", str(NOOP), "--no-plan", "--queue-capacity", "0"),
        r"error: max_batch and capacity must be at least 1",
    )
    (tmp_path / "file").write_text("")
    logs = tmp_path / "file" / "logs"
    _one_error(
        sloline("run", str(NOOP), "--no-plan", "--log-dir", str(logs)),
        rf"error: \[Errno 20\] Not a directory: '{re.escape(str(logs))}'",
    )
    _one_error(
        sloline("run", str(NOOP), "--port", "70000"),
        r"sloline run: error: argument --port: invalid port value: '70000'",
    )
    _one_error(
        sloline("router", "--pipeline", str(NOOP), "--insecure-workers", "--worker-port", "-1"),
        r"sloline router: error: argument --worker-port: invalid port value: '-1'",
    )
    result = sloline("plan", str(NOOP), "--profile-hardware", "cpu-1,tpu")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--profile-hardware: ['tpu'] not in the catalog" in result.stderr


def _run(port: int, grpc_port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sloline",
            "run",
            str(NOOP),
            "--port",
            str(port),
            "--grpc-port",
            str(grpc_port),
            "--replicas",
            "s2=2",
            "--status-interval",
            "0.5",
            "--no-plan",
            "--routers",  # the default depends on the cores; this counts processes
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _workers(parent: int) -> list[psutil.Process]:
    return psutil.Process(parent).children(recursive=True)


def _gone(pids: list[int], timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            for p in pids
        ):
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_and_parent_crash_leave_no_workers() -> None:
    http_port, grpc_port = free_port(), free_port()
    process = _run(http_port, grpc_port)
    wait_ready(f"127.0.0.1:{http_port}", process)
    pids = [p.pid for p in _workers(process.pid)]
    assert len(pids) == 4
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=30)[0]
    assert process.returncode == 0, output
    assert "stopping: draining" in output and "s2" in output
    assert _gone(pids)

    http_port, grpc_port = free_port(), free_port()
    process = _run(http_port, grpc_port)
    wait_ready(f"127.0.0.1:{http_port}", process)
    pids = [p.pid for p in _workers(process.pid)]
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=10)
    assert _gone(pids), "workers outlived a crashed parent"


def test_log_settings_are_checked() -> None:
    result = sloline("run", str(NOOP), "--access-log-sample", "2")
    assert result.returncode == 2
    assert result.stderr == "error: access log sample 2.0 is not a fraction in [0, 1]\n"
    result = sloline("run", str(NOOP), "--log-format", "xml")
    assert result.returncode == 2 and "invalid choice: 'xml'" in result.stderr
    env = {**os.environ, "SLOLINE_LOG_FORMAT": "yaml"}
    result = subprocess.run(
        [sys.executable, "-m", "sloline", "validate", str(NOOP)],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == "error: log format 'yaml' is not one of text, json\n"


def test_json_log_line_carries_the_request_id_the_response_returns() -> None:
    http_port, grpc_port = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sloline", "run", str(NOOP), "--port", str(http_port),
         "--grpc-port", str(grpc_port), "--no-plan", "--log-format", "json",
         "--access-log-sample", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_ready(f"127.0.0.1:{http_port}", process)
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
        url = f"http://127.0.0.1:{http_port}/v2/models/noop/infer"
        response = httpx.post(url, json=body, headers={"x-request-id": "cli-1"}, timeout=10)
        assert response.status_code == 200, response.text
        assert response.headers["x-request-id"] == "cli-1"
        response = httpx.post(url, json=body, timeout=10)
        made = response.headers["x-request-id"]
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=30)[0]
    lines = [orjson.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines), output
    access = [line for line in lines if line["logger"] == "sloline.access"]
    assert [(a["request_id"], a["model"], a["status"]) for a in access] == [
        ("cli-1", "noop", 200),
        (made, "noop", 200),
    ]
