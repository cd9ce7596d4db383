"""edged.frontends.tls with certificates made by trustme: real handshakes in memory (ssl.MemoryBIO) between a client
context and the server context edged builds, plain and mutual, and one clear error for each kind of bad file."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc
import pytest
import trustme

from edged.frontends.tls import TlsError, TlsFiles, grpc_credentials, http_context


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture
def pki(tmp_path: Path) -> tuple[trustme.CA, TlsFiles]:
    ca = trustme.CA()
    server = ca.issue_cert("edged.local")
    cert = _write(tmp_path / "server.pem", b"".join(blob.bytes() for blob in server.cert_chain_pems))
    key = _write(tmp_path / "server.key", server.private_key_pem.bytes())
    return ca, TlsFiles(cert, key)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """Drive a TLS handshake between the two contexts through memory, raising what either side raises."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    from_server, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(from_server, from_client, server_hostname="edged.local")
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, side in (("client", client_side), ("server", server_side)):
            if done[name]:
                continue
            try:
                side.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
        # Carry what each side wrote to the other.
        to_server.write(from_client.read())
        from_server.write(to_client.read())
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


def test_a_client_that_trusts_the_ca_connects(pki: tuple[trustme.CA, TlsFiles]) -> None:
    ca, files = pki
    client = ssl.create_default_context()
    ca.configure_trust(client)
    _handshake(http_context(files), client)


def test_mutual_tls_refuses_a_client_without_a_certificate(pki: tuple[trustme.CA, TlsFiles], tmp_path: Path) -> None:
    ca, files = pki
    mutual = TlsFiles(files.cert, files.key, _write(tmp_path / "clients.pem", ca.cert_pem.bytes()))
    anonymous = ssl.create_default_context()
    ca.configure_trust(anonymous)
    with pytest.raises(ssl.SSLError):
        _handshake(http_context(mutual), anonymous)
    device = ssl.create_default_context()
    ca.configure_trust(device)
    ca.issue_cert("device-7").configure_cert(device)
    _handshake(http_context(mutual), device)


def test_bad_files_are_named(pki: tuple[trustme.CA, TlsFiles], tmp_path: Path) -> None:
    _, files = pki
    other = trustme.CA().issue_cert("elsewhere")
    wrong_key = _write(tmp_path / "other.key", other.private_key_pem.bytes())
    cases = {
        TlsFiles(tmp_path / "missing.pem", files.key): "cannot be read",
        TlsFiles(_write(tmp_path / "text.pem", b"hello"), files.key): "is not PEM",
        TlsFiles(files.cert, wrong_key): "cannot be used together",
    }
    for bad, why in cases.items():
        with pytest.raises(TlsError, match=why):
            http_context(bad)
        with pytest.raises(TlsError, match=why):
            grpc_credentials(bad)


def test_grpc_credentials_from_the_same_files(pki: tuple[trustme.CA, TlsFiles]) -> None:
    _, files = pki
    assert isinstance(grpc_credentials(files), grpc.ServerCredentials)
