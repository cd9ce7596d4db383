"""The one place TLS is set up, for every endpoint: the HTTP and metrics servers get an ``ssl.SSLContext``, the gRPC
server grpc's ``ServerCredentials``, both from the same files, checked the same way.

A server certificate and its key are always given together; a client CA makes TLS mutual (a client without a
certificate signed by it is refused during the handshake). TLS 1.2 is the oldest version accepted. Every problem
with the files (unreadable, not PEM, a key that does not match its certificate) is a ``TlsError`` with one line that
names the file, raised when the context is built, so that a bad pair fails the start (or is refused by a reload)
instead of the first client's handshake.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


class TlsError(Exception):
    """The TLS files cannot be used; the message is one line naming the file and why."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path  # PEM: the server's certificate, then any intermediate certificates
    key: Path  # PEM: its private key
    client_ca: Path | None = None  # PEM: the CA client certificates must be signed by (mutual TLS)


def http_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context for uvicorn (``ssl=``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _read(files.cert)
    _read(files.key)
    try:
        context.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as exc:
        raise TlsError(
            f"TLS certificate {files.cert} and key {files.key} cannot be used together: {exc.reason}"
        ) from None
    if files.client_ca is not None:
        _read(files.client_ca)
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except ssl.SSLError as exc:
            raise TlsError(f"TLS client CA {files.client_ca} is not a PEM certificate: {exc.reason}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def grpc_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Credentials for ``server.add_secure_port``. The pair is checked with the standard library first, since grpc
    would only find a mismatch when the port is added (with a less precise message)."""
    http_context(files)
    root = _read(files.client_ca) if files.client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(_read(files.key), _read(files.cert))], root_certificates=root, require_client_auth=root is not None
    )


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsError(f"TLS file {path} cannot be read: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"TLS file {path} is not PEM (no BEGIN line)")
    return data
