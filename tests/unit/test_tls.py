"""edged.frontends.tls with certificates made by trustme: real handshakes in memory (ssl.MemoryBIO) between a client
context and the server context edged builds, plain and mutual, and one clear error for each kind of bad file; the
peer's identity as real HTTP (uvicorn with edged's protocol) and gRPC servers in the test's process see it."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import ssl
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
import trustme
import uvicorn

from edged.frontends.grpc.bounds import Budget, ConnectionTimes
from edged.frontends.grpc.calls import Call, Limits, Method
from edged.frontends.grpc.http2 import Http2Connection
from edged.frontends.http.limits import ConnectionLimits, LimitedHttpProtocol
from edged.frontends.tls import (
    GrpcTls,
    HttpTls,
    TlsError,
    TlsFiles,
    http_context,
    peer_identity_grpc,
    peer_identity_http,
)

if TYPE_CHECKING:
    from edged.frontends.grpc.streams import Stream


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
            GrpcTls(bad)


def test_the_grpc_context_offers_http2_before_and_after_a_rotation(pki: tuple[trustme.CA, TlsFiles]) -> None:
    # gRPC clients refuse a server that does not select h2 by ALPN.
    ca, files = pki
    tls = GrpcTls(files)
    for _ in range(2):
        client = ssl.create_default_context()
        ca.configure_trust(client)
        client.set_alpn_protocols(["h2"])
        to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
        server_side = tls.context.wrap_bio(to_server, to_client, server_side=True)
        from_server, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
        client_side = client.wrap_bio(from_server, from_client, server_hostname="edged.local")
        for _ in range(10):
            for side in (client_side, server_side):
                with contextlib.suppress(ssl.SSLWantReadError):
                    side.do_handshake()
            to_server.write(from_client.read())
            from_server.write(to_client.read())
        assert client_side.selected_alpn_protocol() == "h2"
        tls.rotate(files)


# --- the peer's identity, through real servers --------------------------------------------------------------


def _mutual(tmp_path: Path, ca: trustme.CA, files: TlsFiles) -> TlsFiles:
    return TlsFiles(files.cert, files.key, _write(tmp_path / "clients.pem", ca.cert_pem.bytes()))


def _client_pair(tmp_path: Path, ca: trustme.CA, name: str) -> tuple[Path, Path]:
    leaf = ca.issue_cert("device.local", common_name=name)
    cert = _write(tmp_path / "device.pem", b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return cert, _write(tmp_path / "device.key", leaf.private_key_pem.bytes())


async def _who_over_http(tls: HttpTls, ca: trustme.CA, client_cert: tuple[Path, Path] | None) -> list[str]:
    """What a request's ASGI scope and its connection's transport say of the peer, seen by an app behind the HTTP
    endpoint's protocol (uvicorn with edged's connection bounds)."""
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(str(peer_identity_http(scope)))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    protocol = LimitedHttpProtocol.limited(ConnectionLimits(), "test")
    original = protocol.connection_made
    from_transport: list[str] = []

    def connection_made(self: LimitedHttpProtocol, transport: Any) -> None:
        from_transport.append(str(peer_identity_http(transport)))
        original(self, transport)

    protocol.connection_made = connection_made  # type: ignore[method-assign]
    config = uvicorn.Config(
        app, http=protocol, loop="none", lifespan="off", log_config=None, ssl_context_factory=lambda _c, _d: tls.context
    )
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)

    def get() -> None:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        context.check_hostname = False  # the certificate names "edged.local"; its signature is still verified
        if client_cert is not None:
            context.load_cert_chain(*client_cert)
        conn = http.client.HTTPSConnection("127.0.0.1", sock.getsockname()[1], timeout=10, context=context)
        conn.request("GET", "/")
        assert conn.getresponse().status == 200
        conn.close()

    try:
        await asyncio.to_thread(get)
    finally:
        server.should_exit = True
        await task
        sock.close()
    return seen + from_transport


def test_the_http_peer_identity_is_the_verified_certificates_common_name(
    pki: tuple[trustme.CA, TlsFiles], tmp_path: Path
) -> None:
    ca, files = pki
    # Characters RFC 4514 escapes, so the scope's name must be read back exactly.
    name = 'device-7, site "A"+B'
    device = _client_pair(tmp_path, ca, name)
    assert asyncio.run(_who_over_http(HttpTls(_mutual(tmp_path, ca, files)), ca, device)) == [name, name]
    # Plain TLS asks for no certificate: no identity, from the scope or the transport.
    assert asyncio.run(_who_over_http(HttpTls(files), ca, device)) == ["None", "None"]


class _Reply(bytes):
    def SerializeToString(self) -> bytes:
        return bytes(self)


async def _who_over_grpc(tls: GrpcTls, ca: trustme.CA, client_cert: tuple[Path, Path] | None) -> str:
    """What a call's context says of the peer, on edged's HTTP/2 and gRPC call layers behind the endpoint's TLS."""

    async def who(request: bytes, context: Call) -> _Reply:
        return _Reply(str(peer_identity_grpc(context)).encode())

    method = Method(bytes, who, streaming=False)
    limits = Limits(1 << 20)
    budget = Budget(1 << 24, 1 << 20)

    def on_stream(stream: Stream, headers: list[tuple[bytes, bytes]]) -> Call:
        return Call(stream, method, headers, "ipv4:127.0.0.1:1", limits, None, None)

    def connection() -> Http2Connection:
        return Http2Connection(on_stream, lambda _c: True, lambda _c: None, ConnectionTimes(10.0, 10.0), budget)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(connection, "127.0.0.1", 0, ssl=tls.context)
    port = server.sockets[0].getsockname()[1]
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=client_cert[1].read_bytes() if client_cert else None,
        certificate_chain=client_cert[0].read_bytes() if client_cert else None,
    )
    try:
        # The server's certificate names "edged.local"; the channel connects by address.
        options = [("grpc.ssl_target_name_override", "edged.local")]
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options) as channel:
            reply = await channel.unary_unary("/test.Peer/Who")(b"", timeout=10)
    finally:
        server.close()
    assert isinstance(reply, bytes)
    return reply.decode()


def test_the_grpc_peer_identity_is_the_verified_certificates_common_name(
    pki: tuple[trustme.CA, TlsFiles], tmp_path: Path
) -> None:
    ca, files = pki
    device = _client_pair(tmp_path, ca, "device-7")
    assert asyncio.run(_who_over_grpc(GrpcTls(_mutual(tmp_path, ca, files)), ca, device)) == "device-7"
    assert asyncio.run(_who_over_grpc(GrpcTls(files), ca, None)) == "None"


def test_a_rotation_that_cannot_be_used_changes_nothing(pki: tuple[trustme.CA, TlsFiles], tmp_path: Path) -> None:
    ca, files = pki
    bad = TlsFiles(files.cert, _write(tmp_path / "other.key", trustme.CA().issue_cert("x").private_key_pem.bytes()))
    for tls in (HttpTls(files), GrpcTls(files)):
        with pytest.raises(TlsError, match="cannot be used together"):
            tls.rotate(bad)
        with pytest.raises(TlsError, match="mutual TLS cannot be turned on or off"):
            tls.rotate(_mutual(tmp_path, ca, files))
        assert tls.files == files


def test_sessions_are_not_resumed(pki: tuple[trustme.CA, TlsFiles]) -> None:
    """A resumed session would skip the certificates, and with them a rotation's new pair or client CA."""
    ca, files = pki
    server = http_context(files)
    server_socket = socket.create_server(("127.0.0.1", 0))
    port = server_socket.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            connection, _ = server_socket.accept()
            with server.wrap_socket(connection, server_side=True) as tls:
                tls.sendall(b"x")

    thread = threading.Thread(target=serve)
    thread.start()
    client = ssl.create_default_context()
    ca.configure_trust(client)
    client.check_hostname = False
    session = None
    try:
        for _ in range(2):
            with client.wrap_socket(socket.create_connection(("127.0.0.1", port)), session=session) as tls:
                tls.recv(1)
                assert not tls.session_reused
                session = tls.session
    finally:
        thread.join(10)
        server_socket.close()
