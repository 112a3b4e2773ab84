"""The worker's probe endpoint: /live always, /ready only when loaded, connected and not
stopping; it answers while the worker's own loop is busy (it has its own thread)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from sloline.model_server.health import HealthServer, HealthState


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), r.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


def test_ready_follows_loaded_connected_and_stopping() -> None:
    state = HealthState()
    server = HealthServer(state, "127.0.0.1", 0)
    server.start()
    try:
        assert get(server.port, "/live") == (200, "live")
        assert get(server.port, "/ready") == (503, "loading the model")
        state.loaded = True
        assert get(server.port, "/ready") == (503, "not connected to the router")
        state.connected = True
        assert get(server.port, "/ready") == (200, "ready")
        state.connected = False
        assert get(server.port, "/ready")[0] == 503
        state.connected = True
        state.stopping = True
        assert get(server.port, "/ready") == (503, "stopping")
        assert get(server.port, "/live") == (200, "live")
        assert get(server.port, "/metrics")[0] == 404
    finally:
        server.stop()


def test_a_taken_port_is_reported_with_the_address() -> None:
    first = HealthServer(HealthState(), "127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match=f"127.0.0.1:{first.port}"):
            HealthServer(HealthState(), "127.0.0.1", first.port)
    finally:
        first.stop()
