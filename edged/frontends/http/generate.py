"""The generate extension: ``POST /v2/models/{model}[/versions/{version}]/generate`` and ``.../generate_stream``.

Both take the same JSON object (generate_codec.py) and run it as one request through the service's stream of
responses, so a decoupled model serves both. ``/generate`` answers one JSON object: the model's one response, or
Triton's error when the model gave none or more than one. ``/generate_stream`` answers server-sent events, one
``data: {...}`` per response, as they come; a model that is not decoupled gives one. As in Triton, an error found
before the model runs (the model, the body, an input) is a plain JSON error, while an error from the model is an
event ``data: {"error": ...}``, and the status of the reply is the first response's (400 for any error, as Triton
answers): a stream whose first response succeeded and whose next one failed has status 200.

The client holds the request: once it closes its connection the request is cancelled (as gRPC's cancellation is,
so a Python model sees ``is_cancelled()``). What the daemon holds for it is bounded: the body by
``--http-max-input-size`` (as infer's), the events produced and not yet written by ``max_queued_stream_bytes``
(past it the request is cancelled with an error event, as a gRPC stream's is), and a client that reads nothing for
``--http-body-timeout-secs`` loses its connection (edged.frontends.http.limits).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from typing import TYPE_CHECKING, Final

from edged.core.request.validation import validate_request
from edged.errors import EdgedError, ErrorCode, unavailable
from edged.frontends.bodies import BodyTooLarge
from edged.frontends.forwarding import forward_headers
from edged.frontends.http.codec import error_body, url_version
from edged.frontends.http.generate_codec import decode_generate_request, encode_generate_response
from edged.frontends.statuses import status_for

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from litestar.types import Receive, ReceiveMessage, Scope, Send

    from edged.core.request.inference import InferRequest, StreamResponse
    from edged.core.service import InferencePath, ModelHandle
    from edged.frontends.http.infer import HttpOptions

log = logging.getLogger("edged.frontends.http")

# ``POST /v2/models/{model}[/versions/{version}]/generate[_stream]``, as ASGI gives the path (decoded).
GENERATE_PATH: Final = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/(generate|generate_stream)")

_JSON: Final = b"application/json"
_EVENTS: Final = b"text/event-stream; charset=utf-8"
# The status of a reply whose first response is an error, whatever the error's code: Triton's, which reads the code
# of an error it has already released and so answers every one of them 400.
_ANSWERED_ERROR: Final = 400
_ONE_RESPONSE: Final = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates various "
    "number of responses"
)


async def answer_generate(
    service: InferencePath,
    options: HttpOptions,
    scope: Scope,
    receive: Receive,
    send: Send,
    match: re.Match[str],
    headers: dict[str, str],
    read_body: Callable[[], Awaitable[bytes]],
) -> None:
    """Answers one generate request; ``read_body`` gives the body as sent (raising BodyTooLarge past the limit)."""
    model_name, version_text, route = match.group(1), match.group(2), match.group(3)
    streaming = route == "generate_stream"
    path: str = scope["path"]
    model: ModelHandle | None = None
    try:
        version = url_version(version_text)
        model = service.find_model(model_name, version)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise EdgedError(ErrorCode.INVALID_ARG, "Unsupported content-encoding, only 'identity' is supported.")
        body = await read_body()
        signature = service.model_signature(model)
        request = decode_generate_request(model_name, version, body, signature, options.max_json_depth)
        if options.forward_pattern is not None:
            forward_headers(options.forward_pattern, headers.items(), request.parameters)
        # Before the model runs, so that what Triton finds before its inference begins is a plain JSON error on
        # both routes; the service checks again, finding nothing.
        validate_request(signature, request)
    except EdgedError as exc:
        service.refused(model)
        await _reply(send, status_for(exc), error_body(exc.message))
        return
    except BodyTooLarge as exc:
        service.refused(model)
        await _reply(send, 413, error_body(str(exc)))
        return
    except Exception:
        log.exception("unhandled error in POST %s", path)
        service.refused(model)
        await _reply(send, 500, error_body("internal error"))
        return
    outbox = _Outbox(options.max_queued_stream_bytes, streaming)
    producer = asyncio.ensure_future(_produce(service, request, model, outbox))
    watch = _DisconnectWatch(receive, producer)
    try:
        if streaming:
            await _write_events(send, outbox, watch)
        else:
            await asyncio.wait([producer])
            if not watch.disconnected:
                await _reply(send, outbox.status or 200, outbox.single())
    finally:
        watch.stop()
        if not producer.done():
            producer.cancel()  # leaving the service's stream cancels the request
    if watch.disconnected:
        log.debug("client of a POST %s went away: its request was cancelled", path)


class _Outbox:
    """What the request produced for its client and the client has not been sent yet.

    For ``/generate_stream`` every event, counted in bytes against ``limit``; for ``/generate`` the first response
    and how many there were (more than one is an error whatever they hold, so only the first is kept)."""

    __slots__ = ("_more", "count", "events", "finished", "limit", "size", "status", "streaming")

    def __init__(self, limit: int, streaming: bool) -> None:
        self.limit = limit
        self.streaming = streaming
        self.events: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.count = 0
        # The status of the reply: the first response's, a flag-only one counting as a success (Triton's).
        self.status: int | None = None
        self.finished = False
        self._more = asyncio.Event()

    def first(self, status: int) -> None:
        if self.status is None:
            self.status = status
            self._more.set()

    def put(self, payload: bytes) -> None:
        self.count += 1
        if self.streaming:
            event = b"data: " + payload + b"\n\n"
            self.events.append(event)
            self.size += len(event)
            self._more.set()
        elif self.count == 1:
            self.events.append(payload)

    def over_limit(self) -> bool:
        return self.size > self.limit

    def finish(self) -> None:
        self.finished = True
        self._more.set()

    def single(self) -> bytes:
        """The body of ``/generate``: the one response, or Triton's error for none or several."""
        if self.count != 1:
            return error_body(_ONE_RESPONSE)
        return self.events[0]

    async def next(self) -> bytes | None:
        """The next event, waiting for one; None once the request finished and every event was taken."""
        while not self.events:
            if self.finished:
                return None
            self._more.clear()
            await self._more.wait()
        event = self.events.popleft()
        self.size -= len(event)
        return event

    async def started(self) -> None:
        while self.status is None and not self.finished:
            self._more.clear()
            await self._more.wait()


async def _produce(service: InferencePath, request: InferRequest, model: ModelHandle, outbox: _Outbox) -> None:
    """Every response of the request into the outbox, as the service gives them."""
    try:
        async for item in service.infer_stream(request, model):
            _take(item, outbox)
            if outbox.over_limit():
                # The client reads too slowly for what the model sends: the request is cancelled (by leaving the
                # service's stream) and the client told why once it reads that far, as a gRPC stream's is.
                error = _overflow(request.id, outbox.limit)
                outbox.put(error_body(error.message))
                break
    except EdgedError as exc:
        # An error the service raised counts as the request's one response (a model that is not decoupled).
        outbox.first(_ANSWERED_ERROR)
        outbox.put(error_body(exc.message))
    except Exception:
        log.exception("unhandled error in a generate request to model '%s'", request.model_name)
        outbox.first(500)
        outbox.put(error_body("internal error"))
    finally:
        outbox.finish()


def _take(item: StreamResponse, outbox: _Outbox) -> None:
    if item.error is not None:
        outbox.first(_ANSWERED_ERROR)
        outbox.put(error_body(item.error.message))
        return
    if item.response is None:
        outbox.first(200)  # the flag-only final response: no event
        return
    try:
        payload = encode_generate_response(item.response)
    except EdgedError as exc:  # an output JSON cannot carry
        outbox.first(_ANSWERED_ERROR)
        outbox.put(error_body(exc.message))
        return
    outbox.first(200)
    outbox.put(payload)


def _overflow(request_id: str, limit: int) -> EdgedError:
    who = f"request '{request_id}'" if request_id else "the request"
    return unavailable(
        f"{who} was cancelled: its stream holds more than {limit} bytes of responses that the client has not read"
    )


async def _write_events(send: Send, outbox: _Outbox, watch: _DisconnectWatch) -> None:
    await outbox.started()
    if watch.disconnected:
        return
    status = outbox.status or 200
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", _EVENTS)]})
    while (event := await outbox.next()) is not None:
        if watch.disconnected:
            return
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class _DisconnectWatch:
    """Cancels the request's task once ``receive()`` reports ``http.disconnect``: after the body, uvicorn's
    ``receive()`` waits until the connection closes (or the reply is complete)."""

    __slots__ = ("_producer", "_watcher", "disconnected")

    def __init__(self, receive: Receive, producer: asyncio.Future[None]) -> None:
        self.disconnected = False
        self._producer = producer
        self._watcher: asyncio.Future[ReceiveMessage] | None = asyncio.ensure_future(receive())
        self._watcher.add_done_callback(self._received)

    def _received(self, watcher: asyncio.Future[ReceiveMessage]) -> None:
        if watcher is not self._watcher or watcher.cancelled():
            return  # stopped: the reply is complete
        if watcher.exception() is None and watcher.result()["type"] == "http.disconnect":
            self.disconnected = True
            self._producer.cancel()
        # Anything else is a message this request does not expect (a pipelined request's body): no cancellation.

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None


async def _reply(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", _JSON), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
