"""TLS on every endpoint, with certificates made by trustme and the real daemon driven by unmodified tritonclient:
plain and mutual TLS over HTTP and gRPC, the metrics port, bad files failing the start with one line, plaintext
clients refused while the daemon serves on, the connection limit over TLS, and certificates rotated by SIGHUP
without dropping a connection."""

from __future__ import annotations

import http.client
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from server import (
    REPO_ROOT,
    Server,
    assert_grpc_still_serving,
    assert_still_serving,
    free_ports,
    request,
    run_server,
)
from tritonclient.utils import InferenceServerException

HOST = "127.0.0.1"
RELOAD_TIMEOUT_S = 60.0
HEADER_TIMEOUT_S = 2.0
# Longest a timed-out connection may take to be closed beyond its timeout, on a busy machine.
SLACK_S = 3.0


@dataclass
class Pki:
    """A CA, a server pair it signed (for 127.0.0.1, common name ``server_name``) and the files edged reads."""

    ca: trustme.CA
    dir: Path
    cert: Path
    key: Path
    ca_file: Path

    def issue(self, ca: trustme.CA, server_name: str) -> None:
        """Write a new server pair, signed by ``ca``, over the files edged reads."""
        leaf = ca.issue_cert(HOST, common_name=server_name)
        self.cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        self.key.write_bytes(leaf.private_key_pem.bytes())

    def client_files(self, name: str, ca: trustme.CA | None = None) -> tuple[Path, Path]:
        """A client certificate for ``name`` signed by ``ca`` (this PKI's by default): (certificate, key)."""
        leaf = (ca or self.ca).issue_cert(f"{name}.devices.local", common_name=name)
        cert, key = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        key.write_bytes(leaf.private_key_pem.bytes())
        return cert, key


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem.bytes())
    files = Pki(ca, tmp_path, tmp_path / "server.pem", tmp_path / "server.key", ca_file)
    files.issue(ca, "edged-1")
    return files


def tls_flags(pki: Pki, *, mutual: bool = False) -> list[str]:
    flags = []
    for wire in ("http", "grpc"):
        flags += [f"--{wire}-server-cert={pki.cert}", f"--{wire}-server-key={pki.key}"]
        flags += [f"--{wire}-use-ssl-mutual", f"--{wire}-root-cert={pki.ca_file}"] if mutual else [f"--{wire}-use-ssl"]
    return flags


def client_context(ca: trustme.CA, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def http_client(
    server: Server, ca_file: Path, cert: tuple[Path, Path] | None = None
) -> httpclient.InferenceServerClient:
    options = {"ca_certs": str(ca_file)}
    if cert is not None:
        options |= {"certfile": str(cert[0]), "keyfile": str(cert[1])}
    return httpclient.InferenceServerClient(server.http_url, ssl=True, ssl_options=options)


def grpc_client(
    server: Server, ca_file: Path, cert: tuple[Path, Path] | None = None
) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        server.grpc_url,
        ssl=True,
        root_certificates=str(ca_file),
        private_key=str(cert[1]) if cert else None,
        certificate_chain=str(cert[0]) if cert else None,
    )


def presented(port: int, ca: trustme.CA, *, grpc: bool = False) -> str:
    """The common name of the certificate a new connection to ``port`` is shown; the handshake verifies it
    against ``ca`` (ssl.SSLError when it is not signed by it)."""
    context = client_context(ca)
    if grpc:
        context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((HOST, port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname=HOST) as tls,
    ):
        peer = tls.getpeercert()
    assert peer is not None
    subject: Any = peer["subject"]  # typed as any of getpeercert()'s values
    return next(str(value) for rdn in subject for key, value in rdn if key == "commonName")


@pytest.fixture
def tls_server(pki: Pki, bundled_repository: Path) -> Iterator[Server]:
    with run_server([bundled_repository], *tls_flags(pki), "--metrics-use-ssl", tls=client_context(pki.ca)) as server:
        yield server


# --- plain TLS ----------------------------------------------------------------------------------------------


def test_tritonclient_over_tls_on_both_wires_and_metrics(tls_server: Server, pki: Pki) -> None:
    client = http_client(tls_server, pki.ca_file)
    assert_still_serving(client)
    # The other way tritonclient takes a context: a factory, here one that trusts the CA itself.
    factory = httpclient.InferenceServerClient(
        tls_server.http_url, ssl=True, ssl_context_factory=lambda: client_context(pki.ca)
    )
    assert factory.is_server_ready()
    assert_grpc_still_serving(grpc_client(tls_server, pki.ca_file))
    metrics = http.client.HTTPSConnection(HOST, tls_server.metrics_port, timeout=10, context=client_context(pki.ca))
    metrics.request("GET", "/metrics")
    reply = metrics.getresponse()
    assert reply.status == 200 and b"nv_inference_request_success" in reply.read()
    for port, grpc in ((tls_server.http_port, False), (tls_server.grpc_port, True), (tls_server.metrics_port, False)):
        assert presented(port, pki.ca, grpc=grpc) == "edged-1"
    # A client that trusts another CA is refused by its own side of the handshake.
    with pytest.raises(ssl.SSLCertVerificationError):
        presented(tls_server.http_port, trustme.CA())


def test_plaintext_clients_fail_cleanly_and_the_daemon_serves_on(tls_server: Server, pki: Pki) -> None:
    for port in (tls_server.http_port, tls_server.metrics_port):
        with pytest.raises((http.client.HTTPException, OSError)):
            request(f"{HOST}:{port}", "GET", "/v2/health/live", timeout=10)
    # The daemon closes the connection on the first bytes that are no TLS record.
    with pytest.raises(http.client.HTTPException, match="connection closed"):
        httpclient.InferenceServerClient(tls_server.http_url, network_timeout=10).is_server_live()
    with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        grpcclient.InferenceServerClient(tls_server.grpc_url).is_server_live(client_timeout=10)
    assert_still_serving(http_client(tls_server, pki.ca_file))
    assert_grpc_still_serving(grpc_client(tls_server, pki.ca_file))


def test_an_idle_tls_client_does_not_hold_the_shutdown(pki: Pki, bundled_repository: Path) -> None:
    # Closing TLS politely waits for the client's close_notify (asyncio: up to 30 s); run_server fails the test when
    # the daemon takes more than 10 s to stop.
    with run_server([bundled_repository], *tls_flags(pki), tls=client_context(pki.ca)) as server:
        sock = socket.create_connection((HOST, server.http_port), timeout=10)
        idle = client_context(pki.ca).wrap_socket(sock, server_hostname=HOST)
        idle.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
    idle.close()


def test_the_connection_limit_holds_over_tls(pki: Pki, bundled_repository: Path) -> None:
    with run_server(
        [bundled_repository],
        *tls_flags(pki),
        "--http-max-connections=2",
        "--metrics-use-ssl",
        f"--http-header-timeout-secs={HEADER_TIMEOUT_S}",
        tls=client_context(pki.ca),
    ) as server:
        # Each held connection is amid a request, its body awaited (the daemon says so with 100 Continue): at the
        # limit, a connection yet to send a request would be closed for the new one instead.
        context = client_context(pki.ca)
        held = [context.wrap_socket(socket.create_connection((HOST, server.http_port)), server_hostname=HOST)]
        held.append(context.wrap_socket(socket.create_connection((HOST, server.http_port)), server_hostname=HOST))
        try:
            for sock in held:
                sock.sendall(
                    b"POST /v2/logging HTTP/1.1\r\nHost: edged\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n"
                )
                assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue")
            # Counted once its handshake is done: the third is answered 503, over TLS, and closed.
            with context.wrap_socket(
                socket.create_connection((HOST, server.http_port), timeout=10), server_hostname=HOST
            ) as third:
                reply = third.recv(4096)
            assert reply.startswith(b"HTTP/1.1 503 "), reply
            assert b"too many connections" in reply
        finally:
            for sock in held:
                sock.close()
        # The held ones are gone: a client gets in again.
        deadline = time.monotonic() + 10
        while True:
            try:
                assert_still_serving(http_client(server, pki.ca_file))
                break
            except InferenceServerException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        # A client that never begins its handshake is closed within the header timeout, as one that never begins
        # its request is (the connection limit only counts a connection once its handshake is done).
        for port in (server.http_port, server.metrics_port):
            with socket.create_connection((HOST, port), timeout=HEADER_TIMEOUT_S + SLACK_S + 5) as silent:
                began = time.monotonic()
                assert silent.recv(1) == b""
                assert time.monotonic() - began < HEADER_TIMEOUT_S + SLACK_S


# --- mutual TLS ---------------------------------------------------------------------------------------------


def test_mutual_tls_refuses_strangers_and_maps_device_roles(pki: Pki, bundled_repository: Path) -> None:
    device = pki.client_files("device-7")
    flags = (*tls_flags(pki, mutual=True), "--client-certificate-role=device-7=operator", "--trust-loopback=false")
    with run_server([bundled_repository], *flags, tls=client_context(pki.ca, device)) as server:
        assert_still_serving(http_client(server, pki.ca_file, device))
        assert_grpc_still_serving(grpc_client(server, pki.ca_file, device))
        # The device's certificate stands for its role; another device of the same CA has none.
        assert http_client(server, pki.ca_file, device).get_log_settings()
        assert grpc_client(server, pki.ca_file, device).get_log_settings()
        other = pki.client_files("device-9")
        with pytest.raises(InferenceServerException, match="needs an API token"):
            http_client(server, pki.ca_file, other).get_log_settings()
        with pytest.raises(InferenceServerException, match="needs an API token"):
            grpc_client(server, pki.ca_file, other).get_log_settings()
        http_client(server, pki.ca_file, device).update_log_settings({"log_verbose_level": 0})
        assert "log settings changed over HTTP by certificate:device-7" in server.log()
        # No certificate, or one signed by another CA: refused in the handshake, on both wires.
        stranger = pki.client_files("stranger", trustme.CA())
        for cert in (None, stranger):
            # TLS 1.3: the client's side of the handshake ends first; the refusal comes as the connection closes.
            with pytest.raises((http.client.HTTPException, OSError)):
                http_client(server, pki.ca_file, cert).is_server_live()
            with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
                grpc_client(server, pki.ca_file, cert).is_server_live(client_timeout=10)
            with pytest.raises((ssl.SSLError, OSError)):
                context = client_context(pki.ca, cert)
                with context.wrap_socket(
                    socket.create_connection((HOST, server.http_port), timeout=10), server_hostname=HOST
                ) as tls:
                    # TLS 1.3 finishes the client's side first; the refusal arrives with the first read.
                    tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                    if not tls.recv(4096):
                        raise ConnectionResetError("closed without an answer")
        assert_still_serving(http_client(server, pki.ca_file, device))


# --- bad files ----------------------------------------------------------------------------------------------


def _start(bundled_repository: Path, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    http_port, metrics_port, grpc_port = free_ports(3)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "edged",
            "serve",
            f"--model-repository={bundled_repository}",
            f"--http-address={HOST}",
            f"--http-port={http_port}",
            f"--metrics-port={metrics_port}",
            f"--grpc-port={grpc_port}",
            f"--state-dir={tmp_path / 'state'}",
            *flags,
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_bad_files_fail_the_start_with_one_line(pki: Pki, bundled_repository: Path, tmp_path: Path) -> None:
    other_key = pki.client_files("other")[1]
    cases = {
        ("--grpc-use-ssl", f"--grpc-server-cert={pki.cert}", f"--grpc-server-key={other_key}"): (
            f"TLS certificate {pki.cert} and key {other_key} cannot be used together"
        ),
        ("--http-use-ssl", f"--http-server-cert={tmp_path / 'gone.pem'}", f"--http-server-key={pki.key}"): (
            f"TLS file {tmp_path / 'gone.pem'} cannot be read: No such file or directory"
        ),
        ("--grpc-use-ssl-mutual", f"--grpc-server-cert={pki.cert}", f"--grpc-server-key={pki.key}"): (
            "--grpc-use-ssl-mutual needs --grpc-root-cert"
        ),
        ("--http-use-ssl",): "--http-use-ssl needs --http-server-cert and --http-server-key",
        ("--metrics-use-ssl",): "--metrics-use-ssl needs --http-server-cert and --http-server-key",
    }
    for flags, line in cases.items():
        done = _start(bundled_repository, tmp_path, *flags)
        output = done.stdout + done.stderr
        assert done.returncode == 1, output
        [error] = [text for text in output.splitlines() if "exiting:" in text]
        assert line in error, output
        assert "Traceback" not in output
        # Refused before any model loads.
        assert "loading models from" not in output, output


# --- rotation -----------------------------------------------------------------------------------------------


def _reload(server: Server, count: int, keep_sending: list[object]) -> None:
    """SIGHUP, then infer on every client in ``keep_sending`` until the ``count``-th reload is done."""
    server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    while server.log().count("reload done") < count:
        assert time.monotonic() < deadline, f"no reload within {RELOAD_TIMEOUT_S:.0f} s:\n{server.log()}"
        for client in keep_sending:
            if isinstance(client, httpclient.InferenceServerClient):
                assert_still_serving(client)
            elif isinstance(client, grpcclient.InferenceServerClient):
                assert_grpc_still_serving(client)


def test_sighup_rotates_the_certificates_without_dropping_connections(tls_server: Server, pki: Pki) -> None:
    # Held open through both reloads and trusting the first CA only: had either reconnected, it would fail.
    held_http = http_client(tls_server, pki.ca_file)
    held_grpc = grpc_client(tls_server, pki.ca_file)
    assert_still_serving(held_http)
    assert_grpc_still_serving(held_grpc)

    second = trustme.CA()
    second_file = pki.dir / "second-ca.pem"
    second_file.write_bytes(second.cert_pem.bytes())
    pki.issue(second, "edged-2")
    _reload(tls_server, 1, [held_http, held_grpc])
    ports = ((tls_server.http_port, False), (tls_server.grpc_port, True), (tls_server.metrics_port, False))
    for port, grpc in ports:
        assert presented(port, second, grpc=grpc) == "edged-2"
        with pytest.raises(ssl.SSLCertVerificationError):
            presented(port, pki.ca, grpc=grpc)
    assert_still_serving(http_client(tls_server, second_file))
    assert_grpc_still_serving(grpc_client(tls_server, second_file))
    log = tls_server.log()
    assert f"reload: the HTTP endpoint's TLS certificate was re-read from {pki.cert}" in log
    assert f"reload: the gRPC endpoint's TLS certificate was re-read from {pki.cert}" in log

    # A key that does not match the certificate: each endpoint keeps the second pair and says why, in one line.
    pki.key.write_bytes(pki.client_files("mismatch")[1].read_bytes())
    _reload(tls_server, 2, [held_http, held_grpc])
    for port, grpc in ports:
        assert presented(port, second, grpc=grpc) == "edged-2"
    why = f"TLS certificate {pki.cert} and key {pki.key} cannot be used together"
    for endpoint in ("HTTP", "gRPC"):
        assert f"reload: the {endpoint} endpoint keeps its TLS certificate: {why}" in tls_server.log()
    assert_still_serving(held_http)
    assert_grpc_still_serving(held_grpc)
    assert_still_serving(http_client(tls_server, second_file))
