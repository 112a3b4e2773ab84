"""Tracing is optional: without OpenTelemetry installed sloline serves, and asking for
tracing is one clear error line."""

from __future__ import annotations

import subprocess
import sys

from tests.support.serve import NOOP

# OpenTelemetry made unimportable, as when the `otel` extra is not installed.
BLOCK = "import sys; sys.modules['opentelemetry'] = None; "


def _python(code: str, *env: str, block: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", (BLOCK if block else "import sys; ") + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**dict(e.split("=", 1) for e in env), **_base_env()},
    )


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def test_serving_imports_no_opentelemetry() -> None:
    code = (
        "import sloline.cli.serve, sloline.serving.http, sloline.serving.grpc_frontdoor, "
        "sloline.serving.router, sloline.serving.tracing as t; "
        "t.configure(None); assert t.tracer is None; "
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]; "
        "assert sys.modules.get('opentelemetry', 0) is None or not loaded, loaded"
    )
    for block in (True, False):  # not installed; installed but tracing off
        result = _python(code, block=block)
        assert result.returncode == 0, result.stderr


def test_tracing_without_the_extra_is_one_error_line() -> None:
    run = f"from sloline.cli import main; sys.exit(main(['run', {str(NOOP)!r}, '--no-plan', "
    result = _python(run + "'--otlp-endpoint', 'http://127.0.0.1:4317']))")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: tracing to http://127.0.0.1:4317 needs OpenTelemetry: pip install 'sloline[otel]'"
    )
    assert len(result.stderr.splitlines()) == 1
    result = _python(run + "]))", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318")
    assert result.returncode == 2 and "tracing to http://127.0.0.1:4318" in result.stderr
