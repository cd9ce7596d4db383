"""KServe v2 over gRPC (``inference.GRPCInferenceService``), with Triton's extensions and status codes.

The server runs on the daemon's event loop beside the HTTP server and calls the same InferenceService. Every
handler turns an EdgedError into the gRPC status Triton gives its code; the message is the core's, unchanged.

Streams: each request read from a ModelStreamInfer stream runs as its own task, so many are in flight on one
stream, and the handler writes replies as they are produced (replies.py): a decoupled model's as they come, those of
models that are not decoupled in the order of their requests, as Triton writes them. A decoupled model gives zero or
more replies per request, each marked with ``triton_final_response``, and the flag-only final one is sent (empty)
when the request asked for it. A failing request answers with ``error_message`` and the stream goes on, unless the
client opened it with the metadata ``triton_grpc_error: true``, in which case the first error ends it with a status.

A stream holds at most ``max_queued_stream_bytes`` of replies not yet written to its client: a decoupled model may
answer without end while a client reads nothing, and the backend cannot be told to wait, so a request whose next
reply finds the stream over that bound is cancelled and answered with an error (UNAVAILABLE, as a full queue is in
Triton). The bound is in bytes, not replies: a client that reads keeps up with a model sending many small replies
faster than the daemon writes them, while a few large ones are what exhausts memory. With a response pool
(``response_pool``, Triton's ``--grpc-max-response-pool-size``) the count of replies is bounded too, and a decoupled
request past it waits for its client.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from edged.errors import EdgedError, ErrorCode, invalid_arg, unsupported
from edged.frontends import kserve
from edged.frontends.forwarding import forward_headers
from edged.frontends.grpc.codec import (
    ENABLE_EMPTY_FINAL_RESPONSE,
    FINAL_RESPONSE,
    decode_infer_request,
    encode_infer_response,
    encode_stream_error,
    internal_error,
    parse_version,
)
from edged.frontends.grpc.replies import StreamReplies, Turn
from edged.frontends.grpc.status import StatusCode
from edged.frontends.trace_settings import trace_setting
from edged.proto import grpc_service_pb2 as pb

if TYPE_CHECKING:
    from edged.core.request.inference import ParameterValue, StreamResponse
    from edged.core.service import InferenceService, ModelHandle
    from edged.core.trace_file import Trace
    from edged.frontends.grpc.calls import Call

log = logging.getLogger(__name__)

STATUS_BY_CODE: Final[dict[ErrorCode, StatusCode]] = {
    ErrorCode.UNKNOWN: StatusCode.UNKNOWN,
    ErrorCode.INTERNAL: StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARG: StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: StatusCode.CANCELLED,
}
# Requests running at once, per stream: past this the stream stops reading, and HTTP/2 flow control pushes back on
# the client instead of the server queueing without bound. Each may be up to --grpc-max-message-size, so this
# bounds a stream's memory as well as its concurrency.
MAX_IN_FLIGHT_PER_STREAM: Final = 32
_GRPC_ERROR_KEY: Final = "triton_grpc_error"


@dataclass(frozen=True, slots=True)
class GrpcOptions:
    # Largest message received or sent. Triton uses INT32_MAX; a device is better served by a bound it can hold.
    max_message_size: int = 64 * 1024 * 1024
    # Seconds that in-flight calls get to finish once the server stops; new calls are refused at once.
    shutdown_grace_s: float = 5.0
    # Connection bounds, so that idle or half-open clients cannot hold every file descriptor (see the README).
    max_connections: int = 1024
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0
    # A request must bring min_body_rate bytes per second over each body_timeout_s window; the request bytes held
    # by the whole endpoint are bounded (edged.frontends.grpc.bounds).
    body_timeout_s: float = 30.0
    min_body_rate: int = 1024
    max_buffered_bytes: int = 256 * 1024 * 1024
    # Bytes of replies a stream holds that its client has not read yet (see the module's docstring).
    max_queued_stream_bytes: int = 64 * 1024 * 1024
    # Most replies a stream holds unread before a decoupled model waits for its client (0: bounded by bytes only).
    response_pool: int = 0
    # Metadata forwarded to the model as request parameters (--grpc-header-forward-pattern); None forwards none.
    forward_pattern: re.Pattern[str] | None = None


def status_for(error: EdgedError) -> StatusCode:
    return STATUS_BY_CODE.get(error.code, StatusCode.UNKNOWN)


_Handler = TypeVar("_Handler", bound=Callable[..., Awaitable[Any]])


def _unary(handler: _Handler) -> _Handler:
    """Answers an EdgedError with its status and message; any other exception is a server fault: logged, and
    answered INTERNAL without details."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: Call) -> Any:
        try:
            return await handler(self, request, context)
        except EdgedError as exc:
            error = exc
        except Exception:
            log.exception("unhandled error in gRPC %s", handler.__name__)
            error = internal_error()
        await context.abort(status_for(error), error.message)

    return wrapper  # type: ignore[return-value]


class _LogSettings:
    """A LogSettings request's map, with Triton's gRPC errors for values of the wrong kind. A key that is present
    sets its setting, whatever its value (so a ``log_file`` of any value refuses the request)."""

    def __init__(self, settings: Any) -> None:
        self._settings = settings

    def sets(self, key: str) -> bool:
        return key in self._settings

    def boolean(self, key: str) -> bool:
        value = self._settings[key]
        if value.WhichOneof("parameter_choice") != "bool_param":
            raise invalid_arg(f"expect boolean for '{key}'")
        return bool(value.bool_param)

    def unsigned(self, key: str) -> int:
        value = self._settings[key]
        if value.WhichOneof("parameter_choice") != "uint32_param":
            raise invalid_arg(f"expect int32 for '{key}'")
        return int(value.uint32_param)

    def string(self, key: str) -> str:
        value = self._settings[key]
        if value.WhichOneof("parameter_choice") != "string_param":
            raise invalid_arg(f"expect string for '{key}'")
        return str(value.string_param)

    def bad_format(self, text: str) -> EdgedError:
        return invalid_arg(f"invalid argument for log_format, got: {text}")


class _LoadParameters:
    """A RepositoryModelLoad request's parameters: the config a string_param, each file a bytes_param."""

    def __init__(self, parameters: Any) -> None:
        self._parameters = parameters

    def names(self) -> list[str]:
        return list(self._parameters)

    def config(self, key: str) -> str:
        return str(self._value(key, "string_param"))

    def file(self, key: str) -> bytes:
        return bytes(self._value(key, "bytes_param"))

    def _value(self, key: str, kind: str) -> Any:
        parameter = self._parameters[key]
        if parameter.WhichOneof("parameter_choice") != kind:
            raise invalid_arg(f"the '{key}' parameter must be a {kind}")
        return getattr(parameter, kind)


class InferenceServicer:
    """``inference.GRPCInferenceService``: every RPC, each a translation to one InferenceService call."""

    def __init__(
        self,
        service: InferenceService,
        max_queued_stream_bytes: int = 64 * 1024 * 1024,
        forward_pattern: re.Pattern[str] | None = None,
        response_pool: int = 0,
    ) -> None:
        self._service = service
        self._max_queued = max_queued_stream_bytes
        self._response_pool = response_pool
        self._forward_pattern = forward_pattern
        # The reader task of every open stream, so that stopping can end them (see close_streams).
        self._readers: set[asyncio.Task[None]] = set()
        self._closing = False

    def close_streams(self) -> None:
        """Stop reading every open stream: each then answers what it has in flight and ends with OK, so a stream
        that a client keeps open does not hold the shutdown for the whole grace period."""
        self._closing = True
        for reader in self._readers:
            reader.cancel()

    # --- health and metadata ----------------------------------------------------------------------------

    @_unary
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self._service.is_live())

    @_unary
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self._service.is_ready())

    @_unary
    async def ModelReady(self, request: Any, context: Any) -> Any:
        # An unknown model is not an error here: it is simply not ready, as Triton answers.
        return pb.ModelReadyResponse(ready=self._service.model_ready(request.name, parse_version(request.version)))

    @_unary
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        meta = self._service.server_metadata()
        return pb.ServerMetadataResponse(name=meta.name, version=meta.version, extensions=meta.extensions)

    @_unary
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        meta = self._service.model_metadata(request.name, parse_version(request.version))
        return pb.ModelMetadataResponse(**kserve.model_metadata(meta))

    @_unary
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        # The core's ModelConfig is this very message type (edged.proto.model_config_pb2).
        return pb.ModelConfigResponse(config=self._service.model_config(request.name, parse_version(request.version)))

    @_unary
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        stats = self._service.statistics(request.name, parse_version(request.version))
        return pb.ModelStatisticsResponse(model_stats=kserve.model_statistics(stats))

    # --- repository -------------------------------------------------------------------------------------

    @_unary
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        _refuse_named_repository(request.repository_name)
        return pb.RepositoryIndexResponse(models=kserve.repository_index(self._service.repository_index(request.ready)))

    @_unary
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        _refuse_named_repository(request.repository_name)
        config, files = kserve.load_overrides(_LoadParameters(request.parameters))
        await self._service.load_model(request.model_name, config, files)
        return pb.RepositoryModelLoadResponse()

    @_unary
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        _refuse_named_repository(request.repository_name)
        dependents = request.parameters.get("unload_dependents")
        unload_dependents = dependents is not None and dependents.WhichOneof("parameter_choice") == "bool_param"
        await self._service.unload_model(
            request.model_name, unload_dependents=unload_dependents and dependents.bool_param
        )
        return pb.RepositoryModelUnloadResponse()

    # --- shared memory ----------------------------------------------------------------------------------

    @_unary
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        reply = pb.SystemSharedMemoryStatusResponse()
        for region in self._service.shared_memory.system_status(request.name):
            reply.regions[region.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
                )
            )
        return reply

    @_unary
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self._service.shared_memory.register_system(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_unary
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self._service.shared_memory.unregister_system(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_unary
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        # No CUDA region can be registered on this server, so the status is always empty (or the name unknown).
        self._service.shared_memory.cuda_status(request.name)
        return pb.CudaSharedMemoryStatusResponse()

    @_unary
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self._service.shared_memory.register_cuda(request.name)
        return pb.CudaSharedMemoryRegisterResponse()

    @_unary
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self._service.shared_memory.unregister_cuda(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # --- trace and log settings -------------------------------------------------------------------------

    @_unary
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        settings = {key: list(value.value) or None for key, value in request.settings.items()}
        values = trace_setting(self._service, request.model_name, settings if settings else None, http=False)
        reply = pb.TraceSettingResponse()
        for key, value in values.items():
            reply.settings[key].value.extend(value if isinstance(value, list) else [value])
        return reply

    @_unary
    async def LogSettings(self, request: Any, context: Any) -> Any:
        kserve.update_log_settings(_LogSettings(request.settings), "gRPC")
        reply = pb.LogSettingsResponse()
        for key, value in kserve.log_settings().items():
            kind = (
                "bool_param"
                if isinstance(value, bool)
                else "uint32_param"
                if isinstance(value, int)
                else "string_param"
            )
            setattr(reply.settings[key], kind, value)
        return reply

    # --- inference --------------------------------------------------------------------------------------

    @_unary
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        # The call is cancelled when the client cancels, which stops the request wherever it waits.
        reply = pb.ModelInferResponse()
        await self._infer(request, reply, streaming=False, forwarded=self._forwarded(context))
        return reply

    def _forwarded(self, context: Any) -> dict[str, ParameterValue] | None:
        """The call's metadata that --grpc-header-forward-pattern forwards to the model, as request parameters."""
        if self._forward_pattern is None:
            return None
        texts = ((key, value) for key, value in context.invocation_metadata() or () if isinstance(value, str))
        forwarded: dict[str, ParameterValue] = {}
        forward_headers(self._forward_pattern, texts, forwarded)
        return forwarded

    async def _infer(
        self,
        request: Any,
        reply: Any,
        *,
        streaming: bool,
        model: ModelHandle | None = None,
        forwarded: dict[str, ParameterValue] | None = None,
    ) -> None:
        service = self._service
        tracing = service.tracing
        trace = tracing.sample(request.model_name) if tracing.enabled else None
        if trace is None:
            await self._infer_untraced(request, reply, streaming, model, forwarded, None)
            return
        # The message was read before the handler runs: both of Triton's read timestamps are taken now.
        trace.stamp("GRPC_WAITREAD_START")
        trace.stamp("GRPC_WAITREAD_END")
        try:
            await self._infer_untraced(request, reply, streaming, model, forwarded, trace)
            trace.stamp("GRPC_SEND_END")
        finally:
            trace.close()

    async def _infer_untraced(
        self,
        request: Any,
        reply: Any,
        streaming: bool,
        model: ModelHandle | None,
        forwarded: dict[str, ParameterValue] | None,
        trace: Trace | None,
    ) -> None:
        service = self._service
        # Every error is counted for the metrics history: by the service when its infer raised it, else here.
        running = False
        try:
            version = parse_version(request.model_version)
            # Looked up before the request is decoded, as Triton does: an unknown model is reported as such.
            if model is None:
                model = service.find_model(request.model_name, version)
            if not streaming and model.decoupled:
                raise unsupported("ModelInfer RPC doesn't support models with decoupled transaction policy")
            decoded = decode_infer_request(request, version)
            if forwarded:  # after the request's own: a header wins over a parameter of the same name
                decoded.parameters.update(forwarded)
            decoded.trace = trace
            running = True
            response = await service.infer(decoded, model)
            running = False
            if trace is not None:
                trace.stamp("GRPC_SEND_START")
            encode_infer_response(response, reply)
        except Exception:
            if not running:
                service.refused(model)
            raise

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Call) -> AsyncIterator[Any]:
        abort_on_error = _grpc_error_mode(context)
        forwarded: dict[str, ParameterValue] | EdgedError | None
        try:
            forwarded = self._forwarded(context)
        except EdgedError as refused:
            forwarded = refused  # a header that may not be forwarded: each request of the stream is refused
        replies = StreamReplies(self._max_queued, self._response_pool, MAX_IN_FLIGHT_PER_STREAM)
        reader = asyncio.create_task(self._read_stream(requests, replies, forwarded))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        if self._closing:
            reader.cancel()
        try:
            while (item := await replies.get()) is not None:
                reply, error = item
                if error is not None and abort_on_error:
                    await context.abort(status_for(error), error.message)
                yield reply
            # A read that failed (a message over the size limit, a broken connection) has already ended the call;
            # this only surfaces a fault of the reader itself.
            await reader
        finally:
            # The client went away, or the stream ended: nothing still running for it is wanted.
            reader.cancel()
            replies.cancel()

    async def _read_stream(
        self,
        requests: AsyncIterator[Any],
        replies: StreamReplies,
        forwarded: dict[str, ParameterValue] | EdgedError | None,
    ) -> None:
        try:
            async for request in requests:
                await replies.start(functools.partial(self._stream_one, request, replies, forwarded=forwarded))
        except asyncio.CancelledError:
            if not self._closing:
                raise  # the writer is gone and cancels what is running itself
            # The server is stopping: what was read is still answered, then the stream ends.
        except Exception as exc:  # the call is over; grpc reports the reason to the client
            log.debug("gRPC stream read ended: %r", exc)
        replies.reading_done()

    async def _stream_one(
        self,
        request: Any,
        replies: StreamReplies,
        turn: Turn,
        *,
        forwarded: dict[str, ParameterValue] | EdgedError | None,
    ) -> None:
        error: EdgedError | None = None
        try:
            await self._stream_replies(request, replies, turn, forwarded)
        except EdgedError as exc:
            error = exc
        except Exception:
            log.exception("unhandled error in gRPC ModelStreamInfer")
            error = internal_error()
        if error is not None:
            await turn.wait()
            replies.put(encode_stream_error(request, error), error)

    async def _stream_replies(
        self,
        request: Any,
        replies: StreamReplies,
        turn: Turn,
        forwarded: dict[str, ParameterValue] | EdgedError | None,
    ) -> None:
        service = self._service
        if isinstance(forwarded, EdgedError):
            service.refused(None)
            raise forwarded
        try:
            version = parse_version(request.model_version)
            model = service.find_model(request.model_name, version)
        except Exception:
            service.refused(None)  # counted for the metrics history, as _infer counts its errors
            raise
        if not model.decoupled:
            reply = pb.ModelStreamInferResponse()
            await self._infer(request, reply.infer_response, streaming=True, model=model, forwarded=forwarded)
            # A model that is not decoupled gives exactly one response, which is therefore the final one.
            reply.infer_response.parameters[FINAL_RESPONSE].bool_param = True
            await turn.wait()
            replies.put(reply, None)
            turn.pass_on()
            return
        # A decoupled model's responses go out as they come: the requests after it need not wait for them.
        turn.pass_on()
        flag = request.parameters.get(ENABLE_EMPTY_FINAL_RESPONSE)
        empty_final = flag is not None and flag.bool_param
        try:
            decoded = decode_infer_request(request, version)
        except Exception:
            service.refused(model)
            raise
        if forwarded:
            decoded.parameters.update(forwarded)
        # What infer_stream raises or streams the service counts. A backlog overflow cancels the request, which the
        # statistics count as the model ends it: a cancelled failure, or a success if the model did not stop.
        items = service.infer_stream(decoded, model)
        try:
            async for item in items:
                if replies.backlog_full():
                    raise replies.overflow(request.id)
                if replies.pool_full() and not await replies.room(decoded.stream):
                    raise replies.overflow(request.id)
                _put_stream_item(request, model, item, empty_final, replies)
        finally:
            # Left early (a full backlog), the request is cancelled now, not once the generator is collected.
            if isinstance(items, AsyncGenerator):
                await items.aclose()


def _put_stream_item(
    request: Any, model: ModelHandle, item: StreamResponse, empty_final: bool, replies: StreamReplies
) -> None:
    if item.error is not None:
        error_reply = encode_stream_error(request, item.error)
        error_reply.infer_response.parameters[FINAL_RESPONSE].bool_param = item.final
        replies.put(error_reply, item.error)
    elif item.response is not None:
        reply = pb.ModelStreamInferResponse()
        encode_infer_response(item.response, reply.infer_response)
        reply.infer_response.parameters[FINAL_RESPONSE].bool_param = item.final
        replies.put(reply, None)
    elif empty_final:
        # Triton's flag-only final response: an empty response that tells the client the request is done.
        reply = pb.ModelStreamInferResponse()
        reply.infer_response.model_name = model.name
        reply.infer_response.model_version = str(model.version)
        reply.infer_response.id = request.id
        reply.infer_response.parameters[FINAL_RESPONSE].bool_param = True
        replies.put(reply, None)


def _refuse_named_repository(name: str) -> None:
    if name:
        raise unsupported("'repository_name' specification is not supported")


def _grpc_error_mode(context: Call) -> bool:
    for key, value in context.invocation_metadata() or ():
        if key == _GRPC_ERROR_KEY:
            return str(value).strip().lower() == "true"
    return False
