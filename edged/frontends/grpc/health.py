"""``grpc.health.v1.Health``: Check answers SERVING while the server is ready and NOT_SERVING otherwise, whatever
service is asked about, as Triton answers it; Watch streams that status, first as it is and then on each change, as
grpc's health protocol says.

Watch knows two services, the server as a whole (``""``) and ``inference.GRPCInferenceService``; for any other name
its one message is SERVICE_UNKNOWN and the stream stays open, as the protocol asks (a service that appears later
would be announced, and none does here). Every Watch ends when the server stops: NOT_SERVING is sent first if the
client last saw SERVING, then the stream ends with OK. A Watch is an HTTP/2 stream like any call, so the endpoint's
bounds on streams per connection and in all (edged.frontends.grpc.bounds) bound how many a client can hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

from edged.proto import health_pb2

if TYPE_CHECKING:
    from edged.core.service import InferenceService

_Reply = health_pb2.HealthCheckResponse
KNOWN_SERVICES: Final = frozenset({"", "inference.GRPCInferenceService"})
# How often readiness is looked at while anyone watches it. It follows from the started and stopping flags and from
# every model's state, none of which announces its changes, so it is sampled: once for every watcher together, and
# only while there is one.
SAMPLE_S: Final = 0.25


class HealthServicer:
    def __init__(self, service: InferenceService) -> None:
        self._service = service
        self._closing = False
        # Set, and replaced by a new one, whenever the status may have changed; a watcher waits on the one it held
        # when it last looked, so a change made while it was sending is not missed.
        self._changed = asyncio.Event()
        self._watchers = 0
        self._sampler: asyncio.Task[None] | None = None

    async def Check(self, request: Any, context: Any) -> Any:
        return _Reply(status=_Reply.SERVING if self._service.is_ready() else _Reply.NOT_SERVING)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self._watchers += 1
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.get_running_loop().create_task(self._sample())
        try:
            if request.service not in KNOWN_SERVICES:
                yield _Reply(status=_Reply.SERVICE_UNKNOWN)
                while not self._closing:
                    await self._changed.wait()
                return
            sent = None
            while True:
                changed = self._changed
                status = self._status()
                if status != sent:
                    yield _Reply(status=status)
                    sent = status
                if self._closing:
                    return
                await changed.wait()
        finally:
            self._watchers -= 1

    def close_streams(self) -> None:
        """The server stops: every Watch says NOT_SERVING, if it has not, and ends."""
        self._closing = True
        self._wake()
        if self._sampler is not None:
            self._sampler.cancel()

    def _status(self) -> _Reply.ServingStatus:
        return _Reply.SERVING if not self._closing and self._service.is_ready() else _Reply.NOT_SERVING

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _sample(self) -> None:
        ready = self._service.is_ready()
        while self._watchers and not self._closing:
            await asyncio.sleep(SAMPLE_S)
            now = self._service.is_ready()
            if now != ready:
                ready = now
                self._wake()
