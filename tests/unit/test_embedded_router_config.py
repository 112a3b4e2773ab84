"""An extra router's config file (`sloline embedded-router --config`): what router 0
writes is what the router reads back, its statistics peers included, without the
worker token (which travels in the environment)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sloline.common.envelope import Envelope
from sloline.embedded import RouterConfig, read_router_config, write_router_config
from sloline.serving.auth import WORKER_TOKEN_ENV
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings


def test_a_router_config_reads_back_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ServerSettings(
        http_port=8000,
        metrics_port=9102,
        worker_token="secret",  # noqa: S106 (a test token)
        reuse_port=True,
        tls_cert=tmp_path / "c.pem",
        tls_key=tmp_path / "k.pem",
        auth_tokens=("t1", "t2"),
        stats_peers=("127.0.0.1:9101", "127.0.0.1:9103"),
    )
    config = RouterConfig(
        pipeline=tmp_path / "pipeline.yaml",
        server=server,
        router=RouterSettings(queue_capacity=7),
        max_batch={"s1": 4},
        plan_envelope=Envelope((0.1, 0.2), (50.0, 40.0)),
        lambda_windows_s=(5.0, 30.0),
    )
    path = tmp_path / "router-1.json"
    write_router_config(path, config)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "secret" not in path.read_text()
    monkeypatch.setenv(WORKER_TOKEN_ENV, "secret")
    assert read_router_config(path) == config
