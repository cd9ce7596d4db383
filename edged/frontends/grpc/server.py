"""The gRPC endpoint: ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` over edged's own HTTP/2
(edged.frontends.grpc.http2 and calls) on the daemon's event loop, in plain TCP or TLS, and on the Unix socket that
frontend workers relay calls to.

Connections are bounded as the HTTP endpoint's are: at ``max_connections`` a new one takes the place of the oldest
connection that has not finished its HTTP/2 handshake, else of the one idle longest (no call open; it is sent
GOAWAY), so that half-open connections cost their sender, not the device's clients; only when every connection has
a call open is the new one closed at once. The frontend workers' relay connections are never the ones closed. A
connection must finish its TLS and HTTP/2 handshakes within the handshake timeout; one without calls for the idle
timeout is sent GOAWAY and closed; a request must arrive at the minimum body rate; the request bytes every
connection holds together are bounded (edged.frontends.grpc.bounds states the rest).

Stopping: the ports close, every connection is sent GOAWAY (so clients open no new call on it), open streams stop
reading and answer what they have, health watches end, and calls still running after the grace period are
cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import TYPE_CHECKING, Any, Final, Protocol

from edged.frontends.grpc.access import HEALTH_SERVICE, INFERENCE_SERVICE, guard
from edged.frontends.grpc.bounds import Budget, ConnectionTimes
from edged.frontends.grpc.calls import Call, Limits, Method, finish, inflater_of, methods, timeout_of
from edged.frontends.grpc.frames import header_block
from edged.frontends.grpc.health import HealthServicer
from edged.frontends.grpc.http2 import Http2Connection
from edged.frontends.grpc.service import GrpcOptions, InferenceServicer
from edged.frontends.grpc.status import StatusCode
from edged.proto import grpc_service_pb2 as pb
from edged.proto import health_pb2

if TYPE_CHECKING:
    from edged.core.access import AccessPolicy
    from edged.core.service import InferenceService
    from edged.frontends.grpc.streams import Stream, StreamHandler

log = logging.getLogger(__name__)

_BACKLOG: Final = 1024


class Streaming(Protocol):
    """What holds streams that a client may keep open for good, which the server ends when it stops."""

    def close_streams(self) -> None: ...


class Servicers:
    """Several servicers' streams, ended together."""

    def __init__(self, *parts: Streaming) -> None:
        self._parts = parts

    def close_streams(self) -> None:
        for part in self._parts:
            part.close_streams()


def inference_methods(
    service: InferenceService, options: GrpcOptions, access: AccessPolicy | None
) -> tuple[dict[bytes, Method], Streaming]:
    """Both services' RPCs, each behind ``access`` when given; and their servicers, whose streams ``stop`` ends."""
    servicer = InferenceServicer(
        service, options.max_queued_stream_bytes, options.forward_pattern, options.response_pool
    )
    health = HealthServicer(service)
    if access is not None:
        guard(servicer, access, INFERENCE_SERVICE)
        guard(health, access, HEALTH_SERVICE)
    table = methods(
        [
            (servicer, pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]),
            (health, health_pb2.DESCRIPTOR.services_by_name["Health"]),
        ]
    )
    return table, Servicers(servicer, health)


class GrpcServer:
    """RPCs served on edged's HTTP/2, on the running event loop."""

    def __init__(
        self,
        table: dict[bytes, Method],
        sock: socket.socket,
        options: GrpcOptions,
        tls: ssl.SSLContext | None = None,
        relay_socket: str | None = None,
        servicer: Streaming | None = None,
    ) -> None:
        """``table``: the RPCs by path (``inference_methods``). ``sock``: the bound TCP socket. ``tls``: serve TLS
        with this context (which must offer ``h2`` by ALPN). ``relay_socket``: also serve on this Unix socket, for
        the calls frontend workers relay (edged.frontends.grpc.relay). ``servicer``: its open streams are ended
        first when the server stops."""
        self._methods = table
        self._sock = sock
        self._options = options
        self._tls = tls
        self._relay_socket = relay_socket
        self._servicer = servicer
        self._limits = Limits(options.max_message_size)
        self._budget = Budget(options.max_buffered_bytes, options.max_message_size)
        self._times = ConnectionTimes(
            options.handshake_timeout_s, options.idle_timeout_s, options.body_timeout_s, options.min_body_rate
        )
        # The open connections, each with its peer as grpc writes it.
        self._peers: dict[Http2Connection, str] = {}
        # Connections in the order they opened, to be closed first at the limit while their handshake is not done;
        # one that finished it is dropped from here only when the limit next looks (each at most once).
        self._unsettled: dict[Http2Connection, None] = {}
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        options = self._options
        self._servers.append(
            await loop.create_server(
                self._connection,
                sock=self._sock,
                ssl=self._tls,
                ssl_handshake_timeout=options.handshake_timeout_s if self._tls is not None else None,
                backlog=_BACKLOG,
            )
        )
        if self._relay_socket is not None:
            self._servers.append(await loop.create_unix_server(self._connection, self._relay_socket, backlog=_BACKLOG))

    async def stop(self) -> None:
        """New calls are refused at once; calls in flight get the grace period, then are cancelled."""
        for server in self._servers:
            server.close()
        if self._servicer is not None:
            self._servicer.close_streams()
        for connection in list(self._peers):
            connection.go_away()
        tasks = set(self._limits.tasks)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self._options.shutdown_grace_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for connection in list(self._peers):
            connection.abort()

    def _connection(self) -> Http2Connection:
        return Http2Connection(self._stream, self._opened, self._closed, self._times, self._budget)

    def _opened(self, connection: Http2Connection) -> bool:
        if len(self._peers) >= self._options.max_connections and not self._make_room():
            log.debug("gRPC connection refused: %d connections are open, each with a call", len(self._peers))
            return False
        peer = _peer(connection.transport)
        self._peers[connection] = peer
        if not peer.startswith("unix:"):
            self._unsettled[connection] = None
        return True

    def _closed(self, connection: Http2Connection) -> None:
        self._peers.pop(connection, None)
        self._unsettled.pop(connection, None)

    def _make_room(self) -> bool:
        """At the limit: close the oldest connection still in its handshake, else the one idle longest, so that a
        new one can be served; False when every connection (but the workers' relays) has a call open."""
        victim: Http2Connection | None = None
        while self._unsettled and victim is None:
            oldest = next(iter(self._unsettled))
            del self._unsettled[oldest]
            if not oldest.settled and not oldest.closed:
                victim = oldest
        if victim is None:
            since = float("inf")
            for connection, peer in self._peers.items():
                idle = connection.idle_since()
                if idle is not None and idle < since and not peer.startswith("unix:"):
                    victim, since = connection, idle
        if victim is None:
            return False
        log.debug("gRPC connection of %s closed to admit a new one at the connection limit", self._peers[victim])
        self._peers.pop(victim, None)
        victim.evict()
        return True

    def _stream(self, stream: Stream, headers: list[tuple[bytes, bytes]]) -> StreamHandler | None:
        path = verb = kind = timeout = encoding = None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b":method":
                verb = value
            elif name == b"content-type":
                kind = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
        if verb != b"POST":
            stream.send_headers(header_block([(b":status", b"405")]), end_stream=True)
            return None
        if kind is None or not kind.startswith(b"application/grpc"):
            stream.send_headers(header_block([(b":status", b"415")]), end_stream=True)
            return None
        method = self._methods.get(path) if path is not None else None
        if method is None:
            finish(stream, StatusCode.UNIMPLEMENTED, "Method not found!")
            return None
        try:
            inflate = inflater_of(encoding)
        except KeyError:
            finish(stream, StatusCode.UNIMPLEMENTED, f"Compression algorithm '{encoding!r}' is not supported")
            return None
        seconds = timeout_of(timeout) if timeout is not None else None
        if seconds is not None and seconds <= 0:
            finish(stream, StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            return None
        return Call(stream, method, headers, self._peers[stream.connection], self._limits, seconds, inflate)


def _peer(transport: Any) -> str:
    """The peer as grpc writes it: ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000`` or ``unix:<path>``."""
    sock = transport.get_extra_info("socket")
    address = transport.get_extra_info("peername")
    if sock is not None and sock.family == socket.AF_UNIX:
        return f"unix:{transport.get_extra_info('sockname') or ''}"
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        if ":" in host:
            if host.startswith("::ffff:") and "." in host:
                return f"ipv4:{host[7:]}:{port}"
            return f"ipv6:[{host}]:{port}"
        return f"ipv4:{host}:{port}"
    return "unknown"
