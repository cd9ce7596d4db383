"""The HTTP/1.1 connection protocol of the HTTP endpoint: uvicorn's httptools protocol, with inference requests
answered by the protocol itself.

Through ASGI every request costs a scope, a request-response cycle, an event, a task running the app, and two
messages and two writes for the reply; for a small model that was a quarter of the daemon's CPU per inference, and
the daemon's single event loop is what bounds its throughput. So a ``POST /v2/models/{model}[/versions/{v}]/infer``
is taken from the parser as it arrives: its body is gathered (within ``--http-max-input-size``), one task runs
``answer_infer`` (the same function the ASGI route runs) and the reply goes out in one write. Measured with
perf_analyzer on 2 cores: the ONNX add_sub +29% requests/s at 16 clients, a Python add/sub model +10-18% (its stub
processes take their share of the cores) and some 25 us less p50 at 1 client.

Everything else goes through uvicorn unchanged, and so does an infer request the protocol cannot answer on its own
without getting in uvicorn's way: one pipelined behind another request, one that expects ``100 Continue``, an
HTTP/1.0 one, or one whose path is escaped or has a query. While an inference of the protocol's own is under way,
``self.cycle`` is a stand-in that uvicorn sees as a response not yet complete, so it queues any request pipelined
behind it and starts it once ``on_response_complete`` says the answer has gone out: answers leave in order.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from edged.frontends.bodies import BodyTooLarge, framing_of, streamed_too_large
from edged.frontends.http.infer import HttpOptions, Reply, answer_infer
from edged.frontends.http.limits import ConnectionLimits, LimitedHttpProtocol

if TYPE_CHECKING:
    from prometheus_client import Counter

    from edged.core.service import InferencePath

log = logging.getLogger("edged.frontends.http")

# A reply body up to this size is joined to its head and sent in one write.
_JOIN_MAX = 256 * 1024
# Unescaped paths only (no '%', no query): anything else goes the ASGI way, which decodes it.
_INFER_PATH = re.compile(rb"/v2/models/([^/?%]+)(?:/versions/([0-9]+))?/infer")


class _Event:
    """What uvicorn sets on a cycle's event (a disconnect); nobody waits on it here."""

    __slots__ = ()

    def set(self) -> None:
        pass


class _Inference:
    """An infer request the protocol answers: uvicorn's ``cycle`` while it runs (see the module's docstring)."""

    __slots__ = (
        "chunks",
        "disconnected",
        "headers",
        "keep_alive",
        "model",
        "path",
        "refusal",
        "response_complete",
        "size",
        "task",
        "version",
    )

    message_event: ClassVar[_Event] = _Event()

    def __init__(self, match: re.Match[bytes], headers: dict[str, str], keep_alive: bool) -> None:
        self.path = match.group(0).decode("ascii")
        self.model = match.group(1).decode("ascii")
        self.version = match.group(2).decode("ascii") if match.group(2) is not None else None
        self.headers = headers
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.chunks: list[bytes] = []
        self.size = 0
        self.refusal: BodyTooLarge | None = None
        self.task: asyncio.Task[None] | None = None

    async def body(self) -> bytes:
        if self.refusal is not None:
            raise self.refusal
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


class InferHttpProtocol(LimitedHttpProtocol):
    """Give uvicorn ``InferHttpProtocol.serving(service, options, limits)`` as ``Config(http=...)``. The
    connection bounds of edged.frontends.http.limits apply to every request, its own included."""

    service: ClassVar[InferencePath]
    options: ClassVar[HttpOptions]
    # False when inference is not open to every client: then every request goes through the ASGI app, where the
    # access policy is asked.
    fast_infer: ClassVar[bool]

    @classmethod
    def serving(
        cls,
        service: InferencePath,
        options: HttpOptions,
        limits: ConnectionLimits,
        refused: Counter | None = None,
        *,
        fast_infer: bool = True,
    ) -> type[LimitedHttpProtocol]:
        return cls.limited(limits, "HTTP", refused, service=service, options=options, fast_infer=fast_infer)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inference: _Inference | None = None  # the request being parsed, when it is one of ours
        self._answering: _Inference | None = None  # the one whose answer is being worked out

    # --- parser callbacks ----------------------------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        match = self._own_request()
        self._inference = None
        if match is None:
            super().on_headers_complete()
            return
        # Read now: the parser may go on to a pipelined request (new headers) while this one is answered.
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in self.headers}
        if not self._admit():
            return
        inference = _Inference(match, headers, self.parser.should_keep_alive() and not self._close_after)
        self._inference = inference
        self.cycle = inference  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        inference = self._inference
        if inference is None:
            super().on_body(body)
            return
        if inference.refusal is not None:
            return  # refused already: the rest is read and dropped, never kept
        inference.size += len(body)
        if inference.size > self.options.max_input_size:
            framing = framing_of(inference.headers.get("inference-header-content-length"))
            inference.refusal = streamed_too_large(self.options.max_input_size, framing)
            inference.chunks.clear()
            return
        inference.chunks.append(body)

    def on_message_complete(self) -> None:
        inference = self._inference
        if inference is None:
            super().on_message_complete()
            return
        self._inference = None
        self._answering = inference
        self._request_read()
        task = self.loop.create_task(self._answer(inference))
        inference.task = task
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)  # a graceful shutdown waits for it, as for uvicorn's own

    def _refuse(self, status: int, message: str, *, linger: bool) -> None:
        # The parser may still call back for the rest of the data in hand: a refused request is no longer ours, so
        # its body is dropped and it is never answered a second time.
        self._inference = None
        super()._refuse(status, message, linger=linger)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        answering = self._answering
        if answering is not None and answering.task is not None and not answering.response_complete:
            # The client went away: its inference is cancelled, as a gRPC call's is.
            answering.disconnected = True
            answering.task.cancel()

    # --- answering -------------------------------------------------------------------------------------------------

    def _own_request(self) -> re.Match[bytes] | None:
        """The path's match when this request is one the protocol answers itself."""
        if not self.fast_infer or self.parser.get_method() != b"POST" or self.expect_100_continue:
            return None
        if self.parser.get_http_version() != "1.1" or self.parser.should_upgrade():
            return None
        if (self.cycle is not None and not self.cycle.response_complete) or self.pipeline:
            return None  # behind another request: uvicorn keeps the order
        return _INFER_PATH.fullmatch(self.url)

    async def _answer(self, inference: _Inference) -> None:
        service = self.service
        try:
            reply = await answer_infer(
                service,
                self.options,
                inference.path,
                inference.model,
                inference.version,
                inference.headers,
                inference.body,
                service.infer,
            )
        except asyncio.CancelledError:
            if inference.disconnected:
                log.debug("client of a POST %s went away: its request was cancelled", inference.path)
                return
            raise
        finally:
            self._answering = None
        if reply is not None:
            self._write(reply, inference.keep_alive)
        inference.response_complete = True
        if not inference.keep_alive:
            self.transport.close()
        self.on_response_complete()  # the keep-alive timer, reading again, the next pipelined request

    def _write(self, reply: Reply, keep_alive: bool) -> None:
        # As uvicorn writes a response (its default headers: date, server), but head and body in one write.
        head = [STATUS_LINE[reply.status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: ", reply.content_type, b"\r\ncontent-length: ", str(len(reply.body)).encode(), b"\r\n"]
        for name, value in reply.headers:
            head += [name, b": ", value, b"\r\n"]
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if len(reply.body) > _JOIN_MAX:
            self.transport.write(b"".join(head))  # a large body is not copied to be joined to its head
            self.transport.write(reply.body)
        else:
            head.append(reply.body)
            self.transport.write(b"".join(head))
