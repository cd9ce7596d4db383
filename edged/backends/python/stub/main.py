"""The stub: one process per model instance, running a Triton Python-backend ``model.py`` for the daemon.

Started by the daemon as ``<python> stub/main.py <socket fd>`` (never through a shell), with one end of a
SOCK_SEQPACKET socket pair. The first message says what to do: ``auto_complete`` (run the model's
auto_complete_config and exit) or ``init`` (import the model, call initialize, then serve).

Threads: the main thread runs the model (initialize, execute, finalize) one call at a time, as Triton's stub
does, and reads the socket itself whenever it is idle, so a request reaches the model with no hand-over between
threads. While the model runs, nobody reads the socket until the model needs a message: a BLS call, a
model-management call or ``is_cancelled`` wakes a reader thread, which then takes the messages as they arrive
(BLS replies, cancellations; work for the main thread is queued in order) until execute returns. A plain
execute therefore costs no thread wake-up at all. Tensors are mapped out of shared memory in message order, which
the ring requires. Sending is serialised by one lock, from whichever thread sends (model threads answering
through a response sender, the logger). A coroutine ``execute`` runs on an event loop of its own thread.

When the daemon goes away (its end of the socket closes) the stub exits at once, whatever the model is doing.

Imports: the standard library, numpy, triton_python_backend_utils beside it and the wire format the daemon
speaks too (``../wire``: ipc, shm); both folders are taken off ``sys.path`` again once these are loaded, so that a
model's own imports never find them. The process boundary is the tree's: the daemon side is ``..``, the stub side
this folder, and ``../wire`` what both import.

Why one module of this size: it is one idea, the stub process (its connection, the serving loop, and the calls
triton_python_backend_utils makes into it, which share the connection's send lock and reader). A second module
beside it would be one more top-level name in the model's interpreter, for the same reason as above.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import json
import os
import queue
import select
import signal
import socket
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

_HERE = os.path.dirname(os.path.abspath(__file__))
# The wire format the daemon speaks too (edged.backends.python.wire), beside this folder.
_WIRE = os.path.join(os.path.dirname(_HERE), "wire")

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

    import edged.backends.python.stub.triton_python_backend_utils as pb_utils
    from edged.backends.python.wire import ipc, shm
else:
    # Run as a script (maybe by another interpreter, without edged installed): its own folder is on sys.path,
    # the wire's is put there for these imports.
    sys.path.insert(1, _WIRE)
    import ipc
    import shm
    import triton_python_backend_utils as pb_utils

    # The model sees triton_python_backend_utils (already imported) and nothing else of these folders.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (_HERE, _WIRE)]
    for _name in ("ipc", "shm"):
        sys.modules.pop(_name, None)

_RESPONSE_IN_LIST = "an 'InferenceResponse' object in the execute function return list"
_LEVELS = {pb_utils.Logger.INFO, pb_utils.Logger.WARNING, pb_utils.Logger.ERROR, pb_utils.Logger.VERBOSE}


def _runs_again(request: pb_utils.InferenceRequest) -> bool:
    """Released with RESCHEDULE: the daemon gives the request to a later execute (iterative sequences)."""
    return bool(request._release_flags & pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


def describe(exc: BaseException) -> tuple[str, str]:
    """Triton's form of an exception: ``"Type: message"`` for the client, and the frames (``At:`` lines) for the
    log. The frames name files, so they never go into a response."""
    text = str(exc)
    first = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    # The stub's own frames say nothing about the model.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.dirname(f.filename) not in (_HERE, _WIRE)]
    where = "\n".join(f"  {f.filename}({f.lineno}): {f.name}" for f in reversed(frames))
    return ipc.cut(first), ipc.cut(f"At:\n{where}" if where else "")


class Runtime:
    """The stub's side of the connection, and what triton_python_backend_utils calls into."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._receiver = ipc.Receiver(sock)
        self._send_lock = threading.Lock()
        self._producer = shm.Producer()
        self._consumer = shm.Consumer()
        # Work the reader thread received for the main thread, in message order.
        self._work: collections.deque[dict[str, Any]] = collections.deque()
        self._calls: dict[int, Any] = {}
        self._call_ids = itertools.count(1)
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self._sent = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.model_dir = ""
        # Between a successful initialize and finalize: BLS is refused outside (Triton's rule).
        self.serving = False
        self.decoupled = False
        self.model: Any = None
        self.model_name = self.instance_name = ""
        self.output_names: set[str] = set()
        self._all_outputs: list[str] = []
        # Who reads the socket: the main thread while idle; while it is busy in the model, the reader thread, once
        # something asks for it (``_want_reader``). ``_receiving`` is held by whichever of them is reading.
        self._receiving = threading.Lock()
        self._state = threading.Lock()  # guards _busy and _reader_on
        self._busy = False
        self._reader_on = False
        self._reader_wanted = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        threading.Thread(target=self._reader, name="edged-stub-reader", daemon=True).start()

    # --- messages ---------------------------------------------------------------------------------------------

    def send(self, message: dict[str, Any], tensors: ipc.TensorWriter | None = None) -> None:
        with self._send_lock:
            packet, fds = ipc.pack(message, tensors, self._producer, ipc.encode)
            try:
                ipc.send(self._sock, packet, fds)
            except OSError:
                os._exit(1)  # the daemon has gone
            finally:
                for fd in fds or ():
                    os.close(fd)

    def receive(self) -> dict[str, Any]:
        """The next message; tensors that came inside it are in ``_payload``, a private copy that the model may
        keep (the receive buffer is reused by the next message)."""
        try:
            data, payload, fds = self._receiver.receive()
        except (OSError, ValueError):
            os._exit(1)  # a broken connection: the daemon restarts the stub
        if not data:
            os._exit(0)  # the daemon has gone: nothing is left to answer
        message = ipc.decode(data)
        size = message.get("region")
        if size is not None:
            self._consumer.attach(fds.pop(0), int(size))
        for fd in fds:
            os.close(fd)
        message["_payload"] = memoryview(bytearray(payload)) if payload is not None else None
        return message

    def _dispatch(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """Handle a message at once; returns it when it is work for the main thread (execute, is_ready, finalize).
        Runs on whichever thread received it, in the order messages came."""
        kind = message["t"]
        if kind == "execute":
            self._prepare_execute(message)
            return message
        if kind == "cancel":
            with self._lock:
                self._cancelled.add(int(message["rid"]))
        elif kind == "bls_response":
            self._bls_response(message)
        elif kind == "call_done":
            waiter = self._calls.pop(int(message["call"]), None)
            if waiter is not None:
                waiter.put(message)
        else:
            return message
        return None

    def _want_reader(self) -> None:
        """Something in the model waits for a message (a BLS reply, a call's answer, a cancellation): while the
        main thread is busy in the model, the reader thread must read the socket until execute returns."""
        if self._reader_on:
            return
        with self._state:
            if self._busy and not self._reader_on:
                self._reader_on = True
                self._reader_wanted.set()

    def _reader(self) -> None:
        fd = self._sock.fileno()
        while True:
            self._reader_wanted.wait()
            self._reader_wanted.clear()
            with self._receiving:
                while True:
                    with self._state:
                        if not self._busy:
                            self._reader_on = False
                            break
                    ready, _, _ = select.select([fd, self._wake_read], [], [])
                    if self._wake_read in ready:
                        os.read(self._wake_read, 512)
                    if fd in ready:
                        work = self._dispatch(self.receive())
                        if work is not None:
                            self._work.append(work)

    def _next_work(self) -> dict[str, Any]:
        while True:
            if self._work:
                return self._work.popleft()
            with self._receiving:
                # The reader may have queued work while this thread waited for the socket: it only queues while
                # it holds the socket, so once this thread holds it, an empty queue means nothing is pending.
                if self._work:
                    return self._work.popleft()
                work = self._dispatch(self.receive())
            if work is not None:
                return work

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """While the model runs (the reader thread reads the socket if the model needs it to)."""
        self._enter_busy()
        try:
            yield
        finally:
            self._leave_busy()

    def _enter_busy(self) -> None:
        with self._state:
            self._busy = True
            if self._calls and not self._reader_on:
                # A model thread still waits for a BLS reply (a decoupled model answering after execute): it must
                # not wait for this execute to end.
                self._reader_on = True
                self._reader_wanted.set()

    def _leave_busy(self) -> None:
        with self._state:
            self._busy = False
            reading = self._reader_on
        if reading:
            os.write(self._wake_write, b"x")  # the reader leaves the socket to the main thread

    # --- serving ----------------------------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            message = self._next_work()
            kind = message["t"]
            reply: dict[str, Any] = {"t": "finalize_done"}
            tensors: ipc.TensorWriter | None = None
            self._enter_busy()
            try:
                if kind == "execute":
                    reply, tensors = self._execute(message)
                elif kind == "is_ready":
                    reply = {"t": "is_ready_done", "ready": self._is_ready()}
                elif kind == "finalize":
                    self._finalize()
            finally:
                self._leave_busy()
            # Answered once idle again, so that the next request is read by this thread, not handed over.
            try:
                self.send(reply, tensors)
            except (ValueError, shm.RingFull) as exc:
                self.send(
                    {"t": reply["t"], "batch": reply.get("batch"), "error": {"msg": str(exc), "code": "INTERNAL"}}
                )
            # Outputs may be views of the inputs (an identity model): the inputs' ring space is given back only
            # once the outputs are written.
            block: shm.Block | None = message.get("_block")
            if block is not None:
                block.release()
            if kind == "execute" and self._cancelled and not self.decoupled:
                with self._lock:
                    for request in message["_requests"]:
                        self._cancelled.discard(request._rid)
            if kind == "finalize":
                return

    def _prepare_execute(self, message: dict[str, Any]) -> None:
        """Map the batch's inputs now, in message order. Decoupled requests may outlive execute, so their inputs
        are copied and the ring space freed at once; otherwise the model reads them in place until execute ends."""
        consumer = self._consumer
        payload = message["_payload"]
        block = consumer.hold(message["blk"][1]) if "blk" in message else None
        copy = self.decoupled and block is not None
        from_wire = pb_utils.Tensor._from_wire
        read = ipc.read_tensor
        requests = []
        for spec in message["requests"]:
            inputs = [from_wire(d["n"], d["d"], read(consumer, d, copy=copy, payload=payload)) for d in spec["inputs"]]
            # Fields at their default value are left out of the message.
            requests.append(
                pb_utils.InferenceRequest._from_daemon(
                    spec["rid"],
                    spec.get("id", ""),
                    spec.get("correlation_id", 0),
                    inputs,
                    spec.get("outputs") or self._all_outputs.copy(),
                    self.model_name,
                    spec.get("flags", 0),
                    spec.get("timeout", 0),
                    spec.get("parameters", "{}"),
                )
            )
            if "trace" in spec:
                requests[-1]._trace = pb_utils.InferenceTrace(spec["trace"])
        message["_requests"] = requests
        if block is not None and copy:
            block.release()
            block = None
        message["_block"] = block

    def _execute(self, message: dict[str, Any]) -> tuple[dict[str, Any], ipc.TensorWriter | None]:
        requests: list[pb_utils.InferenceRequest] = message["_requests"]
        reply: dict[str, Any] = {"t": "execute_done", "batch": message["batch"]}
        tensors: ipc.TensorWriter | None = None
        try:
            result = self.model.execute(requests)
            # A list is the common answer; isawaitable's ABC check costs more than the rest of this.
            if type(result) is not list and inspect.isawaitable(result):
                if self.decoupled:
                    # As Triton: a decoupled coroutine runs on in the background; execute has returned.
                    future = asyncio.run_coroutine_threadsafe(_awaited(result), self._event_loop())
                    future.add_done_callback(lambda f: self._background_done(f, requests))
                    result = None
                else:
                    result = asyncio.run_coroutine_threadsafe(_awaited(result), self._event_loop()).result()
            if self.decoupled:
                if result is not None:
                    raise pb_utils.TritonModelException(
                        f"Python model '{self.instance_name}' is using the decoupled mode and the execute function "
                        "must return None."
                    )
            else:
                tensors = ipc.TensorWriter()
                reply["responses"] = self._responses(requests, result, tensors)
            again = [i for i, r in enumerate(requests) if _runs_again(r)]
            if again:
                # Released with RESCHEDULE: the daemon runs them again (iterative sequences); whatever was answered
                # for them is dropped, as Triton drops it.
                reply["again"] = again
                with self._lock:
                    for index in again:
                        self._cancelled.discard(requests[index]._rid)
        except Exception as exc:
            message_text, frames = describe(exc)
            reply["error"], reply["trace"], tensors = {"msg": message_text, "code": "INTERNAL"}, frames, None
            if not self.decoupled and any(r._sent_response for r in requests):
                # Default mode: a response sent through the sender before the failure stays its request's answer.
                tensors = ipc.TensorWriter()
                sent = [(r._sent_response, r.requested_output_names()) for r in requests]
                reply["sent"] = [
                    self._response(response, tensors, names) if response else {} for response, names in sent
                ]
        return reply, tensors

    def _responses(
        self, requests: list[pb_utils.InferenceRequest], result: Any, tensors: ipc.TensorWriter
    ) -> list[ipc.ResponseMsg]:
        returned_none, result = result is None, [None] * len(requests) if result is None else result
        if not isinstance(result, list):
            raise pb_utils.TritonModelException(f"Expected a list in the execute return, found type '{type(result)}'.")
        if len(result) != len(requests):
            raise pb_utils.TritonModelException(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n"
            )
        # None answers through the response sender (one response and FINAL), maybe after execute returned; a request
        # released with RESCHEDULE has no answer this time.
        answering = [q for q, r in zip(requests, result, strict=True) if r is None and not _runs_again(q)]
        with self._sent:
            while not all(r._sender is not None and r._sender._is_closed() for r in answering):
                if not self._sent.wait(timeout=1.0) and all(r._sender is None for r in answering):
                    what = "a list in the execute return" if returned_none else _RESPONSE_IN_LIST
                    raise pb_utils.TritonModelException(f"Expected {what}, found type '<class 'NoneType'>'.")
        messages: list[ipc.ResponseMsg] = []
        for returned, request in zip(result, requests, strict=True):
            if _runs_again(request):
                if returned is not None:  # Triton's rule (and its words): the request is then not run again
                    request._release_flags = pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
                    raise pb_utils.TritonModelException(
                        "Expected a None object in the execute function return list for reschduled request, found "
                        f"type '{type(returned)}'."
                    )
                messages.append({})  # runs again: its answer comes from a later execute
                continue
            # A response already sent through the sender is the answer; Triton ignores one returned as well.
            response = request._sent_response or returned
            if not isinstance(response, pb_utils.InferenceResponse):
                raise pb_utils.TritonModelException(f"Expected {_RESPONSE_IN_LIST}, found type '{type(response)}'.")
            messages.append(self._response(response, tensors, request.requested_output_names()))
        return messages

    def _response(
        self, response: pb_utils.InferenceResponse, tensors: ipc.TensorWriter, wanted: list[str] | None = None
    ) -> ipc.ResponseMsg:
        out: ipc.ResponseMsg = {}
        error = response.error()
        if error is not None:
            out["error"] = {"msg": ipc.cut(error.message()), "code": pb_utils._code_name(error.code())}
            return out
        descs: list[ipc.TensorDesc] = []
        for tensor in response.output_tensors():
            if not isinstance(tensor, pb_utils.Tensor):
                raise pb_utils.TritonModelException(
                    f"output_tensors must hold pb_utils.Tensor objects, found type '{type(tensor)}'"
                )
            if wanted and tensor.name() not in wanted and tensor.name() in self.output_names:
                # Pruned, as Triton does, to the outputs the request asked for; a name the model does not declare
                # goes on, for the daemon to report.
                continue
            array = tensor._array
            descs.append(tensors.add(tensor.name(), tensor._wire_datatype(), list(array.shape), array))
        out["outputs"] = descs
        if response._parameters:
            out["parameters"] = response._parameters
        return out

    def _background_done(self, future: Any, requests: list[pb_utils.InferenceRequest]) -> None:
        exc = future.exception()
        if exc is None:
            return
        message_text, frames = describe(exc)
        self.log(pb_utils.Logger.ERROR, f"{message_text}\n{frames}")
        for request in requests:
            sender = request._sender or request.get_response_sender()
            if not sender._is_closed():
                with contextlib.suppress(pb_utils.TritonModelException):
                    sender.send(
                        pb_utils.InferenceResponse(error=pb_utils.TritonError(message_text)),
                        pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="edged-stub-asyncio", daemon=True).start()
            self._loop = loop
        return self._loop

    def _is_ready(self) -> bool:
        check = getattr(self.model, "is_ready", None)
        if check is None:
            return True
        try:
            result = check()
            if inspect.isawaitable(result):
                result = asyncio.run_coroutine_threadsafe(_awaited(result), self._event_loop()).result()
            return bool(result)
        except Exception as exc:
            message_text, frames = describe(exc)
            self.log(pb_utils.Logger.ERROR, f"is_ready failed: {message_text}\n{frames}")
            return False

    def _finalize(self) -> None:
        self.serving = False
        finalize = getattr(self.model, "finalize", None)
        if finalize is None:
            return
        try:
            result = finalize()
            if inspect.isawaitable(result):
                asyncio.run_coroutine_threadsafe(_awaited(result), self._event_loop()).result()
        except Exception as exc:
            message_text, frames = describe(exc)
            self.log(pb_utils.Logger.ERROR, f"finalize failed: {message_text}\n{frames}")

    # --- what triton_python_backend_utils calls -----------------------------------------------------------------

    def log(self, level: int, message: str) -> None:
        self.send({"t": "log", "level": int(level) if level in _LEVELS else 0, "msg": ipc.cut(message)})

    def is_cancelled(self, request: pb_utils.InferenceRequest) -> bool:
        if request._rid in self._cancelled:
            return True
        self._want_reader()  # a cancellation may be waiting in the socket: from now on it is read as it comes
        return False

    def send_response(
        self, request: pb_utils.InferenceRequest, response: pb_utils.InferenceResponse | None, flags: int
    ) -> None:
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if not self.decoupled:
            # Default mode: the one response is returned with the batch, as if execute had returned it.
            with self._sent:
                if response is not None:
                    request._sent_response = response
                self._sent.notify_all()
            return
        message: dict[str, Any] = {"t": "response", "rid": request._rid, "final": final}
        tensors = None
        if response is not None:
            tensors = ipc.TensorWriter()
            message["response"] = self._response(response, tensors, request.requested_output_names())
        self.send(message, tensors)
        if final:
            with self._lock:
                self._cancelled.discard(request._rid)

    def bls(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        if not self.serving:
            raise pb_utils.TritonModelException("BLS is only supported during the 'execute' function.")
        call = next(self._call_ids)
        tensors = ipc.TensorWriter()
        inputs = []
        for tensor in request.inputs():
            if not isinstance(tensor, pb_utils.Tensor):
                raise pb_utils.TritonModelException("inputs must hold pb_utils.Tensor objects")
            array = tensor._array
            inputs.append(tensors.add(tensor.name(), tensor._wire_datatype(), list(array.shape), array))
        spec: ipc.RequestMsg = {
            "id": request.request_id(),
            "correlation_id": request.correlation_id(),
            "flags": request.flags(),
            "timeout": request.timeout(),
            "parameters": request.parameters(),
            "inputs": inputs,
            "outputs": request.requested_output_names(),
            "model_name": request._model_name,
            "model_version": request._model_version,
        }
        if request._trace._id:
            spec["trace"] = request._trace._id
        waiter: Any = pb_utils.ResponseIterator(call) if decoupled else queue.SimpleQueue()
        self._calls[call] = waiter
        self._want_reader()
        self.send({"t": "bls", "call": call, "decoupled": decoupled, "request": spec}, tensors)
        if decoupled:
            return waiter
        response: pb_utils.InferenceResponse = waiter.get()
        return response

    def _bls_response(self, message: dict[str, Any]) -> None:
        call = int(message["call"])
        payload = message["_payload"]
        read = ipc.read_tensor
        block = self._consumer.hold(int(message["blk"][1])) if "blk" in message else None
        try:
            spec: ipc.ResponseMsg = message.get("response") or ipc.ResponseMsg()
            error = spec.get("error")
            if error is not None:
                response = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(error["msg"], pb_utils._code_value(error["code"]))
                )
            else:
                outputs = [
                    pb_utils.Tensor._from_wire(d["n"], d["d"], read(self._consumer, d, copy="o" in d, payload=payload))
                    for d in spec.get("outputs", [])
                ]
                response = pb_utils.InferenceResponse(outputs, parameters=spec.get("parameters"))
        finally:
            if block is not None:
                block.release()
        final = bool(message.get("final", True))
        waiter = self._calls.get(call)
        if waiter is None:
            return
        if isinstance(waiter, pb_utils.ResponseIterator):
            waiter._put(response, final)
        else:
            waiter.put(response)
        if final:
            self._calls.pop(call, None)

    def cancel_bls(self, call: int) -> None:
        self.send({"t": "bls_cancel", "call": call})

    def call(self, op: str, args: dict[str, Any], files: dict[str, bytes] | None = None) -> Any:
        call = next(self._call_ids)
        waiter: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._calls[call] = waiter
        self._want_reader()
        tensors = None
        if files:
            # File contents go as tensors (through shared memory), never inside the JSON message.
            tensors = ipc.TensorWriter()
            args = {
                **args,
                "files": [tensors.add(key, "UINT8", [len(content)], bytes(content)) for key, content in files.items()],
            }
        try:
            self.send({"t": "call", "call": call, "op": op, "args": args}, tensors)
        except (ValueError, shm.RingFull) as exc:
            self._calls.pop(call, None)
            raise pb_utils.TritonModelException(f"{op}: {exc}") from None
        reply = waiter.get()
        if "error" in reply:
            raise pb_utils.TritonModelException(reply["error"])
        return reply.get("result")

    def metric(self, message: dict[str, Any]) -> None:
        self.send({"t": "metric", **message})


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def load_model_module(model_file: str, paths: list[str]) -> ModuleType:
    """Import model.py with its version and model folders on the import path (appended, as Triton appends them).
    As in Triton, a model in a version folder is the module ``<version>.model`` of the package its version folder
    is, so that its relative imports (``from .helpers import ...``) find the files beside it; a Python-based
    backend's model.py is the module ``model``."""
    for path in paths:
        if path not in sys.path:
            sys.path.append(path)
    folder, stem = os.path.dirname(model_file), os.path.splitext(os.path.basename(model_file))[0]
    version = os.path.basename(folder)
    name = stem
    if version.isdigit():
        package = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(version, None, is_package=True))
        package.__path__ = [folder]
        sys.modules.setdefault(version, package)
        name = f"{version}.{stem}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"unable to load '{os.path.basename(model_file)}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = sys.modules["model"] = module
    spec.loader.exec_module(module)
    return module


def _model_class(module: ModuleType, model_file: str) -> Any:
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None:
        raise AttributeError(f"Python model file '{os.path.basename(model_file)}' does not define TritonPythonModel")
    return cls


def auto_complete(runtime: Runtime, message: dict[str, Any]) -> None:
    runtime.model_dir = message["model_dir"]
    try:
        module = load_model_module(message["model_file"], message["paths"])
        cls = _model_class(module, message["model_file"])
        config_json = message["config"]
        function = getattr(cls, "auto_complete_config", None)
        if function is not None:
            result = function(pb_utils.ModelConfig(config_json))
            if not isinstance(result, pb_utils.ModelConfig):
                raise pb_utils.TritonModelException(
                    f"auto_complete_config function in model '{message['model_name']}' must return a valid "
                    "pb.ModelConfig object."
                )
            config_json = json.dumps(result.as_dict())
        runtime.send({"t": "auto_complete_done", "config": config_json})
    except Exception as exc:
        message_text, frames = describe(exc)
        runtime.send({"t": "auto_complete_done", "error": message_text, "trace": frames})


def initialize(runtime: Runtime, message: dict[str, Any]) -> bool:
    runtime.model_dir = message["model_dir"]
    runtime.decoupled = bool(message.get("decoupled", False))
    runtime.model_name, runtime.instance_name = message["args"]["model_name"], message["args"]["model_instance_name"]
    runtime._all_outputs = list(message.get("outputs", []))
    runtime.output_names = set(runtime._all_outputs)
    try:
        module = load_model_module(message["model_file"], message["paths"])
        model = _model_class(module, message["model_file"])()
        if not callable(getattr(model, "execute", None)):
            raise AttributeError(f"Python model '{runtime.model_name}' does not implement `execute` method.")
        runtime.model = model
        init = getattr(model, "initialize", None)
        if init is not None:
            with runtime.busy():
                result = init(dict(message["args"]))
                if inspect.isawaitable(result):
                    asyncio.run_coroutine_threadsafe(_awaited(result), runtime._event_loop()).result()
    except Exception as exc:
        message_text, frames = describe(exc)
        runtime.send({"t": "init_done", "ok": False, "error": message_text, "trace": frames})
        return False
    runtime.serving = True
    has_is_ready = hasattr(runtime.model, "is_ready")
    ready = runtime._is_ready() if has_is_ready else True
    runtime.send({"t": "init_done", "ok": True, "has_is_ready": has_is_ready, "ready": ready})
    return True


def _report_uncaught(kind: type[BaseException], exc: BaseException, _tb: Any) -> None:
    if issubclass(kind, (KeyboardInterrupt, SystemExit)):
        return
    message_text, frames = describe(exc)
    if pb_utils._runtime is not None:
        pb_utils._runtime.log(pb_utils.Logger.ERROR, f"uncaught exception: {message_text}\n{frames}")


def main() -> int:
    # The daemon decides when a stub stops (finalize, or the end of its socket). Signals meant for the daemon (a
    # terminal's Ctrl-C, systemd's SIGTERM to the whole unit) reach the stubs too and must not cut finalize short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(sys.argv[1]))
    sys.argv = [""]  # as in Triton's embedded interpreter (a model's unittest.main() parses it)
    sock.setblocking(True)
    runtime = Runtime(sock)
    pb_utils._runtime = runtime
    # Uncaught exceptions in model threads go to the daemon's log in Triton's form, not to stderr.
    threading.excepthook = lambda args: _report_uncaught(args.exc_type, args.exc_value or Exception(), None)
    message = runtime.receive()
    if message["t"] == "auto_complete":
        auto_complete(runtime, message)
        return 0
    if not initialize(runtime, message):
        return 1
    runtime.serve()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as exc:  # sys.exit() in the model: the stub ends with its status, as the model asked
        code = exc.code if isinstance(exc.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Model threads that are still running must not keep the process after finalize.
    os._exit(code)
