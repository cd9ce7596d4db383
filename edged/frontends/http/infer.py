"""The infer endpoint, ``POST /v2/models/{model}[/versions/{version}]/infer``, the path every inference takes.

``answer_infer`` is the endpoint: from the path, headers and body to the reply (size limit, decompression, one JSON
decode, numpy views over the body, one encode). The connection protocol (edged.frontends.http.protocol) calls it
straight from the parsed request; ``InferRoute``, a plain ASGI handler ahead of the Litestar router, calls it for
the requests the protocol leaves to ASGI (pipelined behind another, ``Expect: 100-continue``, HTTP/1.0, escaped
paths). A client that closes its connection before the answer cancels its request, as a cancelled gRPC call does.
``InferRoute`` also serves the generate extension's two paths (edged.frontends.http.generate), which stream; every
other path goes to the Litestar app (edged.frontends.http.routes).
"""

from __future__ import annotations

import asyncio
import logging
import re
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edged.core.request.inference import InferRequest
from edged.errors import EdgedError, ErrorCode
from edged.frontends.bodies import BodyTooLarge, declared_too_large, framing_of, streamed_too_large
from edged.frontends.forwarding import forward_headers
from edged.frontends.http.codec import (
    DEFAULT_MAX_JSON_DEPTH,
    decode_infer_request,
    encode_infer_response,
    error_body,
    parse_header_length,
    url_version,
)
from edged.frontends.http.generate import GENERATE_PATH, answer_generate
from edged.frontends.http.traced import answer_traced
from edged.frontends.statuses import status_for

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

    from edged.core.request.inference import InferResponse
    from edged.core.service import InferencePath, ModelHandle

log = logging.getLogger("edged.frontends.http")

_JSON = b"application/json"
_OCTETS = b"application/octet-stream"
_HEADER_LENGTH = "inference-header-content-length"
# How long an inference runs before its client is watched for a hang-up (see _DisconnectWatch).
_WATCH_AFTER_S = 0.01


@dataclass(frozen=True, slots=True)
class HttpOptions:
    # Largest request body accepted, after decompression (Triton's --http-max-input-size).
    max_input_size: int = 64 * 1024 * 1024
    # Deepest nesting of arrays and objects in an infer request's JSON (Triton's limit).
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    # Largest model archive accepted by the upload route, which streams it to disk (--upload-max-bytes).
    max_upload_size: int = 2 * 1024**3
    # Headers forwarded to the model as request parameters (--http-header-forward-pattern); None forwards none.
    forward_pattern: re.Pattern[str] | None = None
    # Most bytes of server-sent events a generate_stream reply holds unwritten to its client (as a gRPC stream's
    # --grpc-max-queued-stream-bytes); past it the request is cancelled with an error event.
    max_queued_stream_bytes: int = 64 * 1024 * 1024


# ``POST /v2/models/{model}[/versions/{version}]/infer``, as ASGI gives the path (decoded).
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    content_type: bytes = _JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def answer_infer(
    service: InferencePath,
    options: HttpOptions,
    path: str,
    model_name: str,
    version_text: str | None,
    headers: dict[str, str],
    read_body: Callable[[], Awaitable[bytes]],
    run: Callable[[InferRequest, ModelHandle], Awaitable[InferResponse | None]],
) -> Awaitable[Reply | None]:
    """``_answer_infer``, traced when the trace setting samples the request: with tracing off, one check."""
    tracing = service.tracing
    trace = tracing.sample(model_name) if tracing.enabled else None
    if trace is None:
        return _answer_infer(service, options, path, model_name, version_text, headers, read_body, run)
    return answer_traced(
        _answer_infer, trace, service, options, path, model_name, version_text, headers, read_body, run
    )


async def _answer_infer(
    service: InferencePath,
    options: HttpOptions,
    path: str,
    model_name: str,
    version_text: str | None,
    headers: dict[str, str],
    read_body: Callable[[], Awaitable[bytes]],
    run: Callable[[InferRequest, ModelHandle], Awaitable[InferResponse | None]],
) -> Reply | None:
    """The reply to a POST to the infer path; None when the client went away first (``run`` answers None).

    The model is looked up before the body is read, so an unknown model is answered without reading a large body.
    ``read_body`` gives the body as sent (raising BodyTooLarge past the limit); ``run`` runs the inference.
    Every error answered is counted for the metrics history: by the service when ``run`` raised it, else here
    (``service.refused``).
    """
    model: ModelHandle | None = None
    running = False
    try:
        version = url_version(version_text)
        model = service.find_model(model_name, version)
        if model.decoupled:
            raise EdgedError(
                ErrorCode.UNSUPPORTED, "HTTP end point doesn't support models with decoupled transaction policy"
            )
        body = decode_body(await read_body(), headers, options.max_input_size)
        header_length = parse_header_length(headers.get(_HEADER_LENGTH), len(body))
        if header_length == 0 or (header_length is None and not body):
            # A raw binary request: the body is the model's single input, every output comes back binary.
            request = InferRequest(model_name, version, "", [service.raw_input(model, body)])
            binary_default = True
        else:
            request, binary_default = decode_infer_request(
                model_name, version, body, header_length, options.max_json_depth
            )
        if options.forward_pattern is not None:
            forward_headers(options.forward_pattern, headers.items(), request.parameters)
        running = True
        response = await run(request, model)
        running = False
        if response is None:
            return None
        payload, json_length = encode_infer_response(response, request.outputs, binary_default)
    except EdgedError as exc:
        _refused(service, model, running)
        return Reply(status_for(exc), error_body(exc.message))
    except BodyTooLarge as exc:
        _refused(service, model, running)
        return Reply(413, error_body(str(exc)))
    except Exception:
        # A bug, not a bad request: logged with its traceback, answered without it.
        log.exception("unhandled error in POST %s", path)
        _refused(service, model, running)
        return Reply(500, error_body("internal error"))
    reply = Reply(200, payload)
    if json_length is not None:
        reply.content_type = _OCTETS
        reply.headers.append((b"inference-header-content-length", str(json_length).encode()))
    encoding = _accepted_encoding(headers.get("accept-encoding"))
    if encoding is not None:
        reply.body = _compress(payload, encoding)
        reply.headers.append((b"content-encoding", encoding.encode()))
    return reply


def _refused(service: InferencePath, model: ModelHandle | None, running: bool) -> None:
    """An error answered to an inference request: what ``run`` raised the service has counted (a client that
    went away while its request ran gets no answer), anything else is counted here."""
    if not running:
        service.refused(model)


class InferRoute:
    """Serves ``POST /v2/models/{model}[/versions/{version}]/infer`` (and ``.../generate[_stream]``) ahead of the
    Litestar router.

    The infer path is the one every request takes, so it skips the framework's routing and request objects; every
    other path goes to the Litestar app.
    """

    def __init__(self, app: ASGIApp, service: InferencePath, options: HttpOptions) -> None:
        self._app = app
        self._service = service
        self._options = options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind: str = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            if len(path) > 1 and path.endswith("/"):
                # Triton's routes are full matches: "/v2/" is not "/v2".
                await _send(send, 404, error_body("Not Found"), _JSON)
                return
            match = INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                await self._infer(scope, receive, send, match.group(1), match.group(2))
                return
            match = GENERATE_PATH.fullmatch(path)
            if match is not None:
                await self._generate(scope, receive, send, match)
                return
        await self._app(scope, receive, send)

    async def _generate(self, scope: Scope, receive: Receive, send: Send, match: re.Match[str]) -> None:
        if scope.get("method") != "POST":
            await _send(send, 405, error_body("Method Not Allowed"), _JSON)
            return
        headers = _headers(scope)
        limit = self._options.max_input_size
        await answer_generate(
            self._service,
            self._options,
            scope,
            receive,
            send,
            match,
            headers,
            lambda: _receive_body(receive, headers, limit),
        )

    async def _infer(
        self, scope: Scope, receive: Receive, send: Send, model_name: str, version_text: str | None
    ) -> None:
        service, options = self._service, self._options
        if scope.get("method") != "POST":
            await _send(send, 405, error_body("Method Not Allowed"), _JSON)
            return
        headers = _headers(scope)
        path: str = scope["path"]
        reply = await answer_infer(
            service,
            options,
            path,
            model_name,
            version_text,
            headers,
            lambda: _receive_body(receive, headers, options.max_input_size),
            lambda request, model: _infer_unless_disconnected(service, request, model, receive),
        )
        if reply is None:
            log.debug("client of a POST %s went away: its request was cancelled", path)
            return
        await _send(send, reply.status, reply.body, reply.content_type, reply.headers)


async def _infer_unless_disconnected(
    service: InferencePath, request: InferRequest, model: ModelHandle, receive: Receive
) -> InferResponse | None:
    """The response; None when the client closed its connection first, which cancels the inference as gRPC's
    cancellation does: the scheduler marks the request cancelled and the backend stops early where it can."""
    watch = _DisconnectWatch(receive)
    try:
        return await service.infer(request, model)
    except asyncio.CancelledError:
        # Only the watch's own cancellation is absorbed; one from elsewhere (shutdown) goes on.
        if watch.disconnected and watch.task.uncancel() == 0:
            return None
        raise
    finally:
        watch.stop()


class _DisconnectWatch:
    """Cancels the task serving a request if ``receive()`` reports ``http.disconnect`` while the request runs.

    Once the body is read, uvicorn's ``receive()`` waits until the connection closes, so a task awaits it beside
    the inference. The task starts only once the inference has run for ``_WATCH_AFTER_S``: most requests have
    answered before and cost one timer, not a task and its cancellation (some 8% of the daemon's CPU per
    request for a small Python model), and a client that hangs up is still noticed within that delay. ``stop()``
    ends the watch; the watching task, cancelled there, finishes on the loop's next turn, so none outlives its
    request.
    """

    __slots__ = ("_receive", "_start", "_watcher", "disconnected", "task")

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None  # an ASGI app always runs in a task
        self.task = task
        self.disconnected = False
        self._receive = receive
        self._watcher: asyncio.Future[ReceiveMessage] | None = None
        self._start = asyncio.get_running_loop().call_later(_WATCH_AFTER_S, self._begin)

    def _begin(self) -> None:
        self._watcher = asyncio.ensure_future(self._receive())
        self._watcher.add_done_callback(self._received)

    def _received(self, watcher: asyncio.Future[ReceiveMessage]) -> None:
        if watcher is not self._watcher or watcher.cancelled():
            return  # stopped: the request has its answer
        if watcher.exception() is None and watcher.result()["type"] == "http.disconnect":
            self.disconnected = True
            self.task.cancel()
        # Anything else is a message this request does not expect: the watch ends without cancelling.

    def stop(self) -> None:
        self._start.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def _receive_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    framing = framing_of(headers.get("inference-header-content-length"))
    refusal = declared_too_large(headers.get("content-length"), limit, framing)
    if refusal is not None:
        raise refusal
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise EdgedError(ErrorCode.CANCELLED, "client disconnected")
        chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
        if chunk:
            size += len(chunk)
            if size > limit:
                raise streamed_too_large(limit, framing)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decode_body(body: bytes, headers: dict[str, str], limit: int) -> bytes:
    """The body as the client meant it: decompressed per Content-Encoding, within the size limit."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "deflate"):
        return _decompress(body, encoding, limit)
    raise EdgedError(ErrorCode.UNSUPPORTED, "Unsupported compression type")


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    # wbits: 16+ reads a gzip wrapper, 32+ detects zlib or gzip; deflate bodies are zlib-wrapped per RFC 9110.
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        # max_length bounds memory: a small compressed body cannot expand past the limit (no zip bombs).
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise EdgedError(ErrorCode.INVALID_ARG, f"failed to decompress the request body: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyTooLarge(
            f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use --http-max-input-size "
            "to increase the limit."
        )
    if not inflater.eof:
        raise EdgedError(ErrorCode.INVALID_ARG, "failed to decompress the request body: it is truncated")
    return out


def _accepted_encoding(accept: str | None) -> str | None:
    if not accept:
        return None
    names = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    for name in ("gzip", "deflate"):
        if name in names:
            return name
    return None


def _compress(payload: bytes, encoding: str) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return compressor.compress(payload) + compressor.flush()


async def _send(
    send: Send, status: int, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# --- errors ---------------------------------------------------------------------------------------------
