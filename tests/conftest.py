"""Fixtures shared across the test tree."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sloline.measure.session import PlanningSession
    from tests.support.kube import KubeEmulator


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeEmulator]:
    """A fresh Kubernetes API emulator (tests/support/kube) with namespace `default`; its
    kubeconfig is `kube.kubeconfig_path`. Teardown fails the test if the emulator itself
    failed a request (a bug there, not an API error)."""
    from tests.support.kube import KubeEmulator  # only the tests that use it pay the import

    with KubeEmulator(tmp_path / "kube") as emulator:
        yield emulator


@pytest.fixture(scope="session")
def sleepy_session(tmp_path_factory: pytest.TempPathFactory) -> PlanningSession:
    """The sleepy test pipeline profiled (batch sizes up to 4; ~45 s here) and planned
    once for the live tuner, Prometheus and dashboard tests, as `sloline run` reuses its
    profile cache: they test what is served from a plan, not the profiler."""
    from sloline.measure.profiler import ProfilerSettings
    from sloline.measure.session import plan_pipeline
    from sloline.spec import DEFAULT_CATALOG, load_pipeline
    from tests.support.serve import SLEEPY

    cache = tmp_path_factory.mktemp("sleepy-profiles")
    return plan_pipeline(
        load_pipeline(SLEEPY), DEFAULT_CATALOG, ProfilerSettings(max_batch_cap=4, cache_dir=cache)
    )


@pytest.fixture(autouse=True)
def _unthrottled_logs() -> Iterator[None]:
    """`sloline.cli.main` throttles the loggers a client can trigger, for the whole
    process; a test that calls it in-process must not hide log lines from the next."""
    import logging

    from sloline.serving.logthrottle import STRANGER_LOGGERS, Throttle

    yield
    for name in STRANGER_LOGGERS:
        logger = logging.getLogger(name)
        logger.filters = [f for f in logger.filters if not isinstance(f, Throttle)]
