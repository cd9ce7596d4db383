"""The gRPC endpoint of a frontend worker process (edged.daemon.workers): ModelInfer and ModelStreamInfer are
decoded and answered here, their requests run by the daemon (edged.frontends.relay.remote); every other RPC is
passed to the daemon's own gRPC server on its Unix socket as the client sent it, bytes and metadata, with the
client's address, and its answer or status passed back.

The worker shares the daemon's port (SO_REUSEPORT): the kernel gives each new connection to one of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, cast

import grpc

from edged.frontends.grpc.access import HEALTH_SERVICE, INFERENCE_SERVICE, RELAYED_PEER, guard
from edged.frontends.grpc.service import GrpcOptions, InferenceServicer, bind_address, server_options
from edged.proto import grpc_service_pb2 as pb

if TYPE_CHECKING:
    from edged.core.access import AccessPolicy, Category
    from edged.core.service import InferencePath, InferenceService

_INFERENCE: Final = "inference.GRPCInferenceService"
_HEALTH: Final = "grpc.health.v1.Health"
# The RPCs a worker answers itself; the others are the daemon's.
_LOCAL: Final = frozenset({"ModelInfer", "ModelStreamInfer"})
# Metadata grpc sets on a call itself: never copied onto the relayed one.
_TRANSPORT_KEYS: Final = frozenset({"user-agent", "te", "content-type", "authority", "host"})


class RelayingServer:
    """A grpc.aio server on ``address:port``, beside the daemon's."""

    def __init__(
        self,
        service: InferencePath,
        address: str,
        port: int,
        options: GrpcOptions,
        access: AccessPolicy,
        daemon_socket: str,
    ) -> None:
        self._options = options
        self._server = grpc.aio.server(options=server_options(options, share_port=True))
        self._daemon = grpc.aio.insecure_channel(
            f"unix:{daemon_socket}",
            options=[
                ("grpc.max_receive_message_length", options.max_message_size),
                ("grpc.max_send_message_length", options.max_message_size),
            ],
        )
        # Only the inference RPCs of the servicer are ever registered, and they call nothing but the inference path.
        self._servicer = InferenceServicer(cast("InferenceService", service), options.max_queued_stream_bytes)
        guard(self._servicer, access, {name: INFERENCE_SERVICE[name] for name in _LOCAL})
        handlers: dict[str, grpc.RpcMethodHandler] = {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(
                self._servicer.ModelInfer,
                request_deserializer=pb.ModelInferRequest.FromString,
                response_serializer=pb.ModelInferResponse.SerializeToString,
            ),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
                self._servicer.ModelStreamInfer,
                request_deserializer=pb.ModelInferRequest.FromString,
                response_serializer=pb.ModelStreamInferResponse.SerializeToString,
            ),
        }
        handlers |= self._relayed(_INFERENCE, INFERENCE_SERVICE, skip=_LOCAL)
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(_INFERENCE, handlers),
                grpc.method_handlers_generic_handler(_HEALTH, self._relayed(_HEALTH, HEALTH_SERVICE, skip=frozenset())),
            )
        )
        self._server.add_insecure_port(bind_address(address, port))

    def _relayed(
        self, service: str, methods: Mapping[str, Category], skip: frozenset[str]
    ) -> dict[str, grpc.RpcMethodHandler]:
        return {
            name: grpc.unary_unary_rpc_method_handler(self._relay(f"/{service}/{name}"))
            for name in methods
            if name not in skip
        }

    def _relay(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]]:
        call = self._daemon.unary_unary(method)

        async def relayed(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            metadata = [
                (key, value)
                for key, value in context.invocation_metadata() or ()
                if key not in _TRANSPORT_KEYS and not key.startswith(("grpc-", ":")) and key != RELAYED_PEER
            ]
            metadata.append((RELAYED_PEER, context.peer()))
            try:
                reply: bytes = await call(request, metadata=metadata, timeout=context.time_remaining())
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
            return reply

        return relayed

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        self._servicer.close_streams()
        await self._server.stop(self._options.shutdown_grace_s)
        await self._daemon.close()
