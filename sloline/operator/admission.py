"""The validating admission webhook for PredictionPipelines, served by the operator.

The API server sends every CREATE and UPDATE of a pipeline here (the chart's
ValidatingWebhookConfiguration) as an AdmissionReview; the answer comes from
`object_issues`, the check behind the `Valid` condition (`sloline validate`'s spec
checks, then what this operator's settings require), so `kubectl apply` of an invalid
pipeline fails at once with the same field paths and reasons the CLI prints. An UPDATE
is refused only for problems the stored object did not already have: the operator's own
bookkeeping (annotations, finalizers) on a pipeline stored before the webhook existed
still goes through.

The server is HTTPS only, on its own threads beside kopf. Its certificate is made at
start-up (`self_signed`, the `cryptography` package): a throwaway CA and a serving
certificate for the webhook Service's DNS name; the CA goes into the webhook
configuration's `caBundle` (`publish_ca_bundle`), and the keys never leave the process.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sloline.operator.kube import ApiError, KubeApi
from sloline.operator.planning import object_issues
from sloline.operator.settings import OperatorSettings
from sloline.spec import Issue

_LOG = logging.getLogger(__name__)

PATH = "/validate"
REVIEW_VERSION = "admission.k8s.io/v1"
WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MAX_BODY_BYTES = 8 << 20  # the API server caps an object at 3 MiB; a review holds two
READ_TIMEOUT_S = 10.0
CERT_DAYS = 3650  # made anew at every start


# --- the answer --------------------------------------------------------------------------


def review_response(review: Mapping[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """The AdmissionReview answering `review` (raises ValueError for one without a
    `request.uid`)."""
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ValueError("not an AdmissionReview request: no request.uid")
    issues = admission_issues(request, settings)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": not issues}
    if issues:
        name = _named(request, request.get("object") or {})["metadata"]["name"]
        response["status"] = {
            "status": "Failure",
            "code": 422,
            "reason": "Invalid",
            "message": "; ".join(str(issue) for issue in issues),
            "details": {
                "group": "sloline.dev",
                "kind": "PredictionPipeline",
                "name": name,
                "causes": [
                    {"type": "FieldValueInvalid", "field": i.path, "message": i.reason}
                    for i in issues
                ],
            },
        }
    return {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "response": response}


def admission_issues(request: Mapping[str, Any], settings: OperatorSettings) -> list[Issue]:
    """What refuses the request: every problem of the new object (none for other
    operations), less, on UPDATE, those the stored object already had."""
    obj = request.get("object")
    if request.get("operation") not in ("CREATE", "UPDATE") or not isinstance(obj, Mapping):
        return []
    issues = object_issues(_named(request, obj), settings)[1]
    old = request.get("oldObject")
    if issues and request.get("operation") == "UPDATE" and isinstance(old, Mapping):
        before = {str(i) for i in object_issues(_named(request, old), settings)[1]}
        issues = [i for i in issues if str(i) not in before]
    return issues


def _named(request: Mapping[str, Any], obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` with the name and namespace the request gives it (a CREATE with
    `generateName` has no name yet; its namespace may come only from the request)."""
    given = obj.get("metadata")
    meta = dict(given) if isinstance(given, Mapping) else {}
    meta["name"] = meta.get("name") or request.get("name") or meta.get("generateName") or ""
    meta["namespace"] = meta.get("namespace") or request.get("namespace") or "default"
    return {**obj, "metadata": meta}


# --- certificates ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WebhookCertificate:
    """PEM: the CA the API server trusts, the serving certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes


def self_signed(names: Sequence[str], *, days: int = CERT_DAYS) -> WebhookCertificate:
    """A new CA and a serving certificate it signs for `names` (DNS names or IPs)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sloline admission webhook CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(x509, cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(x509, cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return WebhookCertificate(
        ca=ca.public_bytes(serialization.Encoding.PEM),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _key_usage(x509: Any, *, cert_sign: bool) -> Any:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def server_context(certificate: WebhookCertificate) -> ssl.SSLContext:
    """A TLS 1.2+ server context with the certificate (the key is written only to a
    private temporary file while it loads)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="sloline-webhook-") as folder:
        os.chmod(folder, 0o700)
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        with open(cert, "wb") as out:
            out.write(certificate.cert)
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out:
            out.write(certificate.key)
        context.load_cert_chain(cert, key)
    return context


class PublishError(RuntimeError):
    """The webhook's CA could not be written into its configuration."""


def publish_ca_bundle(
    api: KubeApi, configuration: str, ca: bytes, *, wait_s: float = 60.0, poll_s: float = 2.0
) -> None:
    """Set `caBundle` of every webhook of the ValidatingWebhookConfiguration
    `configuration` to `ca`, waiting up to `wait_s` for it to exist; raises
    `PublishError` saying why not."""
    import base64

    bundle = base64.b64encode(ca).decode()
    path = f"{WEBHOOK_CONFIGURATIONS}/{configuration}"
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                found = api.request("GET", path)
                break
            except ApiError as exc:
                if not exc.not_found or time.monotonic() >= deadline:
                    raise
                _LOG.info("waiting for ValidatingWebhookConfiguration %s", configuration)
                time.sleep(poll_s)
        version = found["metadata"]["resourceVersion"]
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            *(
                {"op": "replace" if "caBundle" in (hook.get("clientConfig") or {}) else "add",
                 "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                for i, hook in enumerate(found.get("webhooks") or [])
            ),
        ]  # fmt: skip
        api.request("PATCH", path, body=patch, content_type="application/json-patch+json")
    except ApiError as exc:
        raise PublishError(
            f"cannot write the admission webhook's CA into ValidatingWebhookConfiguration "
            f"{configuration!r}: {exc}"
        ) from None
    _LOG.info("published the webhook's CA in ValidatingWebhookConfiguration %s", configuration)


# --- the server --------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._send(411, {"error": "Content-Length required"})
            return
        if not 0 < length <= MAX_BODY_BYTES:
            self._send(413, {"error": f"a review takes 1 to {MAX_BODY_BYTES} bytes"})
            return
        body = self.rfile.read(length)  # read before any answer: unread bytes reset the close
        if self.path.partition("?")[0] != PATH:
            self._send(404, {"error": f"no such path; POST AdmissionReviews to {PATH}"})
            return
        try:
            review = json.loads(body)
            if not isinstance(review, dict):
                raise ValueError("not a JSON object")
            answer = review_response(review, self.server.settings)
        except ValueError as exc:
            self._send(400, {"error": f"bad AdmissionReview: {exc}"})
            return
        response = answer["response"]
        if not response["allowed"]:
            request = review["request"]
            _LOG.info(
                "admission: refused %s of %s/%s: %s", request.get("operation"),
                request.get("namespace"), request.get("name"), response["status"]["message"],
            )  # fmt: skip
        self._send(200, answer)

    def _send(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        if code >= 400:  # the rest of the body may be unread: no second request on it
            self.close_connection = True
            self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        _LOG.debug("admission: %s " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    """TLS per connection on the connection's own thread, so a slow handshake holds up
    no one else."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], context: ssl.SSLContext, settings: OperatorSettings
    ) -> None:
        self.context, self.settings = context, settings
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(READ_TIMEOUT_S)
        with self.context.wrap_socket(request, server_side=True) as tls:
            _Handler(tls, client_address, self)

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ARG002
        _LOG.debug("admission: connection from %s failed", client_address, exc_info=True)


class WebhookServer:
    """The webhook's HTTPS server, serving on a thread until `stop()`."""

    def __init__(
        self,
        settings: OperatorSettings,
        certificate: WebhookCertificate,
        *,
        host: str = "0.0.0.0",  # noqa: S104 - the API server calls it from outside the pod
        port: int = 9443,
    ) -> None:
        self._server = _Server((host, port), server_context(certificate), settings)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="admission-webhook", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> WebhookServer:
        self._thread.start()
        _LOG.info("admission webhook: https on port %d, path %s", self.port, PATH)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
