"""Outbound webhooks over HTTPS (issue 22): the request connects to the address that was checked,
while TLS names the URL's host (SNI) and the certificate is verified against that host. A real
TLS server on 127.0.0.1 with a certificate made here; the URL names `localhost`."""

from __future__ import annotations

import datetime as dt
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.conf import LazySettings
from standardwebhooks.webhooks import Webhook

from outbound.models import Attempt, Delivery
from outbound.services import delivering, endpoints, http
from tests import factories
from tests.test_outbound_webhooks import happen

pytestmark = pytest.mark.django_db


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for `name` (it is its own CA) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


class TLSReceiver:
    """An HTTPS server on 127.0.0.1 answering 200, recording each request's SNI, Host and body."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.requests: list[dict] = []
        self.server_names: list[str | None] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append({"headers": dict(self.headers), "body": body})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.sni_callback = lambda _socket, name, _context: self.server_names.append(name)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def tls(settings: LazySettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TLSReceiver]:
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True  # 127.0.0.1; https all the same
    cert, key = _certificate(tmp_path, "localhost")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the test's certificate is the trusted CA
    http.close_pools()
    receiver = TLSReceiver(cert, key)
    yield receiver
    receiver.close()
    http.close_pools()


def test_a_request_goes_to_the_checked_address_with_the_hosts_name_in_sni_host_and_certificate(
    tls: TLSReceiver,
) -> None:
    key = factories.api_key("send", "read")[0]
    endpoint, secret = endpoints.create(key, f"https://localhost:{tls.port}/hook")
    happen(key)
    assert delivering.deliver(endpoint.pk) == 1
    [request] = tls.requests
    assert tls.server_names[0] == "localhost"  # SNI: the host, though the socket went to 127.0.0.1
    assert request["headers"]["Host"] == f"localhost:{tls.port}"
    event = Webhook(secret).verify(request["body"], request["headers"])
    assert event["type"] == "message.cancelled"
    assert Delivery.objects.get().status == Delivery.Status.SUCCEEDED


def test_a_certificate_for_another_name_fails_the_attempt_and_sends_nothing(
    settings: LazySettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True
    cert, key_file = _certificate(tmp_path, "other.example")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    http.close_pools()
    server = TLSReceiver(cert, key_file)
    try:
        key = factories.api_key("send", "read")[0]
        endpoint, _ = endpoints.create(key, f"https://localhost:{server.port}/hook")
        happen(key)
        delivering.deliver(endpoint.pk)
        assert server.requests == []
        attempt = Attempt.objects.get()
        assert attempt.status_code is None and not attempt.succeeded
        assert "certificate" in attempt.error.lower() or "hostname" in attempt.error.lower(), attempt.error
        assert Delivery.objects.get().status == Delivery.Status.RETRY_WAIT
    finally:
        server.close()
        http.close_pools()
