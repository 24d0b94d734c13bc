"""The HTTP endpoint on a real socket: metrics formats, TLS, basic auth, web config errors."""

from __future__ import annotations

import base64
import datetime
import gzip
import http.client
import socket
import ssl
import subprocess
import threading
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.scheduler import State, WorkerView
from lockstep.agent.server import AgentHTTPServer, make_server
from lockstep.agent.webconfig import WebConfig, WebConfigError, load_web_config
from tests.support import LOCKSTEP, REPO, free_port, http_get, wait_until

VIEW = WorkerView("toy", State.OK, "", 0.01, 1.7e9, 0, 3, 0.002, None)


@pytest.fixture
def serve() -> Iterator:  # type: ignore[type-arg]
    servers: list[AgentHTTPServer] = []

    def start(web: WebConfig) -> AgentHTTPServer:
        server = make_server("127.0.0.1:0", SnapshotExporter(lambda: [VIEW]), web, lambda: ["toy"])
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def get(server: AgentHTTPServer, path: str, headers: dict[str, str] | None = None, context=None):  # type: ignore[no-untyped-def]
    port = server.server_address[1]
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def test_metrics_text_openmetrics_gzip_healthz_landing(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(WebConfig())
    response, body = get(server, "/metrics")
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    assert b'lockstep_collector_runs_total{collector="toy"} 3.0\n' in body
    response, body = get(server, "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.getheader("Content-Type").startswith("application/openmetrics-text; version=1.0.0")
    assert b'lockstep_collector_runs_total{collector="toy"} 3.0\n' in body
    assert body.endswith(b"# EOF\n")
    response, body = get(server, "/metrics", {"Accept-Encoding": "gzip"})
    assert response.getheader("Content-Encoding") == "gzip"
    assert b"lockstep_collector_up" in gzip.decompress(body)
    assert get(server, "/healthz")[1] == b"ok\n"
    response, body = get(server, "/")
    assert response.status == 200 and b'href="metrics"' in body and b"toy" in body
    assert get(server, "/nope")[0].status == 404


def make_cert(directory: Path, name: str, issuer_key=None, issuer_name=None, ca: bool = False):  # type: ignore[no-untyped-def]
    """A certificate for 127.0.0.1 (self-signed unless an issuer is given); returns (cert, key, pem paths)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
    )
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key, cert_path, key_path


def test_tls_with_self_signed_certificate(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    make_cert(tmp_path, "server")
    web_file = tmp_path / "web.yml"
    web_file.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    server = serve(load_web_config(web_file))
    # A client that connects and never starts its handshake holds up nobody else.
    silent = socket.create_connection(("127.0.0.1", server.server_address[1]))
    trusting = ssl.create_default_context(cafile=tmp_path / "server.crt")
    response, body = get(server, "/metrics", context=trusting)
    silent.close()
    assert response.status == 200 and b"lockstep_collector_up" in body
    with pytest.raises(ssl.SSLCertVerificationError):
        get(server, "/metrics", context=ssl.create_default_context())  # does not trust it
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        get(server, "/metrics")  # plain HTTP on a TLS port gets nothing
    assert get(server, "/healthz", context=trusting)[1] == b"ok\n"  # the server survived both


def test_tls_client_certificates_required(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ca_cert, ca_key, _, _ = make_cert(tmp_path, "ca", ca=True)
    make_cert(tmp_path, "server")
    make_cert(tmp_path, "client", issuer_key=ca_key, issuer_name=ca_cert.subject)
    make_cert(tmp_path, "stranger")
    web_file = tmp_path / "web.yml"
    web_file.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
    )
    server = serve(load_web_config(web_file))
    client = ssl.create_default_context(cafile=tmp_path / "server.crt")
    client.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    assert get(server, "/metrics", context=client)[0].status == 200
    stranger = ssl.create_default_context(cafile=tmp_path / "server.crt")
    stranger.load_cert_chain(tmp_path / "stranger.crt", tmp_path / "stranger.key")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(server, "/metrics", context=stranger)


def test_basic_auth(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web_file = tmp_path / "web.yml"
    web_file.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    server = serve(load_web_config(web_file))

    def auth(user: str, password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    response, _ = get(server, "/metrics")
    assert response.status == 401
    assert response.getheader("WWW-Authenticate") == 'Basic realm="lockstep"'
    assert get(server, "/metrics", auth("prometheus", "wrong"))[0].status == 401
    assert get(server, "/metrics", auth("nobody", "s3cret"))[0].status == 401
    assert get(server, "/metrics", {"Authorization": "Basic !!!"})[0].status == 401
    response, body = get(server, "/metrics", auth("prometheus", "s3cret"))
    assert response.status == 200 and b"lockstep_collector_up" in body
    assert get(server, "/metrics", auth("prometheus", "s3cret"))[0].status == 200  # remembered
    assert get(server, "/metrics", auth("prometheus", "wrong"))[0].status == 401  # still checked
    assert get(server, "/healthz")[0].status == 200  # liveness needs no credentials


def test_web_config_problems_are_all_reported(tmp_path: Path) -> None:
    web_file = tmp_path / "web.yml"
    web_file.write_text(
        "tls_server_config:\n"  # 1
        "  cert_file: missing.crt\n"  # 2
        "  key_file: missing.key\n"  # 3
        "  min_version: TLS99\n"  # 4
        "basic_auth_users:\n"  # 5
        "  alice: hunter2\n"  # 6
        "tls_config: {}\n"  # 7
    )
    with pytest.raises(WebConfigError) as err:
        load_web_config(web_file)
    problems = err.value.problems
    assert problems[0] == f"{web_file}:7: tls_config: unknown key"
    assert problems[1].startswith(
        f"{web_file}:2: tls_server_config.cert_file: cannot load {tmp_path}/missing.crt / {tmp_path}/missing.key: "
    )
    assert problems[2] == f"{web_file}:4: tls_server_config.min_version: expected one of TLS10, TLS11, TLS12, TLS13"
    assert problems[3] == (
        f"{web_file}:6: basic_auth_users.alice: "
        "expected a bcrypt hash: $2y$, a cost from 04 to 31, $, then 53 characters of [./A-Za-z0-9]"
    )
    assert len(problems) == 4


@pytest.mark.real
def test_liveness_probe_with_client_certificates_required(tmp_path: Path) -> None:
    """The real agent with mTLS on its metrics port: the kubelet (no client certificate) probes the
    plain /healthz-only listener, as deploy/daemonset.yaml does; the metrics port stays closed to it."""
    ca_cert, ca_key, _, _ = make_cert(tmp_path, "ca", ca=True)
    make_cert(tmp_path, "server")
    make_cert(tmp_path, "client", issuer_key=ca_key, issuer_name=ca_cert.subject)
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
    )
    metrics_port, health_port = free_port(), free_port()
    config = tmp_path / "lockstep.yml"
    config.write_text(f"health_listen: 127.0.0.1:{health_port}\nweb_config_file: web.yml\n")
    proc = subprocess.Popen(
        [*LOCKSTEP, "run", "--config", str(config), "--listen", f"127.0.0.1:{metrics_port}", "--no-collector.gpu"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:

        def probe() -> tuple[int, str] | None:
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            try:
                return http_get(f"http://127.0.0.1:{health_port}/healthz", timeout=2)
            except OSError:
                return None

        assert wait_until(probe, timeout=30, what="the health listener") == (200, "ok\n")
        assert http_get(f"http://127.0.0.1:{health_port}/metrics")[0] == 404  # /healthz alone
        no_cert = ssl.create_default_context(cafile=tmp_path / "server.crt")
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            http_get(f"https://127.0.0.1:{metrics_port}/healthz", context=no_cert)
        client = ssl.create_default_context(cafile=tmp_path / "server.crt")
        client.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
        assert http_get(f"https://127.0.0.1:{metrics_port}/metrics", context=client)[0] == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert proc.returncode == 0
