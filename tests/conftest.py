"""Fixtures shared across the test tree."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.kube import KubeEmulator


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeEmulator]:
    """A fresh Kubernetes API emulator (tests/support/kube) with namespace `default`; its
    kubeconfig is `kube.kubeconfig_path`. Teardown fails the test if the emulator itself
    failed a request (a bug there, not an API error)."""
    from tests.support.kube import KubeEmulator  # only the tests that use it pay the import

    with KubeEmulator(tmp_path / "kube") as emulator:
        yield emulator
