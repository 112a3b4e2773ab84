"""The sloline-crds chart with the real helm and a real kube-apiserver: `helm upgrade`
updates the CRD, `helm uninstall` leaves it and the pipelines, and a CRD created outside
Helm (an earlier install's `crds/` or `kubectl apply`) is adopted with the commands of
docs/install.md ("Upgrading").

Runs on the real control plane of docs/e2e.md ("Real control plane"), skipped where its
binaries are not built, and needs helm in .tools/bin (scripts/fetch_helm.sh).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sloline.spec.crd import crd_manifest
from tests.support import control_plane
from tests.support.control_plane import kubectl, needs_control_plane

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "bin" / "helm"
CRD_CHART = ROOT / "helm" / "sloline-crds"
CRD_NAME = "predictionpipelines.sloline.dev"
RELEASE, SYSTEM = "sloline-crds", "sloline-system"
EXAMPLE = ROOT / "manifests" / "examples" / "digits-cascade.yaml"

pytestmark = [
    needs_control_plane,
    pytest.mark.skipif(not HELM.is_file(), reason="helm is not in .tools/bin (fetch_helm.sh)"),
]


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from control_plane.running(tmp_path_factory.mktemp("cp"))


@pytest.fixture
def helm(kubeconfig: str, tmp_path: Path) -> Iterator[Any]:
    """`helm(*args)` against the control plane; the release and the CRD (with its
    pipelines) are removed afterwards, so every test starts without them."""
    env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
        "HELM_CACHE_HOME": str(tmp_path / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm" / "config"),
        "HELM_DATA_HOME": str(tmp_path / "helm" / "data"),
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(HELM), *args], capture_output=True, text=True, env=env, timeout=120, check=False
        )

    yield run
    run("uninstall", RELEASE, "-n", SYSTEM)
    kubectl(kubeconfig, "delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")


def older_chart(tmp_path: Path) -> Path:
    """The chart as an older release: version 0.0.1, its CRD without the Attainment
    printer column and the status field it shows."""
    chart = tmp_path / "sloline-crds-old"
    shutil.copytree(CRD_CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    (chart / "Chart.yaml").write_text(yaml.safe_dump({**meta, "version": "0.0.1"}))
    crd = copy.deepcopy(crd_manifest())
    version = crd["spec"]["versions"][0]
    version["additionalPrinterColumns"] = [
        c for c in version["additionalPrinterColumns"] if c["name"] != "Attainment"
    ]
    del version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["attainment"]
    (chart / "files" / f"{CRD_NAME}.yaml").write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def live_crd(kubeconfig: str) -> dict[str, Any]:
    result = kubectl(kubeconfig, "get", "crd", CRD_NAME, "-o", "json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def columns(crd: dict[str, Any]) -> list[str]:
    return [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]


def create_pipeline(kubeconfig: str, namespace: str) -> None:
    assert kubectl(kubeconfig, "create", "namespace", namespace).returncode == 0
    result = kubectl(
        kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd", CRD_NAME
    )
    assert result.returncode == 0, result.stderr
    result = kubectl(kubeconfig, "apply", "-n", namespace, "-f", str(EXAMPLE))
    assert result.returncode == 0, result.stderr


def test_upgrade_updates_the_crd_and_uninstall_keeps_it(
    kubeconfig: str, helm: Any, tmp_path: Path
) -> None:
    install = helm(
        "install", RELEASE, str(older_chart(tmp_path)), "-n", SYSTEM, "--create-namespace"
    )
    assert install.returncode == 0, install.stderr
    assert "Attainment" not in columns(live_crd(kubeconfig))
    create_pipeline(kubeconfig, "ml-upgraded")

    upgrade = helm("upgrade", RELEASE, str(CRD_CHART), "-n", SYSTEM)
    assert upgrade.returncode == 0, upgrade.stderr
    crd = live_crd(kubeconfig)
    assert columns(crd) == columns(crd_manifest())
    assert crd["spec"]["versions"][0]["schema"] == crd_manifest()["spec"]["versions"][0]["schema"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    uninstall = helm("uninstall", RELEASE, "-n", SYSTEM)
    assert uninstall.returncode == 0, uninstall.stderr
    assert "kept due to the resource policy" in uninstall.stdout + uninstall.stderr
    assert live_crd(kubeconfig)["metadata"]["uid"] == crd["metadata"]["uid"]
    result = kubectl(kubeconfig, "get", "-n", "ml-upgraded", "slp", "digits-cascade")
    assert result.returncode == 0, result.stderr


def test_a_crd_installed_outside_helm_is_adopted(
    kubeconfig: str, helm: Any, tmp_path: Path
) -> None:
    """The CRD of an install through the operator chart's former `crds/` (or `kubectl
    apply`): `helm install` refuses it until it carries Helm's ownership metadata."""
    old = older_chart(tmp_path) / "files" / f"{CRD_NAME}.yaml"
    assert kubectl(kubeconfig, "apply", "--server-side", "-f", str(old)).returncode == 0
    create_pipeline(kubeconfig, "ml-adopted")

    refused = helm("install", RELEASE, str(CRD_CHART), "-n", SYSTEM, "--create-namespace")
    assert refused.returncode != 0
    assert "exists and cannot be imported into the current release" in refused.stderr

    # docs/install.md, "Upgrading": the adoption commands.
    for args in (
        ("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm"),
        (
            "annotate",
            "crd",
            CRD_NAME,
            f"meta.helm.sh/release-name={RELEASE}",
            f"meta.helm.sh/release-namespace={SYSTEM}",
        ),
    ):
        result = kubectl(kubeconfig, *args)
        assert result.returncode == 0, result.stderr
    install = helm(
        "upgrade", "--install", RELEASE, str(CRD_CHART), "-n", SYSTEM, "--create-namespace",
        "--force-conflicts",
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    crd = live_crd(kubeconfig)
    assert columns(crd) == columns(crd_manifest())
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    result = kubectl(kubeconfig, "get", "-n", "ml-adopted", "slp", "digits-cascade")
    assert result.returncode == 0, result.stderr
