"""Schedulers hand requests to free model instances.

``Scheduler.enqueue(request)`` is the one entry point the service uses; the direct scheduler below sends each
request on its own, and the dynamic batcher (edged.core.scheduling.dynamic) groups them behind the same interface.

Threads: ``enqueue`` runs on the event loop. An instance's ``execute`` runs either inline on the loop or on the
shared worker pool: inline when the model's recent executions were shorter than a thread hand-off costs (tiny
models such as add_sub run in microseconds and a hop to a thread would triple their latency), on the pool
otherwise so the loop keeps serving while onnxruntime works. An instance with ``execute_async`` (its work is in
another process) is awaited on the loop: no thread is needed to wait for it.

Cancellation: a request whose caller is cancelled (the client went away) is marked with ``request.cancel()``;
its execution goes on until the backend returns, and only then is the instance free again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from edged.core.scheduling.rate_limiter import RATE_LIMITER
from edged.core.stats import ExecutionTiming, FailureReason
from edged.core.trace_file import LIVE
from edged.errors import AnsweredError, EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from concurrent.futures import Executor

    from edged.core.backend_api import BackendInstance
    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.stats import ModelStatistics

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Executions shorter than this (moving average) stay on the event loop...
INLINE_BUDGET_NS = 150_000
# ...unless the request is large: a model that is fast on small inputs may not be on a big one, and one slow
# execution on the loop would stall every other client.
INLINE_MAX_INPUT_BYTES = 64 * 1024
# Inline executions are timed too, so a model that turns slow (larger inputs) moves back to the pool.
_EWMA_WEIGHT = 0.1


class Scheduler(Protocol):
    async def enqueue(self, request: InferRequest) -> InferResponse | EdgedError | None:
        """The response, or the error; None for a request answered through its stream (decoupled models)."""
        ...

    async def drain(self) -> None:
        """Wait until no request is in flight."""
        ...


class DirectScheduler:
    """One request per execution, on whichever instance is free."""

    def __init__(self, instances: Sequence[BackendInstance], executor: Executor, stats: ModelStatistics) -> None:
        self._free: deque[BackendInstance] = deque(instances)
        # Instances on their way out (remove_instances), by id, with what to tell when the last one is idle.
        self._leaving: dict[int, Leaving] = {}
        self._waiters: deque[asyncio.Future[BackendInstance]] = deque()
        self._stats = stats
        self._runner = BatchRunner(executor, stats.name)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def enqueue(self, request: InferRequest) -> InferResponse | EdgedError | None:
        # Counted from arrival, so drain() also waits for requests still queued for an instance.
        self._in_flight += 1
        self._idle.clear()
        try:
            # Newest-released first: the instance that just ran has its weights and threads warm.
            instance = self._free.pop() if self._free else await self._wait_for_instance()
        except asyncio.CancelledError:
            self._done()
            request.cancel()
            self._stats.record_failure(time.monotonic_ns() - request.arrival_ns, FailureReason.CANCELED)
            raise
        except BaseException:
            self._done()
            raise
        queued_ns = time.monotonic_ns() - request.arrival_ns
        timing = ExecutionTiming()
        # The one way every scheduler runs a batch (BatchRunner): inline, on the pool, or awaited.
        # The loop kept from the first request: asyncio.get_running_loop() makes a getpid() system call each time.
        loop = self._loop or self._first_loop()
        finished: asyncio.Future[list[Any]] = loop.create_future()
        inline = self._runner.run(instance, [request], timing, finished.set_result, loop)
        if inline is not None:
            self._finish(instance)
            result: InferResponse | EdgedError | None = inline[0]
        else:
            result = (await self._run(instance, request, timing, finished))[0]
        self._stats.record_execution(request.batch_size, timing)
        request_ns = time.monotonic_ns() - request.arrival_ns
        if isinstance(result, EdgedError) and not isinstance(result, AnsweredError):
            self._stats.record_failure(request_ns, _reason(request))
        else:
            self._stats.record_success(request.batch_size, request_ns, queued_ns, timing)
            if isinstance(result, AnsweredError):
                self._stats.record_answered_error()
        return result

    async def _run(
        self, instance: BackendInstance, request: InferRequest, timing: ExecutionTiming, work: asyncio.Future[_T]
    ) -> _T:
        """Await an execution that the caller's cancellation must not cut short: the instance is busy until the
        execution really ends, whatever happens to the caller."""
        try:
            # Shielded: a cancelled request (the client went away) must not free the instance while it executes.
            result = await asyncio.shield(work)
        except asyncio.CancelledError:
            request.cancel()
            work.add_done_callback(lambda done: self._abandoned(instance, request, timing, done))
            raise
        except BaseException:
            self._finish(instance)
            raise
        self._finish(instance)
        return result

    def _abandoned(
        self, instance: BackendInstance, request: InferRequest, timing: ExecutionTiming, work: asyncio.Future[Any]
    ) -> None:
        if not work.cancelled() and work.exception() is not None:
            log.error("execution of a cancelled request failed: %r", work.exception())
        self._finish(instance)
        # The statistics say what the model did: an execution that still completed is a success, one that was
        # cut short (the backend stopped it for the cancellation) a failure.
        self._stats.record_execution(request.batch_size, timing)
        request_ns = time.monotonic_ns() - request.arrival_ns
        first = None if work.cancelled() or work.exception() is not None else _first_response(work.result())
        if first is None or isinstance(first, EdgedError):
            self._stats.record_failure(request_ns, FailureReason.CANCELED)
        else:
            self._stats.record_success(request.batch_size, request_ns, 0, timing)

    def _first_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    async def drain(self) -> None:
        await self._idle.wait()

    def _finish(self, instance: BackendInstance) -> None:
        self._done()
        self._release(instance)

    def _done(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def _wait_for_instance(self) -> BackendInstance:
        waiter: asyncio.Future[BackendInstance] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._stats.pending += 1
        try:
            return await waiter
        except asyncio.CancelledError:
            # Cancelled after an instance was handed over: pass it on instead of losing it.
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())
            raise
        finally:
            self._stats.pending -= 1

    def add_instances(self, instances: Sequence[BackendInstance]) -> None:
        """More instances to use from now on (an instance count raised without a reload)."""
        for instance in instances:
            self._release(instance)

    def remove_instances(self, instances: Sequence[BackendInstance]) -> asyncio.Future[None]:
        """Stop handing these instances work; the future resolves once none of them is executing."""
        self._leaving, done = leave_instances(self._free, self._leaving, instances)
        return done

    def _release(self, instance: BackendInstance) -> None:
        if self._leaving and instance_left(self._leaving, instance):
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(instance)
                return
        self._free.append(instance)


def _reason(request: InferRequest) -> FailureReason:
    return FailureReason.CANCELED if request.cancelled else FailureReason.BACKEND


def _first_response(results: Any) -> Any:
    """The single request's result from the results of its execution."""
    return results[0] if isinstance(results, list) and results else None


def input_bytes(request: InferRequest) -> int:
    return sum(t.data.nbytes if t.data is not None else 0 for t in request.inputs)


class Leaving:
    """Instances leaving a scheduler: ``done`` resolves when the last of them is idle."""

    __slots__ = ("done", "remaining")

    def __init__(self, done: asyncio.Future[None], remaining: int) -> None:
        self.done = done
        self.remaining = remaining


def leave_instances(
    free: deque[BackendInstance], leaving: dict[int, Leaving], instances: Sequence[BackendInstance]
) -> tuple[dict[int, Leaving], asyncio.Future[None]]:
    """Take the idle ones out of ``free`` now, and mark the busy ones to be dropped when they are released."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    busy = [instance for instance in instances if instance not in free]
    for instance in instances:
        if instance in free:
            free.remove(instance)
    if not busy:
        done.set_result(None)
        return leaving, done
    group = Leaving(done, len(busy))
    return {**leaving, **{id(instance): group for instance in busy}}, done


def instance_left(leaving: dict[int, Leaving], instance: BackendInstance) -> bool:
    """Whether a released instance was leaving (and is now gone)."""
    group = leaving.pop(id(instance), None)
    if group is None:
        return False
    group.remaining -= 1
    if group.remaining == 0 and not group.done.done():
        group.done.set_result(None)
    return True


class BatchRunner:
    """Runs a batch on an instance the way every scheduler does: inline on the loop while the model's executions
    are shorter than a thread hand-off (and the inputs small), on the worker pool otherwise, and awaited for an
    instance whose work is in another process. Keeps the moving average that decides."""

    def __init__(self, executor: Executor, model: str) -> None:
        self._executor = executor
        self._model = model
        # Start on the pool: a first execution may be a large model, and the estimate is cheap to correct.
        self._average_ns = float(INLINE_BUDGET_NS * 10)

    def run(
        self,
        instance: BackendInstance,
        requests: list[InferRequest],
        timing: ExecutionTiming,
        done: Callable[[list[Any]], None],
        loop: asyncio.AbstractEventLoop | None = None,
        traced: bool = False,
        gated: bool = False,
    ) -> list[Any] | None:
        """The results when the batch ran inline (``done`` is then not called); otherwise None, and ``done``
        gets them on the event loop (``loop``, the running one) when the execution ends. A backend that raises
        fails its batch only."""
        if RATE_LIMITER.on and not gated:  # --rate-limit execution_count: with it off, this check is all it costs
            return self._run_gated(instance, requests, timing, done, loop)
        if LIVE.count and not traced:  # some request is traced: with tracing off, this check is all it costs
            return self._run_traced(instance, requests, timing, done, loop)
        execute_async = getattr(instance, "execute_async", None)
        if execute_async is not None:
            work: asyncio.Future[Any] = asyncio.ensure_future(execute_async(requests, timing))
        elif self._average_ns < INLINE_BUDGET_NS and sum(map(input_bytes, requests)) <= INLINE_MAX_INPUT_BYTES:
            results, elapsed = _run_guarded(instance, requests, timing)
            self._observe(elapsed)
            return results
        else:
            loop = loop or asyncio.get_running_loop()
            work = loop.run_in_executor(self._executor, _run_guarded, instance, requests, timing)
        work.add_done_callback(lambda finished: done(self._outcome(finished, len(requests))))
        return None

    def _run_gated(
        self,
        instance: BackendInstance,
        requests: list[InferRequest],
        timing: ExecutionTiming,
        done: Callable[[list[Any]], None],
        loop: asyncio.AbstractEventLoop | None,
    ) -> list[Any] | None:
        """``run`` once the rate limiter allocates the instance its resources; they are released as it ends."""
        context = RATE_LIMITER.context(instance)
        if context is None:
            return self.run(instance, requests, timing, done, loop, gated=True)
        loop = loop or asyncio.get_running_loop()

        def finished(results: list[Any]) -> None:
            RATE_LIMITER.release(context)
            done(results)

        def start() -> None:
            inline = self.run(instance, requests, timing, finished, loop, gated=True)
            if inline is not None:  # on the next turn: the schedulers expect ``done`` after ``run`` returned
                loop.call_soon(finished, inline)

        RATE_LIMITER.request(context, start)
        return None

    def _run_traced(
        self,
        instance: BackendInstance,
        requests: list[InferRequest],
        timing: ExecutionTiming,
        done: Callable[[list[Any]], None],
        loop: asyncio.AbstractEventLoop | None,
    ) -> list[Any] | None:
        """``run``, and the traced requests of the batch get the execution's compute timestamps."""
        if not getattr(instance, "traces_compute", True):
            return self.run(instance, requests, timing, done, loop, traced=True, gated=True)
        start = time.monotonic_ns()

        def stamp(results: list[Any]) -> None:
            end = time.monotonic_ns()
            for request, result in zip(requests, results, strict=False):
                if request.trace is not None:
                    request.trace.compute(start, end, timing.input_ns, timing.output_ns, result)

        def finished(results: list[Any]) -> None:
            stamp(results)
            done(results)

        inline = self.run(instance, requests, timing, finished, loop, traced=True, gated=True)
        if inline is not None:
            stamp(inline)
        return inline

    def _outcome(self, work: asyncio.Future[Any], count: int) -> list[Any]:
        if work.cancelled() or work.exception() is not None:
            log.error("execution of model '%s' failed: %r", self._model, work.exception())
            return [EdgedError(ErrorCode.INTERNAL, f"execution failed: {work.exception()!r}")] * count
        outcome = work.result()
        if isinstance(outcome, tuple):  # from the pool: (results, elapsed)
            results, elapsed = outcome
            self._observe(elapsed)
            return list(results)
        return list(outcome)

    def _observe(self, elapsed_ns: int) -> None:
        self._average_ns += (elapsed_ns - self._average_ns) * _EWMA_WEIGHT


def _run_guarded(
    instance: BackendInstance, requests: list[InferRequest], timing: ExecutionTiming
) -> tuple[list[Any], int]:
    start = time.perf_counter_ns()
    try:
        results: list[Any] = instance.execute(requests, timing)
    except Exception as exc:  # a backend must answer with errors; one bug must not stall the queue behind it
        log.exception("execution failed")
        results = [EdgedError(ErrorCode.INTERNAL, str(exc))] * len(requests)
    return results, time.perf_counter_ns() - start
