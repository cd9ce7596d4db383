"""The dynamic batcher: Triton's ``dynamic_batching`` scheduler, behind the same ``enqueue`` as the direct one.

Requests wait in one queue per priority level (level 1 first; a model without ``priority_levels`` has one queue).
Whenever an instance is free, the batcher forms a batch from the front of the queues as Triton does:

- requests join while the batch stays within ``max_batch_size`` and their non-batch shapes equal the first
  request's (inputs marked ``allow_ragged_batch`` excepted) and they carry the same set of inputs;
- a batch that reaches a ``preferred_batch_size`` (or the largest one that fits) goes at once;
- otherwise it waits until its oldest request has waited ``max_queue_delay_microseconds`` (zero: it goes at
  once), or until it cannot grow any more.

Each level's queue policy applies: ``max_queue_size`` refuses a request with UNAVAILABLE, a request that waited past
its timeout is rejected (``REJECT``) or moved behind the requests that did not time out (``DELAY``); a request may
shorten, never lengthen, the timeout when ``allow_timeout_override`` is set. With ``preserve_ordering``, responses
are released in the order the requests arrived.

Nothing here runs on a thread of its own: the batcher acts when a request arrives, when an execution ends, and when
a timer it set (queue delay, request timeout) fires, all on the event loop. Executions run as the direct
scheduler runs them (inline for tiny models, on the worker pool, or awaited for backends in another process), so
two free instances run two batches at once, as far as the cores hold them: an instance that keeps a share of the
cores busy while it runs (``cpu_share``: an ONNX Runtime CPU session, a thread per core by default) starts only
while the running executions leave it that share. Two such instances on the cores of one device would each run
half as fast on a batch half the size, where waiting for the first lets the queue grow into one batch that runs at
full speed; an instance whose session has ``intra_op_thread_count`` = cores / instances runs beside the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edged.core.scheduling.scheduler import (
    BatchRunner,
    Leaving,
    instance_left,
    leave_instances,
)
from edged.core.stats import ExecutionTiming, FailureReason
from edged.errors import AnsweredError, EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Sequence
    from concurrent.futures import Executor

    from edged.core.backend_api import BackendInstance
    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.stats import ModelStatistics
    from edged.proto.model_config_pb2 import ModelConfig, ModelQueuePolicy

log = logging.getLogger(__name__)

Result = Any  # InferResponse | EdgedError | None, as the backends answer
_REJECT = 0  # ModelQueuePolicy.REJECT


@dataclass(slots=True, eq=False)
class _Entry:
    request: InferRequest
    future: asyncio.Future[Result]
    size: int  # batch items it adds (1 for a model without batching)
    deadline_ns: int  # monotonic; 0: never times out
    # With preserve_ordering: its result, once known, waits here for the requests ahead of it.
    result: Result = None
    settled: bool = False


@dataclass(slots=True)
class _PolicyQueue:
    reject: bool
    timeout_us: int
    allow_override: bool
    max_size: int
    queue: deque[_Entry] = field(default_factory=deque)
    # Requests whose timeout passed under the DELAY action: served after every request that did not time out.
    delayed: deque[_Entry] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)

    def deadline(self, request: InferRequest, now_ns: int) -> int:
        timeout_us = self.timeout_us
        if self.allow_override:
            asked = request.parameters.get("timeout")
            # A request may only shorten the timeout (so a policy without one keeps none).
            if isinstance(asked, int) and not isinstance(asked, bool) and 0 < asked < timeout_us:
                timeout_us = asked
        return now_ns + timeout_us * 1000 if timeout_us > 0 else 0


def _policy_queue(policy: ModelQueuePolicy) -> _PolicyQueue:
    return _PolicyQueue(
        reject=policy.timeout_action == _REJECT,
        timeout_us=policy.default_timeout_microseconds,
        allow_override=policy.allow_timeout_override,
        max_size=policy.max_queue_size,
    )


class DynamicBatcher:
    def __init__(
        self,
        instances: Sequence[BackendInstance],
        executor: Executor,
        stats: ModelStatistics,
        config: ModelConfig,
    ) -> None:
        batching = config.dynamic_batching
        self._free: deque[BackendInstance] = deque(instances)
        self._leaving: dict[int, Leaving] = {}
        self._stats = stats
        self._batching = config.max_batch_size > 0
        self._max_batch = max(config.max_batch_size, 1)
        self._preferred = frozenset(batching.preferred_batch_size)
        self._max_preferred = max(self._preferred) if self._preferred else self._max_batch
        self._delay_ns = batching.max_queue_delay_microseconds * 1000
        self._preserve_ordering = batching.preserve_ordering
        self._levels = batching.priority_levels
        self._default_level = batching.default_priority_level if self._levels else 0
        self._default_policy = batching.default_queue_policy
        # Level -> queue, kept sorted by level: the first non-empty queue is served first.
        self._queues: dict[int, _PolicyQueue] = {self._default_level: _policy_queue(self._default_policy)}
        if self._levels:  # without priority levels, Triton ignores per-level policies
            for level, policy in batching.priority_queue_policy.items():
                self._queues[level] = _policy_queue(policy)
        self._queues = dict(sorted(self._queues.items()))
        # Queues whose requests may time out with REJECT: they are answered when the timeout passes, as in Triton,
        # not when an instance frees up.
        self._rejecting = [q for q in self._queues.values() if q.reject and (q.timeout_us > 0 or q.allow_override)]
        self._ragged = frozenset(tensor.name for tensor in config.input if tensor.allow_ragged_batch)
        self._queued = 0
        self._in_flight = 0  # queued or executing
        self._order: deque[_Entry] = deque()  # with preserve_ordering: every request not yet answered
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._runner = BatchRunner(executor, config.name)
        # The share of the cores the running executions keep busy (see the module's docstring).
        self._cpu_busy = 0.0

    # --- requests ------------------------------------------------------------------------------------------------

    async def enqueue(self, request: InferRequest) -> InferResponse | EdgedError | None:
        level = self._level(request)
        queue = self._queues.get(level)
        if queue is None:
            queue = self._queues[level] = _policy_queue(self._default_policy)
            self._queues = dict(sorted(self._queues.items()))
        if queue.max_size and len(queue) >= queue.max_size:
            # Refused before it was queued: as in Triton, the statistics do not count it (a timeout does); the
            # refusal is counted for the metrics history.
            self._stats.record_refusal()
            return EdgedError(ErrorCode.UNAVAILABLE, f"{_log_prefix(request)}Exceeds maximum queue size")
        loop = asyncio.get_running_loop()
        entry = _Entry(
            request,
            loop.create_future(),
            max(request.batch_size, 1) if self._batching else 1,
            queue.deadline(request, time.monotonic_ns()),
        )
        queue.queue.append(entry)
        self._queued += 1
        self._stats.pending += 1
        self._in_flight += 1
        self._idle.clear()
        if self._preserve_ordering:
            self._order.append(entry)
        self._schedule()
        try:
            # Shielded: the caller going away must not cancel the future other requests' delivery depends on.
            return await asyncio.shield(entry.future)
        except asyncio.CancelledError:
            request.cancel()
            if self._remove(entry):
                self._cancelled(entry)
                self._schedule()
            raise

    def _level(self, request: InferRequest) -> int:
        if not self._levels:
            return 0
        asked = request.parameters.get("priority")
        # Triton: 0, or a level the model does not have, means the default level.
        if isinstance(asked, int) and not isinstance(asked, bool) and 0 < asked <= self._levels:
            return asked
        return self._default_level

    async def drain(self) -> None:
        await self._idle.wait()

    def add_instances(self, instances: Sequence[BackendInstance]) -> None:
        """More instances to use from now on (an instance count raised without a reload)."""
        self._free.extend(instances)
        self._schedule()

    def remove_instances(self, instances: Sequence[BackendInstance]) -> asyncio.Future[None]:
        """Stop giving these instances batches; the future resolves once none of them is executing."""
        self._leaving, done = leave_instances(self._free, self._leaving, instances)
        return done

    # --- forming batches -----------------------------------------------------------------------------------------

    def _schedule(self) -> None:
        """Start batches while an instance is free and a batch is ready; otherwise wake up when one may be, or when
        a waiting request's timeout passes."""
        self._start_batches()
        if self._rejecting and self._queued:
            now = time.monotonic_ns()
            self._apply_policies(now)
            deadlines = [e.deadline_ns for queue in self._rejecting for e in queue.queue if e.deadline_ns]
            if deadlines:
                self._wake_in(max(1000, min(deadlines) - now + 1))

    def _start_batches(self) -> None:
        while self._free and self._queued:
            if self._cpu_busy > 0 and self._cpu_busy + _cpu_share(self._free[-1]) > 1.0 + 1e-9:
                return  # the cores are taken: the queue grows into the next batch meanwhile
            batch, wait_ns = self._form_batch()
            if batch is None:
                if wait_ns > 0:
                    self._wake_in(wait_ns)
                return
            for entry in batch:
                self._remove(entry)
            # Newest-released first: the instance that just ran has its weights and threads warm. An inline
            # execution completes here, and the loop goes on (no recursion through _finish).
            self._start(self._free.pop(), batch)

    def _form_batch(self) -> tuple[list[_Entry] | None, int]:
        now = time.monotonic_ns()
        self._apply_policies(now)
        batch: list[_Entry] = []
        size = 0
        best = 0  # requests in the largest batch of a preferred size (or of the largest preferred size that fits)
        send_now = False
        first_shape: tuple[Any, ...] | None = None
        for entry in self._candidates():
            if batch:
                if size + entry.size > self._max_preferred and best == 0:
                    best = len(batch)
                if size + entry.size > self._max_batch:
                    send_now = True
                    break
                if self._shape_key(entry.request) != first_shape:
                    send_now = True
                    break
            else:
                first_shape = self._shape_key(entry.request)
            batch.append(entry)
            size += entry.size
            if size in self._preferred:
                best = len(batch)
        if not batch:
            return None, 0
        oldest = min(entry.request.arrival_ns for entry in batch)
        waited = now - oldest
        delay_exceeded = self._delay_ns > 0 and waited >= self._delay_ns
        if best and not delay_exceeded:
            return batch[:best], 0
        if send_now or size >= self._max_preferred or delay_exceeded or self._delay_ns == 0:
            return batch, 0
        wait_ns = self._delay_ns - waited
        deadlines = [entry.deadline_ns for entry in batch if entry.deadline_ns]
        if deadlines:
            wait_ns = max(1000, min(wait_ns, min(deadlines) - now))
        return None, wait_ns

    def _candidates(self) -> Any:
        """The queued requests in the order batches take them: level by level, the delayed ones last in each."""
        for queue in self._queues.values():
            yield from queue.queue
            yield from queue.delayed

    def _apply_policies(self, now: int) -> None:
        """Drop cancelled requests; reject or delay those past their timeout."""
        for queue in self._queues.values():
            if queue.delayed and any(entry.request.cancelled for entry in queue.delayed):
                for entry in [entry for entry in queue.delayed if entry.request.cancelled]:
                    queue.delayed.remove(entry)
                    self._unqueued()
                    self._cancelled(entry)
            if not queue.queue:
                continue
            keep: deque[_Entry] = deque()
            for entry in queue.queue:
                if entry.request.cancelled:
                    self._unqueued()
                    self._cancelled(entry)
                elif entry.deadline_ns and now > entry.deadline_ns:
                    if queue.reject:
                        self._unqueued()
                        self._stats.record_failure(now - entry.request.arrival_ns, FailureReason.REJECTED)
                        self._settle(entry, EdgedError(ErrorCode.UNAVAILABLE, "Request timeout expired"))
                    else:
                        queue.delayed.append(entry)
                else:
                    keep.append(entry)
            queue.queue = keep

    def _shape_key(self, request: InferRequest) -> tuple[Any, ...]:
        """What must be equal for requests to share a batch: the inputs they carry and their non-batch shapes."""
        skip = 1 if self._batching else 0
        return tuple(
            (tensor.name, None if tensor.name in self._ragged else tensor.shape[skip:])
            for tensor in sorted(request.inputs, key=lambda tensor: tensor.name)
        )

    def _remove(self, entry: _Entry) -> bool:
        for queue in self._queues.values():
            for items in (queue.queue, queue.delayed):
                try:
                    items.remove(entry)
                except ValueError:
                    continue
                self._unqueued()
                return True
        return False

    def _unqueued(self) -> None:
        self._queued -= 1
        self._stats.pending -= 1

    def _wake_in(self, wait_ns: int) -> None:
        at = time.monotonic_ns() + wait_ns
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = at
        self._timer = loop.call_later(wait_ns / 1e9, self._woken)

    def _woken(self) -> None:
        self._timer = None
        self._schedule()

    # --- executing -----------------------------------------------------------------------------------------------

    def _start(self, instance: BackendInstance, batch: list[_Entry]) -> None:
        requests = [entry.request for entry in batch]
        self._cpu_busy += _cpu_share(instance)
        started = time.monotonic_ns()
        timing = ExecutionTiming()
        results = self._runner.run(
            instance, requests, timing, lambda done: self._finish(instance, batch, started, timing, done)
        )
        if results is not None:  # ran inline: _schedule's loop goes on (no recursion through _finish)
            self._finish(instance, batch, started, timing, results, reschedule=False)

    def _finish(
        self,
        instance: BackendInstance,
        batch: list[_Entry],
        started: int,
        timing: ExecutionTiming,
        results: list[Any],
        *,
        reschedule: bool = True,
    ) -> None:
        self._cpu_busy = max(0.0, self._cpu_busy - _cpu_share(instance))
        total = sum(entry.size for entry in batch)
        self._stats.record_execution(total, timing)
        now = time.monotonic_ns()
        for entry, result in zip(batch, results, strict=True):
            request = entry.request
            if isinstance(result, EdgedError) and not isinstance(result, AnsweredError):
                reason = FailureReason.CANCELED if request.cancelled else FailureReason.BACKEND
                self._stats.record_failure(now - request.arrival_ns, reason)
            else:
                queued = started - request.arrival_ns
                self._stats.record_success(request.batch_size, now - request.arrival_ns, queued, timing)
                if isinstance(result, AnsweredError):
                    self._stats.record_answered_error()
            self._settle(entry, result)
        if not (self._leaving and instance_left(self._leaving, instance)):
            self._free.append(instance)
        if reschedule:
            self._schedule()

    # --- answering -----------------------------------------------------------------------------------------------

    def _cancelled(self, entry: _Entry) -> None:
        self._stats.record_failure(time.monotonic_ns() - entry.request.arrival_ns, FailureReason.CANCELED)
        self._settle(entry, EdgedError(ErrorCode.CANCELLED, "Request was cancelled"))

    def _settle(self, entry: _Entry, result: Result) -> None:
        entry.result, entry.settled = result, True
        if not self._preserve_ordering:
            self._answer(entry)
            return
        # Responses leave in the order the requests came: a finished request waits for those ahead of it.
        while self._order and self._order[0].settled:
            self._answer(self._order.popleft())

    def _answer(self, entry: _Entry) -> None:
        if not entry.future.done():
            entry.future.set_result(entry.result)
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()


def _cpu_share(instance: BackendInstance) -> float:
    share = getattr(instance, "cpu_share", 0.0)
    return float(share) if isinstance(share, int | float) else 0.0


def _log_prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "
