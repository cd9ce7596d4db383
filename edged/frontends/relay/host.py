"""The daemon's end of its frontend workers' connections: each worker's decoded inference requests run on the
daemon's service, and its clients' other HTTP requests on the daemon's own HTTP app.

Calls a worker sends, by their first item (edged.frontends.relay.wire):

- ``infer`` (n, request): one response, ``ok`` or ``error``;
- ``stream`` (n, request): the request's responses as ``item`` messages, the last one final (a decoupled model may
  send several); an error found before the model ran is an ``error``;
- ``cancel`` (n): the worker's client went away, the request is cancelled;
- ``lookup`` (n, name, version): the model version a request would go to, what a worker needs to decode one;
- ``token`` (n, id): an API token's record, for a worker that checks access to inference;
- ``settings`` (n): the daemon's settings, which a worker serves with;
- ``ready`` (n): the worker serves its ports;
- ``count`` (0, counter, labels, amount): one of the daemon's counters (``counters``) goes up by what the worker
  counted (a refused connection, a refused request), so /metrics counts every process; never answered;
- ``refused`` (0, name, version): the worker answered an inference request with an error of its own (a body it
  could not decode; name None: no such model), which the daemon's service counts for its metrics history; never
  answered;
- ``http`` (n, scope) then ``body`` (n, message) as the client sends: an ASGI request the daemon's HTTP app
  answers with ``send`` (n, message) messages, then ``done``.

The daemon looks every request's model up again (a worker's lookups may be a second old): what a worker decoded
is checked by the same rules as the daemon's own requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from edged.core.service import ModelHandle
from edged.errors import EdgedError, ErrorCode
from edged.frontends.relay.wire import FrameProtocol, Message, error_state, pack_response, unpack_request

if TYPE_CHECKING:
    from edged.core.request.inference import StreamResponse
    from edged.core.service import InferenceService

log = logging.getLogger("edged.relay")

# Scope keys a relayed ASGI request carries: what the worker's server knew of the request and its client.
SCOPE_KEYS = (
    "type",
    "asgi",
    "http_version",
    "method",
    "scheme",
    "path",
    "raw_path",
    "query_string",
    "root_path",
    "headers",
    "client",
    "server",
)


class RelayHost:
    """Serves the workers' connections on a Unix socket at ``path`` (in a directory only the daemon can enter)."""

    def __init__(
        self,
        path: str,
        service: InferenceService,
        settings: Any,
        find_token: Callable[[str], Any],
        counters: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = path
        self._service = service
        self._settings = settings
        self._find_token = find_token
        self.counters = dict(counters or {})
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        # The daemon's HTTP app, which answers what a worker's HTTP clients ask besides inference.
        self.http_app: Any = None
        self._ready = 0
        self._ready_changed = asyncio.Event()

    async def wait_ready(self, count: int) -> None:
        """Until ``count`` workers said they serve (since the daemon started)."""
        while self._ready < count:
            self._ready_changed.clear()
            await self._ready_changed.wait()

    def worker_ready(self) -> None:
        self._ready += 1
        self._ready_changed.set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._connect, self.path)
        os.chmod(self.path, 0o600)

    def _connect(self) -> FrameProtocol:
        connection = _Connection(self)
        self._connections.add(connection)
        return connection.protocol

    def forget(self, connection: _Connection) -> None:
        self._connections.discard(connection)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _Connection:
    """One worker connection: its calls in flight, by number."""

    def __init__(self, host: RelayHost) -> None:
        self._host = host
        self.protocol = FrameProtocol(self._received, self._lost)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        # Request bodies of relayed HTTP requests, by call.
        self._bodies: dict[int, asyncio.Queue[dict[str, Any]]] = {}

    def close(self) -> None:
        if self.protocol.transport is not None:
            self.protocol.transport.close()

    def _lost(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._host.forget(self)

    def _received(self, message: Message) -> None:
        kind, number = message[0], message[1]
        if kind in ("infer", "stream"):
            self._start(number, self._infer(number, message[2], stream=kind == "stream"))
        elif kind == "cancel":
            task = self._tasks.get(number)
            if task is not None:
                task.cancel()
        elif kind == "body":
            queue = self._bodies.get(number)
            if queue is not None:
                queue.put_nowait(message[2])
        elif kind == "http":
            self._bodies[number] = asyncio.Queue()
            self._start(number, self._http(number, message[2]))
        elif kind == "count":
            counter = self._host.counters.get(message[2])
            if counter is not None:
                counter.labels(*message[3]).inc(message[4])
        elif kind == "refused":
            name, version = message[2], message[3]
            self._host._service.refused(ModelHandle(name, version, False, None) if name is not None else None)
        else:
            self._answer_now(number, kind, message)

    def _answer_now(self, number: int, kind: str, message: Message) -> None:
        """The calls answered at once, without a task."""
        host = self._host
        try:
            if kind == "lookup":
                handle = host._service.find_model(message[2], message[3])
                result: Any = (handle.name, handle.version, handle.decoupled, host._service.model_signature(handle))
            elif kind == "token":
                result = host._find_token(message[2])
            elif kind == "settings":
                result = host._settings
            elif kind == "ready":
                host.worker_ready()
                result = None
            else:
                raise EdgedError(ErrorCode.INTERNAL, f"unknown relay call '{kind}'")
        except EdgedError as exc:
            self.protocol.send(("error", number, error_state(exc)))
            return
        except Exception:
            log.exception("relay call %s failed", kind)
            self.protocol.send(("error", number, (ErrorCode.INTERNAL.value, "internal error")))
            return
        self.protocol.send(("ok", number, result))

    def _start(self, number: int, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks[number] = task
        task.add_done_callback(lambda _: self._tasks.pop(number, None))

    async def _infer(self, number: int, packed: tuple[Any, ...], *, stream: bool) -> None:
        """One request: its response (``ok``), or each of its responses in turn (``item``), or an ``error``."""
        send = self.protocol.send
        service = self._host._service
        request = None
        try:
            request = unpack_request(packed)
            if stream:
                async for item in service.infer_stream(request):
                    send(("item", number, _item_state(item)))
            else:
                send(("ok", number, pack_response(await service.infer(request))))
        except EdgedError as exc:
            send(("error", number, error_state(exc)))
        except asyncio.CancelledError:
            if request is not None:
                request.cancel()
            raise
        except Exception:
            log.exception("unhandled error in a worker's %s", "stream" if stream else "inference")
            send(("error", number, (ErrorCode.INTERNAL.value, "internal error")))

    async def _http(self, number: int, scope: dict[str, Any]) -> None:
        queue = self._bodies[number]
        send_frame = self.protocol.send

        async def receive() -> dict[str, Any]:
            return await queue.get()

        async def send(message: dict[str, Any]) -> None:
            send_frame(("send", number, message))

        try:
            await self._host.http_app(scope, receive, send)
        except Exception:
            log.exception("unhandled error in a relayed HTTP request")
        finally:
            self._bodies.pop(number, None)
            send_frame(("done", number))


def _item_state(item: StreamResponse) -> tuple[Any, tuple[str, str] | None, bool]:
    response = pack_response(item.response) if item.response is not None else None
    return (response, error_state(item.error) if item.error is not None else None, item.final)
