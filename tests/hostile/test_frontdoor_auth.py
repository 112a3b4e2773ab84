"""The client front doors with TLS, client certificates and bearer tokens (all off by
default): the right token/certificate gets answers over REST (httpx, tritonclient) and
gRPC (grpc, tritonclient); none or a wrong one gets 401 / UNAUTHENTICATED or no TLS
handshake, and the kubelet's health probes stay open."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from tritonclient.utils import InferenceServerException

from sloline.cli import main
from sloline.serving.auth import AuthConfigError, TokenSet, read_token_file
from sloline.serving.proto import grpc_service_pb2 as pb
from sloline.serving.proto import grpc_service_pb2_grpc as pb_grpc
from tests.support.serve import NOOP, BackgroundPipeline

TOKENS = ("first-token-0123456789", "second-token-abcdefghij")


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate from another CA
    rogue_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    folder: Path,
    stem: str,
    cn: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> tuple[x509.Name, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(cn)
    issuer_name, issuer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{stem}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return subject, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = _issue(d, "ca", "sloline test CA", None, ca=True)
    _issue(d, "server", "localhost", ca, server=True)
    _issue(d, "client", "a client", ca)
    rogue_ca = _issue(d, "rogue-ca", "someone else's CA", None, ca=True)
    _issue(d, "rogue", "a rogue client", rogue_ca)
    return Pki(
        d / "ca.pem",
        d / "server.pem",
        d / "server.key",
        d / "client.pem",
        d / "client.key",
        d / "rogue.pem",
        d / "rogue.key",
    )


def _body(x: np.ndarray) -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(x)], "data": x.tolist()}]}


def _grpc_request(x: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="noop")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[len(x)])
    tensor.contents.fp32_contents.extend(x.tolist())
    return request


def _grpc_answer(response: pb.ModelInferResponse) -> list[float]:
    values: list[float] = np.frombuffer(response.raw_output_contents[0], np.float32).tolist()
    return values


@pytest.fixture(scope="module")
def with_tokens(pki: Pki) -> Iterator[BackgroundPipeline]:
    settings = {"tls_cert": pki.server_cert, "tls_key": pki.server_key, "auth_tokens": TOKENS}
    with BackgroundPipeline(NOOP, server=settings) as bg:
        yield bg


def test_rest_needs_a_token_over_tls(with_tokens: BackgroundPipeline, pki: Pki) -> None:
    base = f"https://{with_tokens.http_url}"
    x = np.arange(3, dtype=np.float32)
    infer = f"{base}/v2/models/noop/infer"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(pki.ca))) as client:
        for token in TOKENS:  # every token of the file
            answer = client.post(infer, json=_body(x), headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"][0]["data"] == x.tolist()
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKENS[0]}):
            refused = client.post(infer, json=_body(x), headers=headers)
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert "error" in refused.json()
        for path in ("/v2", "/v2/models/noop", "/metrics"):  # every other route too
            assert client.get(f"{base}{path}").status_code == 401, path
        for path in ("/v2/health/live", "/v2/health/ready"):  # the kubelet's probes
            assert client.get(f"{base}{path}").status_code == 200, path
    with pytest.raises(httpx.HTTPError):  # no plain HTTP beside TLS
        httpx.get(f"http://{with_tokens.http_url}/v2/health/live", timeout=5)


def test_grpc_needs_a_token_over_tls(with_tokens: BackgroundPipeline, pki: Pki) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    x = np.arange(4, dtype=np.float32)
    with grpc.secure_channel(with_tokens.grpc_url, credentials) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for token in TOKENS:
            answer = stub.ModelInfer(
                _grpc_request(x), metadata=(("authorization", f"Bearer {token}"),), timeout=30
            )
            assert _grpc_answer(answer) == x.tolist()
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(_grpc_request(x), metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as refused:
                stub.ServerLive(pb.ServerLiveRequest(), metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(with_tokens.grpc_url) as plain:  # no plaintext beside TLS
        with pytest.raises(grpc.RpcError) as failed:
            pb_grpc.GRPCInferenceServiceStub(plain).ServerLive(pb.ServerLiveRequest(), timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


def test_tritonclient_works_with_tls_and_a_token(with_tokens: BackgroundPipeline, pki: Pki) -> None:
    x = np.arange(5, dtype=np.float32)
    headers = {"Authorization": f"Bearer {TOKENS[1]}"}
    http_in = httpclient.InferInput("x", [5], "FP32")
    http_in.set_data_from_numpy(x)
    http = httpclient.InferenceServerClient(
        with_tokens.http_url,
        ssl=True,
        ssl_context_factory=lambda: ssl.create_default_context(cafile=str(pki.ca)),
    )
    assert http.infer("noop", [http_in], headers=headers).as_numpy("x").tolist() == x.tolist()
    with pytest.raises(InferenceServerException, match="authentication required"):
        http.infer("noop", [http_in])
    grpc_in = grpcclient.InferInput("x", [5], "FP32")
    grpc_in.set_data_from_numpy(x)
    client = grpcclient.InferenceServerClient(
        with_tokens.grpc_url, ssl=True, root_certificates=str(pki.ca)
    )
    grpc_headers = {"authorization": f"Bearer {TOKENS[1]}"}
    answer = client.infer("noop", [grpc_in], headers=grpc_headers)
    assert answer.as_numpy("x").tolist() == x.tolist()
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        client.infer("noop", [grpc_in])


def test_client_certificates_when_a_client_ca_is_given(pki: Pki) -> None:
    settings = {
        "tls_cert": pki.server_cert,
        "tls_key": pki.server_key,
        "tls_client_ca": pki.ca,
        "metrics_port": 0,
    }
    x = np.arange(2, dtype=np.float32)
    with BackgroundPipeline(NOOP, server=settings) as bg:
        url = f"https://{bg.http_url}/v2/models/noop/infer"
        # The kubelet has no client certificate: it probes the plain metrics port.
        plain = f"http://127.0.0.1:{bg.p.server.metrics_port}"
        for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
            assert httpx.get(f"{plain}{path}").status_code == 200, path

        def context(cert: Path | None, key: Path | None) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(pki.ca))
            if cert is not None:
                ctx.load_cert_chain(str(cert), str(key))
            return ctx

        good = context(pki.client_cert, pki.client_key)
        assert httpx.post(url, json=_body(x), verify=good).json()["outputs"][0]["data"] == [0, 1]
        for ctx in (context(None, None), context(pki.rogue_cert, pki.rogue_key)):
            with pytest.raises(httpx.HTTPError):  # the handshake fails: no HTTP at all
                httpx.post(url, json=_body(x), verify=ctx)

        def channel(cert: Path | None, key: Path | None) -> grpc.Channel:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=pki.ca.read_bytes(),
                private_key=key.read_bytes() if key else None,
                certificate_chain=cert.read_bytes() if cert else None,
            )
            return grpc.secure_channel(bg.grpc_url, credentials)

        with channel(pki.client_cert, pki.client_key) as ok:
            answer = pb_grpc.GRPCInferenceServiceStub(ok).ModelInfer(_grpc_request(x), timeout=30)
            assert _grpc_answer(answer) == x.tolist()
        for cert, key in ((None, None), (pki.rogue_cert, pki.rogue_key)):
            with channel(cert, key) as refused, pytest.raises(grpc.RpcError) as failed:
                pb_grpc.GRPCInferenceServiceStub(refused).ModelInfer(_grpc_request(x), timeout=5)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


def test_token_files_and_comparison(tmp_path: Path) -> None:
    good = tmp_path / "tokens"
    good.write_text("# front-door tokens\nabc123\n\n  def456  \n")
    assert read_token_file(good, "--auth-token-file") == ("abc123", "def456")
    tokens = TokenSet(["abc123", "def456"])
    assert tokens.authorizes("Bearer def456") and tokens.authorizes(b"bearer abc123")
    for header in (None, "", "Bearer", "Bearer abc12", "Basic abc123", "abc123", "Bearer abc1234"):
        assert not tokens.authorizes(header), header
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(AuthConfigError, match="holds no token"):
        read_token_file(empty, "--auth-token-file")
    with pytest.raises(AuthConfigError, match="cannot read"):
        read_token_file(tmp_path / "missing", "--auth-token-file")


def test_tls_flags_are_checked_before_serving(
    tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(NOOP), "--no-plan", "--tls-cert", str(pki.server_cert)]) == 2
    assert "both a certificate and its key" in capsys.readouterr().err
    assert main(["run", str(NOOP), "--no-plan", "--tls-client-ca", str(pki.ca)]) == 2
    assert "--tls-client-ca needs TLS on" in capsys.readouterr().err
    missing = tmp_path / "none"
    assert main(["run", str(NOOP), "--no-plan", "--auth-token-file", str(missing)]) == 2
    assert "--auth-token-file: cannot read" in capsys.readouterr().err
