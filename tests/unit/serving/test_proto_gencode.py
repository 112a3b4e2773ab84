"""The generated protobuf / gRPC code loads on every runtime pyproject.toml allows.

protobuf's gencode refuses a runtime older than itself (`VersionError` at import), and
grpc's refuses a grpcio older than its grpcio-tools. So the gencode version recorded in each
generated module must not exceed the oldest protobuf (and grpcio) the project declares.
"""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
PB2 = ["worker_pb2", "grpc_service_pb2"]
PB2_GRPC = ["worker_pb2_grpc", "grpc_service_pb2_grpc"]


def _lower_bound(name: str) -> Version:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == name]
    (low,) = [Version(s.version) for s in req.specifier if s.operator == ">="]
    return low


def _gencode(module: str) -> Version:
    mod = importlib.import_module(f"sloline.serving.proto.{module}")
    call = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
        r"\s*(\d+),\s*(\d+),\s*(\d+),",
        inspect.getsource(mod),
    )
    assert call is not None, f"{module} carries no gencode version check"
    return Version(".".join(call.groups()))


@pytest.mark.parametrize("module", PB2)
def test_protobuf_gencode_is_not_newer_than_the_oldest_runtime_allowed(module: str) -> None:
    gencode = _gencode(module)
    assert gencode <= _lower_bound("protobuf"), (
        f"{module} is protobuf {gencode} gencode, newer than the oldest runtime allowed "
        f"({_lower_bound('protobuf')}): regenerate with an older grpcio-tools"
    )


@pytest.mark.parametrize("module", PB2_GRPC)
def test_grpc_gencode_is_not_newer_than_the_oldest_grpcio_allowed(module: str) -> None:
    mod = importlib.import_module(f"sloline.serving.proto.{module}")
    assert Version(mod.GRPC_GENERATED_VERSION) <= _lower_bound("grpcio")


@pytest.mark.parametrize("module", PB2)
def test_protobuf_gencode_loads_on_the_runtimes_tritonclient_allows(module: str) -> None:
    # The dev extra installs the newest tritonclient; its gRPC client caps protobuf. Every
    # runtime it allows must load sloline's code, so the gencode must be inside its range.
    (spec,) = [
        Requirement(r).specifier
        for r in requires("tritonclient") or []
        if Requirement(r).name == "protobuf" and "grpc" in str(Requirement(r).marker)
    ]
    floor = min(Version(s.version) for s in spec if s.operator == ">=")
    gencode = _gencode(module)
    assert gencode <= floor and gencode in spec, (
        f"{module} is protobuf {gencode} gencode; tritonclient allows protobuf {spec}"
    )
