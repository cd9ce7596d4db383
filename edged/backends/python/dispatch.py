"""Which stub runs a request, and when: the model's instances as the scheduler sees them.

The scheduler gives an instance one request at a time and waits for its answer before giving it another. For a
stub process that would leave the stub idle for a whole round trip between two requests (the answer travels back,
the event loop gets to it, the next request travels out), which for a small model costs more than the model
itself. So the scheduler is given ``SLOTS_PER_INSTANCE`` slots per stub instead of the stubs themselves, and each
slot hands its request to the dispatcher, which sends it at once to the stub with the fewest batches in flight:
while a stub executes one request, the next ones are already waiting in its socket (pipelining), and the answers
of several come back in one turn of the loop. A stub still runs one ``execute`` at a time, in the order the
batches were sent, exactly as before.

Queueing a request behind another only pays for requests that are small and fast. A request is therefore sent to a
busy stub only when its tensors travel inside the packet (ipc.INLINE_MAX, so queued requests never grow the
shared-memory rings) and the model's recent executions are shorter than ``PIPELINE_BUDGET_NS``; otherwise it waits
here for the first idle stub, as it would have waited in the scheduler, and a request cancelled meanwhile is
answered without running.

Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from edged.backends.python.wire import ipc
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edged.backends.python.instance import PythonInstance, Queued, Results
    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.stats import ExecutionTiming

SLOTS_PER_INSTANCE = 8
# Models whose executions take longer than this on average gain little from pipelining, and a request queued
# behind one could have started sooner on another instance.
PIPELINE_BUDGET_NS = 1_000_000
_EWMA_WEIGHT = 0.1


class Dispatcher:
    def __init__(self, instances: Sequence[PythonInstance]) -> None:
        self._instances = list(instances)
        self._waiting: deque[Queued] = deque()
        self._average_ns = 0.0  # of the stubs' executions, as the daemon sees them
        for instance in self._instances:
            instance.on_free = self._on_free
            instance.on_requeue = self._requeue

    def add(self, instances: Sequence[PythonInstance]) -> None:
        """More stubs to send to (on the event loop)."""
        for instance in instances:
            instance.on_free = self._on_free
            instance.on_requeue = self._requeue
            self._instances.append(instance)
        if instances:
            self._on_free(instances[0], None)  # requests waiting for a stub may go to the new ones

    def remove(self, instances: Sequence[PythonInstance]) -> None:
        """Send nothing more to these stubs (on the event loop); what they have in flight still completes."""
        self._instances = [instance for instance in self._instances if instance not in instances]

    def dispatch(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> asyncio.Future[Results]:
        best: PythonInstance | None = None
        best_load = 0
        for instance in self._instances:
            if instance.available:
                load = instance.in_flight
                if best is None or load < best_load:
                    best, best_load = instance, load
                    if load == 0:
                        break
        if best is None:
            # None can take it now (restarting, or failed): the first waits for its restart, or answers the error.
            return self._instances[0].execute_async(requests, timing)
        if best_load == 0 or (self._average_ns < PIPELINE_BUDGET_NS and _small(requests)):
            return best.execute_async(requests, timing)
        future: asyncio.Future[Results] = asyncio.get_running_loop().create_future()
        self._waiting.append((requests, timing, future))
        return future

    def _requeue(self, batches: list[Queued]) -> None:
        """Batches a dead stub never started: first in line again, in their order (the instance that lost them
        calls ``_on_free`` next, which sends them on)."""
        self._waiting.extendleft(reversed(batches))

    def _on_free(self, instance: PythonInstance, elapsed_ns: int | None) -> None:
        """An instance finished a batch (``elapsed_ns``: how long the stub took), or failed what it had."""
        if elapsed_ns is not None:
            self._average_ns += (elapsed_ns - self._average_ns) * _EWMA_WEIGHT
        while self._waiting:
            target = None
            for candidate in self._instances:
                if candidate.available and candidate.in_flight == 0:
                    target = candidate
                    break
            if target is None:
                if any(candidate.available for candidate in self._instances):
                    return  # a busy one frees up later and comes back here
                target = self._instances[0]  # none can serve: it waits for its restart, or answers the error
            requests, timing, future = self._waiting.popleft()
            if future.done():
                continue
            if all(request.cancelled for request in requests):
                future.set_result([_CANCELLED] * len(requests))
                continue
            target.execute_async(requests, timing, future)

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        first = self._instances[0]
        loop = first.host_loop
        if loop is None:
            return first.execute(requests, timing)  # answers that it only serves inside the daemon

        async def run() -> Results:
            return await self.dispatch(requests, timing)

        results = asyncio.run_coroutine_threadsafe(run(), loop).result()
        return [r if r is not None else first.no_response() for r in results]

    def fail_waiting(self, error: EdgedError) -> None:
        waiting, self._waiting = self._waiting, deque()
        for requests, _timing, future in waiting:
            if not future.done():
                future.set_result([error] * len(requests))


_CANCELLED = EdgedError(ErrorCode.CANCELLED, "the request was cancelled before it was executed")


def _small(requests: Sequence[InferRequest]) -> bool:
    total = 0
    for request in requests:
        for tensor in request.inputs:
            if tensor.data is not None:
                total += tensor.data.nbytes
            elif tensor.raw is not None:
                total += len(tensor.raw)
    return total <= ipc.INLINE_MAX


class Slot:
    """What the scheduler takes for an instance: one more request that may be in flight on the model's stubs."""

    __slots__ = ("_dispatcher", "name")

    def __init__(self, dispatcher: Dispatcher, name: str) -> None:
        self._dispatcher = dispatcher
        self.name = name

    def execute_async(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> asyncio.Future[Results]:
        """A plain future rather than a coroutine: the scheduler awaits it with no task of its own."""
        return self._dispatcher.dispatch(requests, timing)

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        """From a worker thread (the scheduler uses ``execute_async``; this keeps the plain interface working)."""
        return self._dispatcher.execute(requests, timing)
