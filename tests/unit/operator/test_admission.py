"""The admission webhook over real HTTPS on loopback: AdmissionReviews in, the same field
paths and reasons as `sloline validate` out (docs/kubernetes.md, "Admission")."""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sloline.cli.planning import cmd_validate
from sloline.operator.admission import MAX_BODY_BYTES, PATH, WebhookServer, self_signed
from sloline.operator.settings import OperatorSettings
from tests.unit.operator.helpers import DIGITS, pipeline_object

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def webhook() -> Iterator[tuple[int, ssl.SSLContext]]:
    certificate = self_signed(["localhost", "127.0.0.1"])
    server = WebhookServer(OperatorSettings(), certificate, host="127.0.0.1", port=0).start()
    client = ssl.create_default_context(cadata=certificate.ca.decode())
    try:
        yield server.port, client
    finally:
        server.stop()


def post(webhook: tuple[int, ssl.SSLContext], body: bytes, path: str = PATH) -> tuple[int, Doc]:
    port, context = webhook
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def review(
    webhook: tuple[int, ssl.SSLContext], obj: Doc, operation: str = "CREATE", old: Doc | None = None
) -> Doc:
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "sloline.dev", "version": "v1alpha1", "kind": "PredictionPipeline"},
        "resource": {"group": "sloline.dev", "version": "v1alpha1",
                     "resource": "predictionpipelines"},
        "name": meta.get("name") if isinstance(meta := obj["metadata"], dict) else "",
        "namespace": "team-a",
        "operation": operation,
        "object": obj,
        "oldObject": old,
    }  # fmt: skip
    status, answer = post(
        webhook, json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "request": request}).encode()
    )  # fmt: skip
    assert status == 200, answer
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == request["uid"]
    response: Doc = answer["response"]
    return response


def cli_issues(tmp_path: Path, obj: Doc, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What `sloline validate --output json` says about the same document."""
    doc = {k: obj[k] for k in ("apiVersion", "kind", "spec")}
    doc["metadata"] = {"name": obj["metadata"]["name"]}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    cmd_validate(argparse.Namespace(file=str(path), output="json"))
    found = json.loads(capsys.readouterr().out)
    return [f"{i['path']}: {i['reason']}" for i in found.get("issues", [])]


def digits(change: Callable[[Doc], object] = lambda _: None) -> Doc:
    obj = pipeline_object(DIGITS)
    change(obj["spec"])
    return obj


def _cycle(spec: Doc) -> None:
    spec["stages"][0]["inputs"] = [{"name": "pixels", "from": "combine.label"}]


def _output_name(spec: Doc) -> None:
    spec["stages"][1]["inputs"][0]["from"] = "preprocess.feats"


def _bad_when(spec: Doc) -> None:
    spec["stages"][2]["when"] = "max(fast.probabilities) <"


def _when_type(spec: Doc) -> None:
    spec["stages"][2]["when"] = "max(fast.probabilities) + 1"


def _field_type(spec: Doc) -> None:
    spec["slo"]["latencyMs"] = "fast"


INVALID: dict[str, tuple[Callable[[Doc], object], str]] = {
    "cycle": (
        _cycle,
        "spec.stages[1].inputs: cycle: fast -> combine -> preprocess -> fast",
    ),
    "wrong output name": (
        _output_name,
        "spec.stages[1].inputs[0].from: stage 'preprocess' has no output 'feats' (['features'])",
    ),
    "bad when": (_bad_when, "spec.stages[2].when: "),
    "when type error": (_when_type, "spec.stages[2].when: "),
    "field type error": (_field_type, "spec.slo.latencyMs: Input should be a valid number"),
}


def test_a_valid_pipeline_is_admitted(webhook: tuple[int, ssl.SSLContext]) -> None:
    response = review(webhook, digits())
    assert response["allowed"] is True
    assert "status" not in response


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_pipeline_is_refused_as_the_cli_reports_it(
    webhook: tuple[int, ssl.SSLContext],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    change, expected = INVALID[case]
    obj = digits(change)
    response = review(webhook, obj)
    assert response["allowed"] is False
    status = response["status"]
    assert (status["code"], status["reason"]) == (422, "Invalid")
    cli = cli_issues(tmp_path, obj, capsys)
    assert any(line.startswith(expected) for line in cli), cli  # the case breaks what it says
    assert status["message"] == "; ".join(cli)
    causes = [f"{c['field']}: {c['message']}" for c in status["details"]["causes"]]
    assert causes == cli
    assert status["details"]["name"] == "digits-cascade"


def test_a_when_type_error_names_the_operand(webhook: tuple[int, ssl.SSLContext]) -> None:
    message = review(webhook, digits(_when_type))["status"]["message"]
    assert message.startswith("spec.stages[2].when: "), message
    assert "boolean" in message, message


def test_what_only_the_operator_knows_is_refused_too(webhook: tuple[int, ssl.SSLContext]) -> None:
    """A stage named like the pipeline's own objects passes `sloline validate` but not the
    operator's `Valid` check, so not admission either."""

    def router(spec: Doc) -> None:
        spec["stages"][3]["name"], spec["output"] = "router", "router"

    message = review(webhook, digits(router))["status"]["message"]
    assert message.startswith("spec.stages[3].name: 'router' is reserved on Kubernetes"), message


def test_an_update_is_refused_only_for_new_problems(webhook: tuple[int, ssl.SSLContext]) -> None:
    broken = digits(_output_name)
    marked = copy.deepcopy(broken)  # kopf's bookkeeping on a pipeline stored before the webhook
    marked["metadata"]["annotations"] = {"operator.sloline.dev/last-handled-configuration": "{}"}
    assert review(webhook, marked, "UPDATE", old=broken)["allowed"] is True
    worse = digits(lambda spec: (_output_name(spec), _bad_when(spec)))
    response = review(webhook, worse, "UPDATE", old=broken)
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("spec.stages[2].when: "), response
    assert review(webhook, broken, "UPDATE", old=digits())["allowed"] is False


def test_a_create_with_generate_name_is_judged(webhook: tuple[int, ssl.SSLContext]) -> None:
    obj = digits(_output_name)
    del obj["metadata"]["name"], obj["metadata"]["namespace"]
    obj["metadata"]["generateName"] = "digits-"
    obj["metadata"]["name"] = ""
    response = review(webhook, obj)
    assert response["allowed"] is False
    assert "has no output 'feats'" in response["status"]["message"]
    assert review(webhook, obj, "DELETE")["allowed"] is True


def test_requests_that_are_not_reviews_get_http_errors(
    webhook: tuple[int, ssl.SSLContext],
) -> None:
    assert post(webhook, b"{}", "/mutate")[0] == 404
    assert post(webhook, b"[1, 2]")[0] == 400
    assert post(webhook, b"not json")[0] == 400
    status, body = post(webhook, json.dumps({"request": {"operation": "CREATE"}}).encode())
    assert (status, body["error"]) == (400, "bad AdmissionReview: not an AdmissionReview "
                                             "request: no request.uid")  # fmt: skip


def test_the_server_speaks_only_tls_with_its_own_certificate(
    webhook: tuple[int, ssl.SSLContext],
) -> None:
    port, _ = webhook

    def plain_http() -> None:
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            plain.request("POST", PATH, b"{}")
            plain.getresponse()
        finally:
            plain.close()

    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain_http()
    stranger = ssl.create_default_context(cadata=self_signed(["localhost"]).ca.decode())
    with pytest.raises(ssl.SSLCertVerificationError):
        post((port, stranger), b"{}")


def test_a_silent_or_oversized_client_holds_up_no_one(webhook: tuple[int, ssl.SSLContext]) -> None:
    port, context = webhook
    with socket.create_connection(("127.0.0.1", port)):  # connects, never says hello
        assert review(webhook, digits())["allowed"] is True
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        try:
            connection.putrequest("POST", PATH)
            connection.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
            connection.endheaders()
            assert connection.getresponse().status == 413  # refused before reading it
        finally:
            connection.close()


def test_a_malformed_object_is_refused_not_crashed_on(webhook: tuple[int, ssl.SSLContext]) -> None:
    obj = digits()
    obj["metadata"] = ["not", "a", "mapping"]
    obj["spec"]["stages"] = "none"
    response = review(webhook, obj)
    assert response["allowed"] is False
    assert "spec.stages: " in response["status"]["message"], response
