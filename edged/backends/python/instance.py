"""One instance of a Python model: its stub process, the requests in flight on it, and its supervision.

Threads: ``spawn``/``wait_initialized`` run on the load thread (blocking). From ``attach`` on, everything runs on the
event loop: ``execute_async`` sends a batch and awaits the stub's reply, the stub's messages (decoupled responses,
BLS calls, logs) are handled as they arrive, and a stub that dies (or overruns execute-timeout-seconds, when set)
fails what it had in flight and is restarted in the background; the instance is not ready until that is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edged.backends.python.messages import read_response, request_spec
from edged.backends.python.process import StubGone, StubProcess
from edged.backends.python.server_calls import ServerCalls
from edged.backends.python.wire import ipc, shm
from edged.core.request.inference import InferRequest, InferResponse, StreamResponse
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from edged.backends.python.model_state import ModelState
    from edged.core.devices import InstancePlacement
    from edged.core.stats import ExecutionTiming

log = logging.getLogger("edged.backends.python")

_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
# How often a model's own is_ready() is asked again, at most (readiness is answered from the last reply).
_READY_REFRESH_S = 0.5
RESTART_TIMEOUT_S = 120.0


def stub_log(instance: str, message: dict[str, Any]) -> None:
    """A log line from a stub (pb_utils.Logger, or a failure the stub reports) into the daemon's log."""
    if message.get("t") != "log":
        return
    level = _LOG_LEVELS.get(int(message.get("level", 0)), logging.INFO)
    log.log(level, "%s: %s", instance, message.get("msg", ""))


Results = list[InferResponse | EdgedError | None]
# A batch waiting to be sent: its requests, where its timings go, and the future its results go to.
Queued = tuple["Sequence[InferRequest]", "ExecutionTiming", "asyncio.Future[Results]"]


@dataclass(slots=True)
class _Batch:
    requests: Sequence[InferRequest]
    rids: list[int]
    future: asyncio.Future[Results]
    timing: ExecutionTiming
    # When the stub could begin it: when it was sent, or when the batch ahead of it was answered.
    begun_ns: int


class PythonInstance:
    def __init__(self, state: ModelState, name: str, kind: str, device_id: int) -> None:
        # Where the instance runs, as instance_placements gave it (set by the backend; resizing matches on it).
        self.placement: InstancePlacement | None = None
        self._state = state
        self._name = name
        self._kind = kind
        self._device_id = device_id
        self._stub: StubProcess | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._healthy = False
        self._stopping = False
        # Stopping: whether the loop let go of the stub's socket in time (else its reader hands over finalize_done).
        self._detached = True
        self._finalized = threading.Event()
        self._restart: asyncio.Task[None] | None = None
        # Stub processes that died while serving: a model on probation after an update is judged by it.
        self.crashes = 0
        self._batch_ids, self._rids = itertools.count(1), itertools.count(1)  # batches sent, requests in them
        self._batches: dict[int, _Batch] = {}
        self._streams: dict[int, InferRequest] = {}
        # BLS requests and model-management calls from the model (to whichever stub is current).
        self._calls = ServerCalls(name, state.host, lambda: self._stub)
        # The model's own is_ready (when it has one), its last answer, and when it was asked.
        self._has_is_ready, self._user_ready, self._ready_asked = False, True, 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        # Told when a batch is answered (with how long the stub took) or failed, and when a restart is done.
        self.on_free: Callable[[PythonInstance, int | None], None] | None = None
        # Given the batches a dead stub never started, to be sent again.
        self.on_requeue: Callable[[list[Queued]], None] | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def pid(self) -> int | None:
        """The stub's process id while it runs; None between a crash and its restart, and once stopped."""
        return self._stub.process.pid if self._stub is not None and not self._stub.gone else None

    @property
    def available(self) -> bool:
        """Whether a batch sent now goes straight to a running stub (on the event loop)."""
        stub = self._stub
        return (
            self._healthy
            and not self._stopping
            and stub is not None
            and not stub.gone
            and self._loop is not None
            and (self._restart is None or self._restart.done())
        )

    @property
    def in_flight(self) -> int:
        """Batches sent to the stub and not answered yet."""
        return len(self._batches)

    @property
    def host_loop(self) -> asyncio.AbstractEventLoop | None:
        return self._state.host.loop if self._state.host is not None else None

    def no_response(self) -> EdgedError:
        return self._error("no response")

    # --- starting (load thread, or the restart's worker thread) ---------------------------------------------------

    def spawn(self) -> None:
        state = self._state
        try:
            self._stub = StubProcess(self._name, state.interpreter, state.env, state.shm_size)
            args = {
                **state.args,
                "model_instance_kind": self._kind,
                "model_instance_name": self._name,
                "model_instance_device_id": str(self._device_id),
            }
            self._stub.send_blocking({**state.init, "args": args})
        except StubGone as exc:
            raise self._start_error(f"its stub process {exc}") from None

    def wait_initialized(self) -> None:
        stub = self._stub
        assert stub is not None
        try:
            reply = stub.receive_blocking(None)
            while reply["t"] != "init_done":
                # initialize may log, and create its metric families (most models do it there).
                if reply["t"] == "metric":
                    self._state.record_metric(self._name, reply)
                elif reply["t"] == "call" and self.host_loop is not None:
                    # Model management from initialize (is_model_ready, load_model...), as Triton allows it.
                    self.host_loop.call_soon_threadsafe(self._calls.on_call, reply, None)
                else:
                    stub_log(self._name, reply)
                reply = stub.receive_blocking(None)
        except StubGone as exc:
            raise self._start_error(f"its stub process {exc} during initialize") from None
        if not reply.get("ok"):
            if reply.get("trace"):
                log.error("%s: initialize failed: %s\n%s", self._name, reply.get("error"), reply.get("trace"))
            raise EdgedError(ErrorCode.INTERNAL, str(reply.get("error", "initialize failed")))
        self._has_is_ready = bool(reply.get("has_is_ready"))
        self._user_ready = bool(reply.get("ready", True))
        self._healthy = True

    def _start_error(self, detail: str) -> EdgedError:
        return EdgedError(ErrorCode.INTERNAL, f"unable to start model instance '{self._name}': {detail}")

    def discard(self) -> None:
        if self._stub is not None:
            self._stub.kill()
            self._stub.close(wait=1.0)
            self._stub = None
        self._healthy = False

    # --- on the event loop --------------------------------------------------------------------------------------

    def attach(self) -> None:
        if self._loop is not None or self._stub is None or self._state.host is None:
            return
        self._loop = self._state.host.loop
        self._stub.attach(self._loop, self._on_message, self._on_gone, self._expecting)

    def is_ready(self) -> bool:
        if not self._healthy:
            return False
        if self._has_is_ready and self._loop is not None and self._stub is not None:
            now = time.monotonic()
            if now - self._ready_asked > _READY_REFRESH_S:
                self._ready_asked = now
                self._stub.send({"t": "is_ready"})
        return self._user_ready

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        """From a worker thread: the work is done on the event loop (the stub's socket belongs to it)."""
        state_host = self._state.host
        if state_host is None:
            return [self._error("the python backend serves requests only inside the daemon")] * len(requests)
        future = asyncio.run_coroutine_threadsafe(self._execute_when_ready(requests, timing), state_host.loop)
        return [r if r is not None else self._error("no response") for r in future.result()]

    def execute_async(
        self,
        requests: Sequence[InferRequest],
        timing: ExecutionTiming,
        future: asyncio.Future[Results] | None = None,
    ) -> asyncio.Future[Results]:
        """Send the batch to the stub; the future (``future`` when given) resolves when the stub's answer is read.
        A plain future rather than a coroutine: the caller awaits it directly, with no task of its own."""
        stub = self._stub
        if stub is None or self._loop is None or not self.available:
            task = asyncio.ensure_future(self._execute_when_ready(requests, timing))
            if future is None:
                return task
            task.add_done_callback(functools.partial(_settle, future))
            return future
        return self._send_batch(stub, self._loop, requests, timing, future)

    async def _execute_when_ready(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> Results:
        self.attach()
        if self._restart is not None and not self._restart.done():
            await asyncio.shield(self._restart)
        stub = self._stub
        if not self._healthy or stub is None or stub.gone or self._loop is None:
            if self._loop is not None and (self._restart is None or self._restart.done()):
                self._start_restart("is not running")
            return [self._error(f"Stub process '{self._name}' is not healthy.")] * len(requests)
        return await self._send_batch(stub, self._loop, requests, timing)

    def _send_batch(
        self,
        stub: StubProcess,
        loop: asyncio.AbstractEventLoop,
        requests: Sequence[InferRequest],
        timing: ExecutionTiming,
        future: asyncio.Future[Results] | None = None,
    ) -> asyncio.Future[Results]:
        started = time.perf_counter_ns()
        if future is None:
            future = loop.create_future()
        batch_id = next(self._batch_ids)
        tensors = ipc.TensorWriter()
        rids: list[int] = []
        specs: list[ipc.RequestMsg] = []
        for request in requests:
            rid = next(self._rids)
            rids.append(rid)
            specs.append(request_spec(request, rid, tensors))
        try:
            stub.send({"t": "execute", "batch": batch_id, "requests": specs}, tensors)
        except (ValueError, shm.RingFull) as exc:
            future.set_result([self._error(str(exc))] * len(requests))
            return future
        sent = time.perf_counter_ns()
        # The stub runs batches in the order they were sent: this one begins now only if none is ahead of it.
        self._batches[batch_id] = _Batch(requests, rids, future, timing, sent)
        for request, rid in zip(requests, rids, strict=True):
            if request.stream is not None:
                self._streams[rid] = request
            request.on_cancel(functools.partial(self._cancel, rid))
        timing.input_ns = sent - started
        if self._watchdog is None and self._state.execute_timeout_s > 0:
            self._watchdog = loop.call_later(self._state.execute_timeout_s, self._check_timeout)
        return future

    def _check_timeout(self) -> None:
        """Kills a stub whose current execute has run past execute-timeout-seconds, when that is set (one timer per
        instance, not one per request: it looks at the batch the stub is running, then sleeps until that one's
        deadline)."""
        self._watchdog = None
        stub = self._stub
        if not self._batches or stub is None or stub.gone or self._loop is None:
            return
        timeout = self._state.execute_timeout_s
        running = next(iter(self._batches.values()))
        left_ns = running.begun_ns + int(timeout * 1e9) - time.perf_counter_ns()
        if left_ns <= 0:
            stub.kill(f"did not return from execute within {timeout:g} s and was killed")
            return  # its batches fail once the process is gone
        self._watchdog = self._loop.call_later(left_ns / 1e9, self._check_timeout)

    def _cancel(self, rid: int) -> None:
        if self._stub is not None and not self._stub.gone and (rid in self._streams or self._in_batch(rid)):
            self._stub.send({"t": "cancel", "rid": rid})

    def _in_batch(self, rid: int) -> bool:
        return any(rid in batch.rids for batch in self._batches.values())

    # --- messages from the stub ---------------------------------------------------------------------------------

    def _expecting(self) -> bool:
        """Whether answers are due: to batches, or to decoupled requests, in flight."""
        return bool(self._batches or self._streams)

    def _on_message(self, message: dict[str, Any], payload: memoryview | None) -> None:
        """A message from the stub; ``payload`` (its tensors, when they came inside it) is valid only during the
        call, so whatever is kept of it is copied."""
        kind = message["t"]
        if kind == "execute_done":
            self._on_execute_done(message, payload)
        elif kind == "response":
            self._on_response(message, payload)
        elif kind == "bls":
            self._calls.on_bls(message, payload)
        elif kind == "bls_cancel":
            self._calls.cancel(int(message["call"]))
        elif kind == "call":
            self._calls.on_call(message, payload)
        elif kind == "log":
            stub_log(self._name, message)
        elif kind == "metric":
            self._state.record_metric(self._name, message)
        elif kind == "is_ready_done":
            self._user_ready = bool(message.get("ready"))
        elif kind == "finalize_done" and self._stopping:
            self._finalized.set()  # the loop still read the socket when finalize went: end_stop waits on this
        else:
            raise ValueError(f"unexpected message '{kind}'")

    def _on_execute_done(self, message: dict[str, Any], payload: memoryview | None) -> None:
        batch = self._batches.pop(int(message["batch"]), None)
        if batch is None:
            return
        received = time.perf_counter_ns()
        if self._batches:
            following = next(iter(self._batches.values()))
            following.begun_ns = max(following.begun_ns, received)
        block = self._stub.consumer.hold(int(message["blk"][1])) if self._stub and "blk" in message else None
        try:
            results = self._execute_results(batch, message, payload)
        finally:
            if block is not None:
                block.release()
        batch.timing.infer_ns = received - batch.begun_ns
        batch.timing.output_ns = time.perf_counter_ns() - received
        if not batch.future.done():
            batch.future.set_result(results)
        if self.on_free is not None:
            self.on_free(self, batch.timing.infer_ns)

    def _execute_results(
        self, batch: _Batch, message: dict[str, Any], payload: memoryview | None
    ) -> list[InferResponse | EdgedError | None]:
        error = message.get("error")
        if error is not None:
            if message.get("trace"):
                log.error(
                    "Failed to process the request(s) for model instance '%s', message: %s\n\n%s",
                    self._name,
                    error["msg"],
                    message["trace"],
                )
            failure = self._error(self._state.for_client(str(error["msg"])))
            if self._state.decoupled:
                for rid in batch.rids:
                    self._end_stream(rid, failure)
            # Default mode: responses the model had sent through the response sender before it failed stand.
            sent = message.get("sent") or [{}] * len(batch.requests)
            return [self._response(q, r, payload) if r else failure for q, r in zip(batch.requests, sent, strict=True)]
        results: Results
        if self._state.decoupled:
            results = [None] * len(batch.requests)
        else:
            specs = message.get("responses", [])
            if len(specs) != len(batch.requests):
                return [self._error("the stub answered with the wrong number of responses")] * len(batch.requests)
            results = [self._response(q, spec, payload) for q, spec in zip(batch.requests, specs, strict=True)]
        for index in message.get("again", ()):
            results[index] = self._run_again(batch.requests[index], batch.rids[index])
        return results

    def _run_again(self, request: InferRequest, rid: int) -> EdgedError | None:
        """The model released ``request`` with RESCHEDULE. The sequence batcher of an iterative sequence model
        gives it to a later execute (under a new rid: this one's stream entry goes, not ended); elsewhere it is an
        error (which also ends a decoupled request's stream), as a request that can never complete must not hang
        its client."""
        self._streams.pop(rid, None)
        if self._state.iterative:
            request.run_again = True
            return None
        return self._error(
            "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, which needs 'sequence_batching "
            f"{{ iterative_sequence: true }}' in the configuration of model '{self._state.config.name}'"
        )

    def _response(
        self, request: InferRequest, spec: ipc.ResponseMsg, payload: memoryview | None
    ) -> InferResponse | EdgedError:
        stub = self._stub
        assert stub is not None
        return read_response(request, spec, payload, stub.consumer, self._state)

    def _on_response(self, message: dict[str, Any], payload: memoryview | None) -> None:
        rid = int(message["rid"])
        request = self._streams.get(rid)
        block = self._stub.consumer.hold(int(message["blk"][1])) if self._stub and "blk" in message else None
        try:
            if request is None or request.stream is None:
                return
            final = bool(message.get("final"))
            spec = message.get("response")
            if spec is None:
                item = StreamResponse(None, None, final)
            else:
                result = self._response(request, spec, payload)
                item = (
                    StreamResponse(None, result, final)
                    if isinstance(result, EdgedError)
                    else StreamResponse(result, None, final)
                )
            request.stream.put(item)
            if final:
                del self._streams[rid]
        finally:
            if block is not None:
                block.release()

    def _end_stream(self, rid: int, error: EdgedError) -> None:
        request = self._streams.pop(rid, None)
        if request is not None and request.stream is not None:
            request.stream.put(StreamResponse(None, error, final=True))

    # --- supervision --------------------------------------------------------------------------------------------

    def _on_gone(self) -> None:
        """The stub's end closed: fail what it had in flight now, find out why, and start a new one."""
        self._healthy = False
        if self._stopping:
            return
        self.crashes += 1
        stub = self._stub
        assert stub is not None and self._loop is not None
        self._start_restart(None)

    def _start_restart(self, reason: str | None) -> None:
        assert self._loop is not None
        self._restart = self._loop.create_task(self._restart_stub(reason))
        self._restart.add_done_callback(self._restart_done)

    def _restart_done(self, _task: asyncio.Task[None]) -> None:
        if self.on_free is not None and not self._stopping:
            self.on_free(self, None)  # serving again (or for good not): what waited for it may go on

    async def _restart_stub(self, reason: str | None) -> None:
        loop = asyncio.get_running_loop()
        old = self._stub
        if old is not None:
            await loop.run_in_executor(None, old.close, 2.0)
            reason = reason or old.exit_description()
        error = self._error(f"Stub process '{self._name}' is not healthy: it {reason}.")
        self._fail_in_flight(error, requeue=True)
        log.error("stub process of model instance '%s' %s; restarting it", self._name, reason)
        self._stub = None
        if self._stopping:
            return
        try:
            # A restart may take as long as a load: initialize is not bound by the stub timeout.
            limit = max(self._state.settings_timeout_s, RESTART_TIMEOUT_S)
            await asyncio.wait_for(loop.run_in_executor(None, self._start_again), limit)
        except (EdgedError, TimeoutError) as exc:
            detail = exc.message if isinstance(exc, EdgedError) else "it did not initialize in time"
            log.error("model instance '%s' could not be restarted: %s", self._name, detail)
            if self._stub is not None:
                self._stub.kill()
                await loop.run_in_executor(None, self._stub.close, 1.0)
                self._stub = None
            self._healthy = False
            return
        if self._stub is None:
            return
        if self._stopping:
            stub, self._stub = self._stub, None
            stub.kill()
            await loop.run_in_executor(None, stub.close, 1.0)
            return
        self._stub.attach(loop, self._on_message, self._on_gone, self._expecting)
        log.info("model instance '%s' is serving again", self._name)

    def _start_again(self) -> None:
        self.spawn()
        self.wait_initialized()

    def _fail_in_flight(self, error: EdgedError, *, requeue: bool = False) -> None:
        """Fail what the stub had in flight. With ``requeue`` (the stub died), only the batch it was running fails:
        the ones queued behind it never reached the model, so they go back to the dispatcher to run elsewhere or
        on the new stub, as requests still waiting in a queue would."""
        batches, self._batches = self._batches, {}
        queued: list[_Batch] = []
        if requeue and self.on_requeue is not None and len(batches) > 1:
            queued = list(batches.values())[1:]
            for batch in queued:
                for rid in batch.rids:
                    self._streams.pop(rid, None)
            self.on_requeue([(batch.requests, batch.timing, batch.future) for batch in queued])
        for batch in list(batches.values())[: len(batches) - len(queued)]:
            if not batch.future.done():
                batch.future.set_result([error] * len(batch.requests))
        for rid in list(self._streams):
            self._end_stream(rid, error)
        self._calls.cancel_all()
        if batches and self.on_free is not None:
            self.on_free(self, None)

    # --- stopping -----------------------------------------------------------------------------------------------

    def begin_stop(self) -> None:
        self._stopping = True
        if self._restart is not None and not self._restart.done():
            self._restart.cancel()
        stub = self._stub
        if stub is None:
            return
        self._detached = self._on_loop(stub.detach)
        self._fail_in_flight(EdgedError(ErrorCode.UNAVAILABLE, f"model instance '{self._name}' is unloading"))
        if stub.gone or stub.process.poll() is not None:
            return
        with contextlib.suppress(StubGone):
            stub.send_blocking({"t": "finalize"})

    def end_stop(self) -> None:
        stub, self._stub = self._stub, None
        self._healthy = False
        if stub is None:
            return
        deadline = time.monotonic() + self._state.settings_timeout_s
        if not self._detached:
            # The loop's reader gets the answer; reading the socket here too would split its messages.
            while not self._finalized.wait(0.05) and stub.process.poll() is None and time.monotonic() < deadline:
                pass
            if not self._finalized.is_set() and stub.process.poll() is None:
                stub.kill()
                log.error("model instance '%s' did not finalize in time and was killed", self._name)
            self._on_loop(stub.detach)
            stub.close(wait=self._state.settings_timeout_s)
            return
        try:
            # Until its answer or its end: what it sent before exiting is still in the socket.
            while True:
                reply = stub.receive_blocking(max(deadline - time.monotonic(), 0.001))
                if reply["t"] == "finalize_done":
                    break
                stub_log(self._name, reply)
        except TimeoutError:
            stub.kill()
            log.error(
                "model instance '%s' did not finalize within %g s and was killed",
                self._name,
                self._state.settings_timeout_s,
            )
        except (StubGone, ValueError):
            pass
        stub.close(wait=self._state.settings_timeout_s)

    def _on_loop(self, function: Any) -> bool:
        """Run ``function`` on the event loop and wait for it (5 s at most): whether it ran."""
        loop = self._loop
        if loop is None:
            return True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            function()
            return True
        done = threading.Event()

        def run() -> None:
            try:
                function()
            finally:
                done.set()

        loop.call_soon_threadsafe(run)
        return done.wait(5.0)

    # --- helpers ------------------------------------------------------------------------------------------------

    def _error(self, detail: str) -> EdgedError:
        return EdgedError(
            ErrorCode.INTERNAL, f"Failed to process the request(s) for model instance '{self._name}', message: {detail}"
        )


def _settle(future: asyncio.Future[Results], task: asyncio.Future[Results]) -> None:
    """Give ``future`` the outcome of ``task``."""
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif (exc := task.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(task.result())
