"""The sequence batcher: Triton's ``sequence_batching`` for stateful models fed by streams of requests that share a
correlation id (``sequence_id``; an unsigned integer or a string).

A sequence begins with a request flagged ``sequence_start`` and ends after one flagged ``sequence_end``; one that
receives nothing for ``max_sequence_idle_microseconds`` (default 1 s) is released, and a later request for it
without the START flag is refused with Triton's error. Requests carry a batch of one, as Triton requires.

Every request reaches the model with the control inputs its config names (START, END, READY, CORRID, in the data
types the config gives) and, for ``state`` entries, the sequence's implicit state: the state output of the previous
request (the initial state at START) goes in as the state input, and the state output is kept, not returned.

Requests of one sequence run one after the other, in order. Cancelling a queued request cancels its sequence, as in
Triton: the requests it has queued are answered CANCELLED without running, and it ends once the request it may be
running is done. With the ``direct`` strategy (the default) a sequence
keeps the instance and the batch slot it started on for its whole life, each instance having ``max_batch_size``
slots (more sequences wait until one ends): a batch's row *i* is always slot *i*'s sequence, and, as in Triton, a slot
whose sequence has nothing to run, below the highest slot that has, is filled with a "null" request (zeros, READY
false, CORRID 0) whose answer is dropped, for models that keep per-slot state by row. With ``oldest`` any free
instance takes the sequences whose next requests are the oldest, waiting up to its ``max_queue_delay_microseconds``
for a batch of a ``preferred_batch_size`` or a full one. ``direct`` waits too when its ``max_queue_delay_microseconds``
and ``minimum_slot_utilization`` are set: up to the delay, while fewer than that share of the slots have a request
ready. A batch holds at most one request per sequence.

With ``iterative_sequence: true`` one request is a whole sequence, run over several executions: a request without a
correlation id gets one of its own and the START flag, and each time the model releases it with RESCHEDULE
(``request.run_again``) it is queued again for its sequence, with START and END cleared and READY set, as Triton
does. The sequence ends when its request is released for good. Unlike Triton 2.51, a sequence never idles out while
its request is being run again, and an END flag given with the first request takes effect only then.

Everything runs on the event loop; executions run as the dynamic batcher runs them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.core.request.inference import InferInput, InferRequest
from edged.core.scheduling.scheduler import BatchRunner
from edged.core.scheduling.sequence_inputs import (
    Control,
    CorrelationId,
    control_inputs,
    corrid_number,
    states,
)
from edged.core.stats import ExecutionTiming, FailureReason
from edged.errors import AnsweredError, EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Sequence
    from concurrent.futures import Executor
    from pathlib import Path

    from edged.core.backend_api import BackendInstance
    from edged.core.request.inference import InferResponse
    from edged.core.stats import ModelStatistics
    from edged.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

DEFAULT_IDLE_US = 1_000_000


@dataclass(slots=True, eq=False)
class _Pending:
    request: InferRequest
    future: asyncio.Future[Any]
    end: bool
    own_inputs: int  # the request's inputs come first; the controls and states added here follow


@dataclass(slots=True, eq=False)
class _Sequence:
    key: CorrelationId
    instance: int | None  # direct strategy: the instance it lives on (None while it waits for a slot)
    started_ns: int
    last_ns: int
    slot: int = -1  # direct strategy: its row in the instance's batches
    pending: deque[_Pending] = field(default_factory=deque)
    running: bool = False
    # Cancelled while a request of it ran: released once that request is done.
    cancelled: bool = False
    state: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)


class SequenceBatcher:
    def __init__(
        self,
        instances: Sequence[BackendInstance],
        executor: Executor,
        stats: ModelStatistics,
        config: ModelConfig,
        model_dir: Path | None = None,
    ) -> None:
        batching = config.sequence_batching
        # Indices stay put for the batcher's life (a sequence names its instance by index): an instance removed by a
        # count change becomes None once it is idle and no sequence lives on it.
        self._instances: list[BackendInstance | None] = list(instances)
        self._busy = [False] * len(self._instances)
        self._leaving: dict[int, asyncio.Future[None]] = {}
        self._stats = stats
        self._model = config.name
        self._batching = config.max_batch_size > 0
        self._slots = max(config.max_batch_size, 1)
        self._oldest = batching.WhichOneof("strategy_choice") == "oldest"
        # The oldest strategy may wait a little for more sequences to fill a batch, as the dynamic batcher does.
        oldest = batching.oldest
        self._preferred = frozenset(size for size in oldest.preferred_batch_size if size <= self._slots)
        self._delay_ns = oldest.max_queue_delay_microseconds * 1000 if self._oldest else 0
        # The direct strategy waits too, as Triton's does, but only while fewer than this share of the slots have a
        # request ready (a share of 0, or no delay, never waits).
        direct = batching.direct
        self._direct_delay_ns = 0 if self._oldest else direct.max_queue_delay_microseconds * 1000
        self._min_utilization = direct.minimum_slot_utilization
        self._timer: asyncio.TimerHandle | None = None
        self._idle_ns = (batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US) * 1000
        self._controls = control_inputs(config)
        self._states = states(config, model_dir)
        self._state_outputs = {state.output_name for state in self._states}
        self._sequences: dict[CorrelationId, _Sequence] = {}
        self._waiting: deque[_Sequence] = deque()  # direct: sequences waiting for a slot
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._reaper: asyncio.TimerHandle | None = None
        self._runner = BatchRunner(executor, config.name)
        self._iterative = batching.iterative_sequence
        self._next_key = 1  # iterative sequences: the ids given to requests that come without one

    @property
    def live_sequences(self) -> int:
        """Sequences started and not yet ended (or reaped): a model update waits for them."""
        return len(self._sequences)

    # --- requests ------------------------------------------------------------------------------------------------

    async def enqueue(self, request: InferRequest) -> InferResponse | EdgedError | None:
        raw = request.parameters.get("sequence_id")
        key: CorrelationId | None = raw if isinstance(raw, int | str) and not isinstance(raw, bool) else None
        if key is None or key in (0, ""):
            if not self._iterative:
                self._stats.record_refusal()  # refused unqueued, as the two below: counted for the history only
                return EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"inference request to model '{self._model}' must specify a non-zero or non-empty correlation ID",
                )
            key = self._new_key()
            request.parameters["sequence_id"] = key
            request.parameters["sequence_start"] = True
        if self._batching and request.batch_size != 1:
            self._stats.record_refusal()
            return EdgedError(
                ErrorCode.INVALID_ARG,
                f"inference request to model '{self._model}' must specify batch-size 1 due to requirements of "
                "sequence batcher",
            )
        now = time.monotonic_ns()
        start = request.parameters.get("sequence_start") is True
        end = request.parameters.get("sequence_end") is True
        sequence = self._sequences.get(key)
        if start:
            if sequence is not None:
                self._release(sequence)  # a new START ends the sequence that had this id
            sequence = self._begin(key, now)
        elif sequence is None:
            self._stats.record_refusal()
            return EdgedError(
                ErrorCode.INVALID_ARG,
                f"inference request for sequence {key} to model '{self._model}' must specify the START flag on "
                "the first request of the sequence",
            )
        sequence.last_ns = now
        own_inputs = len(request.inputs)
        self._add_controls(request, sequence, start, end)
        pending = _Pending(request, asyncio.get_running_loop().create_future(), end, own_inputs)
        sequence.pending.append(pending)
        self._stats.pending += 1
        self._in_flight += 1
        self._idle.clear()
        self._schedule()
        try:
            result: InferResponse | EdgedError | None = await asyncio.shield(pending.future)
            return result
        except asyncio.CancelledError:
            request.cancel()
            if pending in sequence.pending:
                self._cancel_sequence(sequence)
            raise

    def _cancel_sequence(self, sequence: _Sequence) -> None:
        """A queued request of the sequence was cancelled: as in Triton, the whole sequence is. Its queued requests
        are answered CANCELLED without running, and it ends (once the request it may be running is done), so a
        later request for it needs the START flag."""
        now = time.monotonic_ns()
        while sequence.pending:
            pending = sequence.pending.popleft()
            pending.request.cancel()
            self._stats.pending -= 1
            self._in_flight -= 1
            self._stats.record_failure(now - pending.request.arrival_ns, FailureReason.CANCELED)
            if not pending.future.done():
                pending.future.set_result(EdgedError(ErrorCode.CANCELLED, "the request was cancelled"))
        log.info("sequence %s of model '%s' was cancelled", sequence.key, self._model)
        if sequence.running:
            sequence.cancelled = True  # released when its running request is done
            if self._sequences.get(sequence.key) is sequence:
                del self._sequences[sequence.key]
        else:
            self._release(sequence)
        if self._in_flight == 0:
            self._idle.set()

    async def drain(self) -> None:
        await self._idle.wait()

    # --- instance counts changed without a reload ---------------------------------------------------------------

    def add_instances(self, instances: Sequence[BackendInstance]) -> None:
        """More instances from now on: sequences waiting for a slot take the new slots at once."""
        for instance in instances:
            self._instances.append(instance)
            self._busy.append(False)
        waiting, self._waiting = self._waiting, deque()
        for sequence in waiting:
            self._place(sequence)
        self._schedule()

    def remove_instances(self, instances: Sequence[BackendInstance]) -> asyncio.Future[None]:
        """No new sequence goes to these instances; the future resolves once each is idle and the sequences that
        live on it have ended (they are not cut short)."""
        loop = asyncio.get_running_loop()
        waits = []
        for instance in instances:
            index = next((i for i, known in enumerate(self._instances) if known is instance), None)
            if index is None:
                continue
            self._leaving[index] = loop.create_future()
            waits.append(self._leaving[index])
        self._check_left()
        return asyncio.ensure_future(_all(waits)) if waits else _done(loop)

    def _usable(self, index: int) -> bool:
        return self._instances[index] is not None and index not in self._leaving

    def _check_left(self) -> None:
        for index in [i for i in self._leaving if not self._busy[i]]:
            if any(s.instance == index for s in self._sequences.values()):
                continue
            self._instances[index] = None
            left = self._leaving.pop(index)
            if not left.done():
                left.set_result(None)

    def _new_key(self) -> int:
        while self._next_key in self._sequences:
            self._next_key += 1
        key = self._next_key
        self._next_key += 1
        return key

    def _begin(self, key: CorrelationId, now: int) -> _Sequence:
        sequence = _Sequence(key, None, now, now)
        sequence.state = {state.input_name: state.initial.copy() for state in self._states}
        self._sequences[key] = sequence
        if self._oldest:
            sequence.instance = -1  # any instance
        else:
            self._place(sequence)
        self._arm_reaper()
        return sequence

    def _place(self, sequence: _Sequence) -> None:
        """Direct strategy: the lowest free slot of the instance with the fewest sequences, if one has a free
        slot; else wait."""
        taken: list[set[int]] = [set() for _ in self._instances]
        for other in self._sequences.values():
            if other.instance is not None and other.instance >= 0 and other is not sequence:
                taken[other.instance].add(other.slot)
        usable = [index for index in range(len(taken)) if self._usable(index)]
        best = min(usable, key=lambda index: len(taken[index])) if usable else None
        if best is not None and len(taken[best]) < self._slots:
            sequence.instance = best
            sequence.slot = min(set(range(self._slots)) - taken[best])
        else:
            self._waiting.append(sequence)

    def _release(self, sequence: _Sequence) -> None:
        """The sequence is over (ended, restarted or idle): its slot goes to a waiting sequence. Requests it still
        had queued (a new START came first) fail; the one running finishes."""
        if self._sequences.get(sequence.key) is sequence:
            del self._sequences[sequence.key]
        while sequence.pending:
            pending = sequence.pending.popleft()
            self._stats.pending -= 1
            self._in_flight -= 1
            if not pending.future.done():
                self._stats.record_refusal()  # it never ran, so neither success nor fail; its client sees an error
                pending.future.set_result(
                    EdgedError(
                        ErrorCode.UNAVAILABLE,
                        f"sequence {sequence.key} of model '{self._model}' was started again before this request ran",
                    )
                )
        if self._in_flight == 0:
            self._idle.set()
        if sequence in self._waiting:
            self._waiting.remove(sequence)
        freed, slot = sequence.instance, sequence.slot
        sequence.instance, sequence.slot = None, -1
        if freed is not None and freed >= 0 and self._waiting and self._usable(freed):
            waiting = self._waiting.popleft()
            waiting.instance, waiting.slot = freed, slot
        if self._leaving:
            self._check_left()

    def _add_controls(self, request: InferRequest, sequence: _Sequence | None, start: bool, end: bool) -> None:
        """The control inputs, for a request of ``sequence``; None: for a null request (not READY, CORRID 0)."""
        shape = (1, 1) if self._batching else (1,)
        for control in self._controls:
            if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                key = sequence.key if sequence is not None else ""
                if control.datatype == "BYTES":
                    value: Any = np.array([str(key).encode()], dtype=np.object_)
                else:
                    value = np.array([corrid_number(key) if key else 0], dtype=control.dtype)
            else:
                flag = (
                    start
                    if control.kind == Control.CONTROL_SEQUENCE_START
                    else end
                    if control.kind == Control.CONTROL_SEQUENCE_END
                    else control.kind == Control.CONTROL_SEQUENCE_READY and sequence is not None
                )
                value = np.array([control.values[1] if flag else control.values[0]], dtype=control.dtype)
            request.inputs.append(InferInput(control.name, control.datatype, shape, value.reshape(shape)))

    # --- forming batches -----------------------------------------------------------------------------------------

    def _schedule(self) -> None:
        for index in range(len(self._instances)):
            if self._busy[index] or self._instances[index] is None:
                continue
            runnable = [
                s
                for s in self._sequences.values()
                if s.pending
                and not s.running
                and (s.instance == index or (self._oldest and s.instance == -1 and index not in self._leaving))
            ]
            if not runnable:
                continue
            if not self._oldest:
                if (
                    self._direct_delay_ns
                    and self._min_utilization
                    and len(runnable) < self._min_utilization * self._slots
                ):
                    waited = time.monotonic_ns() - min(s.pending[0].request.arrival_ns for s in runnable)
                    if waited <= self._direct_delay_ns:
                        self._wake_in(self._direct_delay_ns - waited)
                        continue
                self._start(index, runnable)  # at most one sequence per slot: all of them
                continue
            runnable.sort(key=lambda s: s.pending[0].request.arrival_ns)
            count = min(len(runnable), self._slots)
            if self._delay_ns and count < self._slots and count not in self._preferred:
                waited = time.monotonic_ns() - runnable[0].pending[0].request.arrival_ns
                if waited < self._delay_ns:
                    self._wake_in(self._delay_ns - waited)
                    continue
            if self._preferred and count not in self._preferred:
                # The largest preferred size that is ready, when there is one; everything once the delay is over.
                fitting = [size for size in self._preferred if size <= count]
                if fitting:
                    count = max(fitting)
            self._start(index, runnable[:count])

    def _wake_in(self, wait_ns: int) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(wait_ns / 1e9, self._woken)

    def _woken(self) -> None:
        self._timer = None
        self._schedule()

    def _start(self, index: int, sequences: list[_Sequence]) -> None:
        batch: list[tuple[_Sequence, _Pending]] = []
        for sequence in sequences:
            pending = sequence.pending.popleft()
            sequence.running = True
            self._stats.pending -= 1
            self._add_states(pending.request, sequence.state)
            batch.append((sequence, pending))
        self._busy[index] = True
        if self._oldest:
            requests = [pending.request for _, pending in batch]
        else:
            # Row i is slot i: null requests stand in for the slots below the highest one that have nothing to run.
            by_slot = {sequence.slot: pending for sequence, pending in batch}
            template = batch[0][1]
            requests = [
                by_slot[slot].request if slot in by_slot else self._null_request(template)
                for slot in range(max(by_slot) + 1)
            ]
            batch.sort(key=lambda item: item[0].slot)
        timing = ExecutionTiming()
        started = time.monotonic_ns()
        instance = self._instances[index]
        assert instance is not None  # _schedule runs only on instances still there
        results = self._runner.run(
            instance,
            requests,
            timing,
            lambda done: self._finish(index, batch, started, timing, self._real(requests, batch, done), len(requests)),
        )
        if results is not None:  # ran inline: finish on the next turn, so _schedule's loop is not re-entered
            real = self._real(requests, batch, results)
            asyncio.get_running_loop().call_soon(self._finish, index, batch, started, timing, real, len(requests))

    def _add_states(self, request: InferRequest, states: dict[str, np.ndarray[Any, Any]]) -> None:
        for state in self._states:
            value = states[state.input_name]
            shape = (1, *value.shape) if self._batching else value.shape
            request.inputs.append(InferInput(state.input_name, state.datatype, shape, value.reshape(shape)))

    def _null_request(self, like: _Pending) -> InferRequest:
        """Triton's null request for an idle slot: the inputs of a real request of the batch as zeros (empty
        strings), READY false, CORRID 0, the initial state."""
        real = like.request
        inputs = []
        for tensor in real.inputs[: like.own_inputs]:
            if tensor.datatype == "BYTES":
                data = np.full(tensor.shape, b"", dtype=np.object_)
            else:
                assert tensor.data is not None  # validation decodes every input
                data = np.zeros(tensor.shape, dtype=tensor.data.dtype)
            inputs.append(InferInput(tensor.name, tensor.datatype, tensor.shape, data))
        request = InferRequest(real.model_name, real.model_version, "", inputs, real.outputs)
        request.arrival_ns = real.arrival_ns
        self._add_controls(request, None, False, False)
        self._add_states(request, {state.input_name: state.initial for state in self._states})
        return request

    @staticmethod
    def _real(requests: list[InferRequest], batch: list[tuple[_Sequence, _Pending]], results: list[Any]) -> list[Any]:
        """The results of the batch's real requests, in the batch's order (a null request's answer is dropped)."""
        if len(results) == len(batch):
            return results
        row = {id(request): n for n, request in enumerate(requests)}
        return [results[row[id(pending.request)]] for _, pending in batch]

    def _finish(
        self,
        index: int,
        batch: list[tuple[_Sequence, _Pending]],
        started: int,
        timing: ExecutionTiming,
        results: list[Any],
        size: int,
    ) -> None:
        """An execution of ``size`` rows is over; ``results`` are those of the batch's real requests."""
        self._busy[index] = False
        if self._leaving:
            self._check_left()
        self._stats.record_execution(size, timing)
        now = time.monotonic_ns()
        for (sequence, pending), outcome in zip(batch, results, strict=True):
            sequence.running = False
            request = pending.request
            result = outcome
            if request.run_again and not isinstance(result, EdgedError):
                request.run_again = False
                if request.cancelled:
                    result = EdgedError(ErrorCode.CANCELLED, "the request was cancelled")
                elif self._sequences.get(sequence.key) is not sequence:
                    result = EdgedError(
                        ErrorCode.UNAVAILABLE,
                        f"sequence {sequence.key} of model '{self._model}' was started again before this request "
                        "completed",
                    )
                else:
                    self._run_again(sequence, pending, now)
                    continue
            if isinstance(result, EdgedError) and not isinstance(result, AnsweredError):
                reason = FailureReason.CANCELED if request.cancelled else FailureReason.BACKEND
                self._stats.record_failure(now - request.arrival_ns, reason)
            else:
                if isinstance(result, AnsweredError):
                    self._stats.record_answered_error()
                elif result is not None and self._states:
                    self._keep_state(sequence, result)
                self._stats.record_success(1, now - request.arrival_ns, started - request.arrival_ns, timing)
            if (pending.end or self._iterative or sequence.cancelled) and not sequence.pending:
                self._release(sequence)
            if not pending.future.done():
                pending.future.set_result(result)
            self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()
        self._schedule()

    def _run_again(self, sequence: _Sequence, pending: _Pending, now: int) -> None:
        """An iterative sequence's request, released with RESCHEDULE: queued again for its sequence, no longer
        the first (START and END cleared, as Triton clears them); its client still waits."""
        request = pending.request
        del request.inputs[pending.own_inputs :]
        request.parameters.pop("sequence_start", None)
        request.parameters.pop("sequence_end", None)
        self._add_controls(request, sequence, False, False)
        sequence.pending.append(pending)
        sequence.last_ns = now
        self._stats.pending += 1

    def _keep_state(self, sequence: _Sequence, response: InferResponse) -> None:
        """The state outputs become the next request's state inputs, and leave the response."""
        kept = []
        for output in response.outputs:
            if output.name in self._state_outputs:
                state = next(s for s in self._states if s.output_name == output.name)
                data = output.data[0] if self._batching else output.data
                sequence.state[state.input_name] = np.array(data, dtype=state.dtype, copy=True)
            else:
                kept.append(output)
        response.outputs = kept

    # --- idle sequences ------------------------------------------------------------------------------------------

    def _arm_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().call_later(self._idle_ns / 2e9, self._reap)

    def _reap(self) -> None:
        """Release sequences that received nothing for the idle time (and have nothing queued or running)."""
        self._reaper = None
        now = time.monotonic_ns()
        for sequence in list(self._sequences.values()):
            if not sequence.pending and not sequence.running and now - sequence.last_ns >= self._idle_ns:
                log.info("sequence %s of model '%s' was idle too long and is released", sequence.key, self._model)
                self._release(sequence)
        if self._sequences:
            self._arm_reaper()
        self._schedule()


def _done(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    done: asyncio.Future[None] = loop.create_future()
    done.set_result(None)
    return done


async def _all(waits: list[asyncio.Future[None]]) -> None:
    await asyncio.gather(*waits)
