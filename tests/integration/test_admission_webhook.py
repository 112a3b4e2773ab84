"""Admission on the real kube-apiserver: the CRD's CEL rules refuse what they cover with
their messages, and the operator's webhook (served by this test on loopback, behind the
chart's ValidatingWebhookConfiguration with a `url` clientConfig, its caBundle written by
`publish_ca_bundle`) refuses the rest at `kubectl apply` with the field and the reason
`sloline validate` prints, and admits a valid pipeline (docs/kubernetes.md, "Admission").

Runs on the real control plane of docs/e2e.md ("Real control plane"), skipped where its
binaries are not built, like test_pod_admission.py, whose control-plane fixture it uses.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sloline.operator.admission import (
    PublishError,
    WebhookServer,
    publish_ca_bundle,
    self_signed,
)
from sloline.operator.kube import KubeApi
from sloline.operator.settings import OperatorSettings
from tests.integration import test_pod_admission as control_plane
from tests.unit.operator.test_admission import INVALID, cli_issues
from tests.unit.spec.test_crd_validation import BROKEN

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "bin" / "helm"
NAMESPACE = "ml"
# kubectl prints the webhook's answer (422 Invalid, with a cause per problem) as it prints
# the API server's own validation errors: 'The <kind> "<name>" is invalid: <field>: <reason>'.
INVALID_PIPELINE = 'The PredictionPipeline "{}" is invalid: '

pytestmark = [
    control_plane.pytestmark,
    pytest.mark.skipif(not HELM.is_file(), reason="helm is not in .tools/bin (fetch_helm.sh)"),
]
kubeconfig = control_plane.kubeconfig  # the module's own control plane
kubectl = control_plane.kubectl
Doc = dict[str, Any]


def pipeline(change: Callable[[Doc], object] = lambda _: None) -> Doc:
    doc = yaml.safe_load((ROOT / "examples" / "digits-cascade" / "pipeline.yaml").read_text())
    doc["metadata"]["namespace"] = NAMESPACE
    change(doc["spec"])
    return doc


def chart_webhook_configuration() -> Doc:
    rendered = subprocess.run(
        [str(HELM), "template", "sloline", str(ROOT / "helm" / "sloline"), "-n", "sloline-system",
         "--show-only", "templates/admission.yaml"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    [config] = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    return config


@pytest.fixture(scope="module")
def cluster(kubeconfig: str) -> Iterator[str]:
    """The CRD, a namespace, and the webhook behind the chart's configuration."""
    crd = ROOT / "helm" / "sloline-crds" / "files" / "predictionpipelines.sloline.dev.yaml"
    result = kubectl(kubeconfig, "apply", "--server-side", "-f", str(crd))
    assert result.returncode == 0, result.stderr
    result = kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
                     "-f", str(crd))  # fmt: skip
    assert result.returncode == 0, result.stderr
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    assert kubectl(kubeconfig, "create", "-f", "-", stdin=namespace).returncode == 0

    certificate = self_signed(["127.0.0.1"])
    server = WebhookServer(OperatorSettings(), certificate, host="127.0.0.1", port=0).start()
    try:
        config = chart_webhook_configuration()
        config["webhooks"][0]["clientConfig"] = {"url": f"https://127.0.0.1:{server.port}/validate"}
        result = kubectl(kubeconfig, "create", "-f", "-", stdin=config)
        assert result.returncode == 0, result.stderr
        publish_ca_bundle(KubeApi.connect(kubeconfig), config["metadata"]["name"], certificate.ca)
        # The API server picks the configuration up asynchronously.
        broken = pipeline(INVALID["wrong output name"][0])
        deadline = time.monotonic() + 60
        while (
            "has no output" not in (answer := apply(kubeconfig, broken, "--dry-run=server")).stderr
        ):
            assert time.monotonic() < deadline, f"the webhook never answered: {answer}"
            time.sleep(0.5)
        yield kubeconfig
    finally:
        server.stop()


def apply(config: str, doc: Doc, *flags: str) -> subprocess.CompletedProcess[str]:
    return kubectl(config, "apply", *flags, "-f", "-", stdin=doc)


@pytest.mark.parametrize("case", sorted(set(INVALID) - {"field type error"}))
def test_kubectl_apply_of_an_invalid_pipeline_fails_as_the_cli_reports_it(
    cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    change, expected = INVALID[case]
    doc = pipeline(change)
    result = apply(cluster, doc)
    assert result.returncode != 0
    cli = cli_issues(tmp_path, doc, capsys)
    assert any(line.startswith(expected) for line in cli), cli
    assert result.stderr.startswith(INVALID_PIPELINE.format("digits-cascade")), result.stderr
    for line in cli:
        assert line in result.stderr, (line, result.stderr)
    assert kubectl(cluster, "-n", NAMESPACE, "get", "slp", "digits-cascade").returncode != 0


def test_a_valid_pipeline_is_admitted_and_a_bad_update_refused(cluster: str) -> None:
    doc = pipeline()
    doc["metadata"]["name"] = "admitted"
    result = apply(cluster, doc)
    assert result.returncode == 0, result.stderr
    broken = copy.deepcopy(doc)
    broken["spec"]["stages"][2]["when"] = "max(fast.probabilities) < 0.9 &&"
    result = apply(cluster, broken)
    assert result.returncode != 0
    assert result.stderr.startswith(INVALID_PIPELINE.format("admitted") + "spec.stages[2].when: ")
    stored = json.loads(
        kubectl(cluster, "-n", NAMESPACE, "get", "slp", "admitted", "-o", "json").stdout
    )
    assert stored["spec"]["stages"][2]["when"] == "max(fast.probabilities) < 0.9"
    # The operator's bookkeeping on the stored object still goes through.
    result = kubectl(cluster, "-n", NAMESPACE, "annotate", "slp", "admitted", "team=ml")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("breaker", "message"), BROKEN, ids=[b.__name__[1:] for b, _ in BROKEN])
def test_the_crds_cel_rules_refuse_with_their_messages(
    cluster: str, breaker: Callable[[Doc], None], message: str
) -> None:
    doc = pipeline()
    breaker(doc)
    result = apply(cluster, doc, "--dry-run=server")
    assert result.returncode != 0
    # The API server's own validation, before any webhook: `Invalid value: ...: <message>`.
    assert "Invalid value: " in result.stderr, result.stderr
    assert message.partition(": ")[2] in result.stderr, result.stderr


def test_a_missing_configuration_is_reported_by_name(cluster: str) -> None:
    with pytest.raises(PublishError, match=r"ValidatingWebhookConfiguration 'absent': 404"):
        publish_ca_bundle(KubeApi.connect(cluster), "absent", b"", wait_s=0)


def test_the_operator_serves_the_webhook_with_the_ca_it_publishes(
    cluster: str, tmp_path: Path
) -> None:
    """`sloline operator --webhook-*` against the real API server: it writes its CA into
    its configuration (failurePolicy Fail, scoped to one namespace), the API server then
    trusts it, and without it nothing gets into that namespace."""
    namespace, name = "ml-operator", "sloline-operator-test"
    labels = {"kubernetes.io/metadata.name": namespace}
    created = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    assert kubectl(cluster, "create", "-f", "-", stdin=created).returncode == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = chart_webhook_configuration()
    config["metadata"]["name"] = name
    [hook] = config["webhooks"]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate"}  # no caBundle yet
    hook["namespaceSelector"] = {"matchLabels": labels}
    assert kubectl(cluster, "create", "-f", "-", stdin=config).returncode == 0
    log = (tmp_path / "operator.log").open("w")
    operator = subprocess.Popen(
        [sys.executable, "-m", "sloline", "operator", "--namespace", namespace, "--standalone",
         "--metrics-port", "0", "--webhook-port", str(port), "--webhook-dns", "127.0.0.1",
         "--webhook-configuration", name],
        env={**os.environ, "KUBECONFIG": cluster}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        doc = pipeline()
        doc["metadata"].update(name="served", namespace=namespace)
        deadline = time.monotonic() + 60
        while (result := apply(cluster, doc, "--dry-run=server")).returncode:
            assert operator.poll() is None, (tmp_path / "operator.log").read_text()
            assert time.monotonic() < deadline, result.stderr
            time.sleep(0.5)
        stored = json.loads(kubectl(cluster, "get", "validatingwebhookconfiguration", name,
                                    "-o", "json").stdout)  # fmt: skip
        assert stored["webhooks"][0]["clientConfig"]["caBundle"]
        broken = pipeline(INVALID["cycle"][0])
        broken["metadata"].update(name="served", namespace=namespace)
        result = apply(cluster, broken, "--dry-run=server")
        assert "cycle: fast -> combine -> preprocess -> fast" in result.stderr, result.stderr
    finally:
        operator.terminate()
        operator.wait(timeout=30)
        log.close()
    result = apply(cluster, doc, "--dry-run=server")
    assert result.returncode != 0  # failurePolicy Fail: the operator is gone
    assert f'failed calling webhook "{hook["name"]}"' in result.stderr, result.stderr
