"""The gRPC endpoint of a frontend worker process (edged.daemon.workers): ModelInfer and ModelStreamInfer are
decoded and answered here, their requests run by the daemon (edged.frontends.relay.remote); every other RPC is
passed to the daemon's own gRPC server on its Unix socket as the client sent it, bytes and metadata, with the
client's address, and its answer or status passed back.

The worker shares the daemon's port (SO_REUSEPORT): the kernel gives each new connection to one of them.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Final, cast

from edged.frontends.grpc.access import HEALTH_SERVICE, INFERENCE_SERVICE, RELAYED_PEER, guard
from edged.frontends.grpc.calls import Call, Method, methods
from edged.frontends.grpc.core import import_core
from edged.frontends.grpc.server import GrpcServer, Servicers
from edged.frontends.grpc.service import GrpcOptions, InferenceServicer
from edged.proto import grpc_service_pb2 as pb
from edged.proto import health_pb2

import_core()  # before grpc is first imported: the relay's channel is grpc's

import grpc  # noqa: E402

if TYPE_CHECKING:
    from edged.core.access import AccessPolicy
    from edged.core.service import InferencePath, InferenceService

_INFERENCE: Final = "inference.GRPCInferenceService"
_HEALTH: Final = "grpc.health.v1.Health"
# The RPCs a worker answers itself; the others are the daemon's.
_LOCAL: Final = frozenset({"ModelInfer", "ModelStreamInfer"})
# The daemon's RPCs whose replies are a stream (the request is one message).
_SERVER_STREAMING: Final = frozenset({"Watch"})
# A health watch that last said SERVING says NOT_SERVING when the worker stops, as the daemon's own watches do.
_SERVING: Final = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING).SerializeToString()
_NOT_SERVING: Final = health_pb2.HealthCheckResponse(
    status=health_pb2.HealthCheckResponse.NOT_SERVING
).SerializeToString()
# Metadata grpc sets on a call itself: never copied onto the relayed one.
_TRANSPORT_KEYS: Final = frozenset({"user-agent", "te", "content-type", "authority", "host"})
# The metadata keys grpc's client sends: any other fails the relayed call before it leaves ("Unexpected
# ExecuteBatchError"), though HTTP/2 allows many more (RFC 9113 §8.2.1: `x!key`, `a^b`, `key~`).
_LEGAL_KEY: Final = re.compile(r"[-.0-9_a-z]+").fullmatch


def _relayable(key: str, value: str | bytes) -> bool:
    """Whether the client's metadata entry is copied onto the relayed call. Those of the transport, grpc's own and
    RELAYED_PEER (which only this worker says) never are; nor is what grpc's client refuses: a key of other
    characters than ``_LEGAL_KEY``'s, or, for a key not ending in ``-bin``, a value with a byte outside printable
    ASCII (0x20-0x7E; RFC 9113 allows 0x7F and 0x80-0xFF). Dropping such an entry cannot let a call through that
    should be refused: the daemon checks the credentials it carries (``authorization``, ``triton-grpc-protocol-*``),
    and without them refuses the call, as it refuses a client that sent none."""
    if key in _TRANSPORT_KEYS or key == RELAYED_PEER or key.startswith("grpc-") or _LEGAL_KEY(key) is None:
        return False
    if key.endswith("-bin"):
        return True  # decoded from base64 by the Call: any bytes
    return isinstance(value, str) and value.isascii() and value.isprintable()


class RelayingServer:
    """The worker's gRPC endpoint on its socket, which shares the daemon's port."""

    def __init__(
        self,
        service: InferencePath,
        sock: socket.socket,
        options: GrpcOptions,
        access: AccessPolicy,
        daemon_socket: str,
    ) -> None:
        self._daemon = grpc.aio.insecure_channel(
            f"unix:{daemon_socket}",
            options=[
                ("grpc.max_receive_message_length", options.max_message_size),
                ("grpc.max_send_message_length", options.max_message_size),
            ],
        )
        # Only the inference RPCs of the servicer are ever served, and they call nothing but the inference path.
        servicer = InferenceServicer(
            cast("InferenceService", service),
            options.max_queued_stream_bytes,
            options.forward_pattern,
            options.response_pool,
        )
        guard(servicer, access, {name: INFERENCE_SERVICE[name] for name in _LOCAL})
        served = methods([(servicer, pb.DESCRIPTOR.services_by_name["GRPCInferenceService"])])
        table = {path: method for path, method in served.items() if path.rpartition(b"/")[2].decode() in _LOCAL}
        for service_name, names in ((_INFERENCE, INFERENCE_SERVICE), (_HEALTH, HEALTH_SERVICE)):
            for name in names:
                path = f"/{service_name}/{name}"
                if name in _SERVER_STREAMING:
                    table[path.encode()] = Method(bytes, self._relay_stream(path), False, server_streaming=True)
                elif name not in _LOCAL:
                    table[path.encode()] = Method(bytes, self._relay(path), streaming=False)
        # The relayed streams in progress, ended when the worker stops (the daemon may outlive it).
        self._streams: set[grpc.aio.UnaryStreamCall[bytes, bytes]] = set()
        self._closing = False
        self._server = GrpcServer(table, sock, options, servicer=Servicers(servicer, self))

    def _relay(self, method: str) -> Callable[[bytes, Call], Awaitable[bytes]]:
        call = self._daemon.unary_unary(method)

        async def relayed(request: bytes, context: Call) -> bytes:
            metadata = [(key, value) for key, value in context.invocation_metadata() if _relayable(key, value)]
            metadata.append((RELAYED_PEER, context.peer()))
            try:
                reply: bytes = await call(request, metadata=metadata, timeout=context.time_remaining())
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
            return reply

        return relayed

    def _relay_stream(self, method: str) -> Callable[[bytes, Call], AsyncIterator[bytes]]:
        open_call = self._daemon.unary_stream(method)

        async def relayed(request: bytes, context: Call) -> AsyncIterator[bytes]:
            metadata = [(key, value) for key, value in context.invocation_metadata() if _relayable(key, value)]
            metadata.append((RELAYED_PEER, context.peer()))
            call = open_call(request, metadata=metadata, timeout=context.time_remaining())
            self._streams.add(call)
            last = b""
            try:
                async for reply in call:
                    last = reply
                    yield reply
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
            except asyncio.CancelledError:
                # The worker stops and cancelled the relayed call: its client's stream ends as the daemon's would.
                if not (self._closing and call.cancelled()):
                    raise
                if last == _SERVING:
                    yield _NOT_SERVING
            finally:
                self._streams.discard(call)

        return relayed

    def close_streams(self) -> None:
        self._closing = True
        for call in list(self._streams):
            call.cancel()

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop()
        await self._daemon.close()
