"""The one place TLS is set up, for every endpoint: each gets an ``ssl.SSLContext`` (the gRPC endpoint's also offers
HTTP/2 by ALPN), from its files, checked the same way.

A server certificate and its key are always given together; a client CA makes TLS mutual (a client without a
certificate signed by it is refused during the handshake). TLS 1.2 is the oldest version accepted. Every problem
with the files (unreadable, not PEM, a key that does not match its certificate) is a ``TlsError`` with one line that
names the file, raised when the context is built, so that a bad pair fails the start (or is refused by a reload)
instead of the first client's handshake.

Rotation (SIGHUP): ``HttpTls`` and ``GrpcTls`` hold an endpoint's TLS for its whole life and take a new pair with
``rotate``, which builds and checks it whole first, so that a bad pair raises and the old one stays. Connections
already open keep the session they negotiated; new handshakes get the new pair.

A verified client certificate can stand for a device's identity: ``peer_identity_http`` and ``peer_identity_grpc``
give its subject's common name, for whatever maps identities to permissions.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final


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
    # No session resumption: a resumed session skips the certificates, so after a rotation a client could go on
    # without seeing the new certificate, or without its own being verified against the new client CA. Clients
    # keep their connections open; a full handshake per new connection is the price.
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
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


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsError(f"TLS file {path} cannot be read: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"TLS file {path} is not PEM (no BEGIN line)")
    return data


class HttpTls:
    """The server context of an HTTP endpoint (uvicorn's ``ssl=``), whose certificate can be replaced while it
    serves.

    asyncio takes one context when the server is created and keeps it. Loading a new pair into that context in
    place would leave it half-changed when the load fails part-way, and a client CA can only be added to a context,
    never removed; so ``context`` only dispatches: its SNI callback, which OpenSSL runs on every ClientHello (with
    or without a server name), moves each new connection onto the current context, a complete one built by
    ``rotate``."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self.context = self._build(files)
        self._current = self.context
        self.context.sni_callback = self._select

    def rotate(self, files: TlsFiles) -> None:
        """New handshakes use ``files`` from now on; raises TlsError (and changes nothing) when they cannot be
        used. Whether clients must present a certificate is the start's: it is set on the listening context."""
        if (files.client_ca is None) != (self.files.client_ca is None):
            raise TlsError("mutual TLS cannot be turned on or off by a reload: restart edged to change it")
        self._current = self._build(files)
        self.files = files

    def _build(self, files: TlsFiles) -> ssl.SSLContext:
        return http_context(files)

    def _select(self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, given: ssl.SSLContext) -> None:
        current = self._current
        if current is not given:
            connection.context = current


class GrpcTls(HttpTls):
    """As HttpTls, for the gRPC endpoint: every context also offers HTTP/2 by ALPN, which gRPC clients require."""

    def _build(self, files: TlsFiles) -> ssl.SSLContext:
        context = http_context(files)
        context.set_alpn_protocols(["h2"])
        return context


# --- the peer's identity ------------------------------------------------------------------------------------

# TLS versions as the ASGI TLS extension numbers them (the protocol's own code points).
_TLS_VERSIONS: Final = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}
# RFC 4514 short names of the attributes a certificate subject usually has.
_SHORT_NAMES: Final = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_DN_SPECIAL: Final = re.compile(r'([,+"\\<>;=])')
_DN_PART: Final = re.compile(r"((?:[^,+\\]|\\.)+)([,+]?)")


def asgi_tls_extension(transport: Any) -> dict[str, Any] | None:
    """The ASGI TLS extension (``scope["extensions"]["tls"]``) for a connection, or None when it is plain: the
    verified client certificate's subject as an RFC 4514 name (None without one) and the TLS version."""
    connection = transport.get_extra_info("ssl_object")
    if connection is None:
        return None
    peer = connection.getpeercert()
    der = connection.getpeercert(binary_form=True)
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": _rfc4514(peer["subject"]) if peer else None,
        "client_cert_error": None,
        "tls_version": _TLS_VERSIONS.get(connection.version() or ""),
        "cipher_suite": None,
    }


def peer_identity_http(scope_or_transport: Mapping[str, Any] | Any) -> str | None:
    """The common name (CN) of the client certificate verified on an HTTP connection, given the request's ASGI
    scope or the connection's transport; None for a plain connection or a client that presented none."""
    if isinstance(scope_or_transport, Mapping):
        tls = scope_or_transport.get("extensions", {}).get("tls")
        name = tls.get("client_cert_name") if tls else None
        return _common_name_of(name) if name else None
    return peer_identity_transport(scope_or_transport)


def peer_identity_transport(transport: Any) -> str | None:
    """The common name (CN) of the client certificate verified on an asyncio transport; None for a plain
    connection or a client that presented none."""
    try:
        connection = transport.get_extra_info("ssl_object")
    except AttributeError:  # asyncio's TLS transport, once its connection is lost, has nothing to say
        return None
    peer = connection.getpeercert() if connection is not None else None
    return _common_name(peer["subject"]) if peer else None


def peer_identity_grpc(context: Any) -> str | None:
    """The common name (CN) of the client certificate verified on a gRPC call's connection; None without one."""
    names = context.auth_context().get("x509_common_name")
    return names[0].decode("utf-8", "replace") if names else None


def _common_name(subject: Any) -> str | None:
    # getpeercert()'s subject: a tuple of RDNs, each a tuple of (attribute, value) pairs; the most specific last.
    names = [value for rdn in subject for attribute, value in rdn if attribute == "commonName"]
    return str(names[-1]) if names else None


def _rfc4514(subject: Any) -> str:
    rdns = reversed(subject)  # RFC 4514 writes the most specific RDN first
    return ",".join(
        "+".join(f"{_SHORT_NAMES.get(attribute, attribute)}={_escape(str(value))}" for attribute, value in rdn)
        for rdn in rdns
    )


def _escape(value: str) -> str:
    escaped = _DN_SPECIAL.sub(r"\\\1", value)
    if escaped.startswith((" ", "#")):
        escaped = "\\" + escaped
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return escaped


def _common_name_of(name: str) -> str | None:
    """The first (most specific) CN of an RFC 4514 name."""
    for part, _ in _DN_PART.findall(name):
        attribute, _, value = part.partition("=")
        if attribute.strip().upper() == "CN":
            return re.sub(r"\\(.)", r"\1", value)
    return None
