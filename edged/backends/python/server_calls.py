"""What a Python model asks of the server through its stub: BLS requests (``InferenceRequest.exec`` and
``async_exec``, decoupled or not) and the model-management calls (``load_model``, ``unload_model``,
``is_model_ready``).

Each request or call runs as a task on the event loop and answers the stub when done, while the model thread that
asked waits for the answer. Tensors come from the stub's ring (or the message itself) and are copied before the
message's buffer is released; answers go back the same way. A stub that is gone gets no answer: its model thread
went with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from typing import TYPE_CHECKING, Any

from edged.backends.python.wire import ipc, shm
from edged.core.request.inference import InferInput, InferRequest, InferResponse, RequestedOutput
from edged.core.trace_file import LIVE
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import numpy as np

    from edged.backends.python.process import StubProcess
    from edged.core.backend_api import ServerApi

log = logging.getLogger("edged.backends.python")


class ServerCalls:
    def __init__(self, instance: str, server: ServerApi | None, stub: Callable[[], StubProcess | None]) -> None:
        self._instance = instance
        self._server = server
        self._stub = stub  # the instance's current stub (a restart replaces it)
        self._bls: dict[int, tuple[InferRequest, asyncio.Task[None]]] = {}

    def cancel(self, call: int) -> None:
        """The model cancelled a decoupled BLS request (``ResponseIterator.cancel()``). As in Triton, the callee is
        told (its ``request.is_cancelled()``) and whatever it still sends is delivered until its final response."""
        entry = self._bls.get(call)
        if entry is not None:
            entry[0].cancel()

    def cancel_all(self) -> None:
        """The stub is gone: nothing it asked for is wanted any more."""
        for _, task in list(self._bls.values()):
            task.cancel()

    # --- BLS --------------------------------------------------------------------------------------------------

    def on_bls(self, message: dict[str, Any], payload: memoryview | None) -> None:
        call = int(message["call"])
        spec: ipc.RequestMsg = message["request"]
        with self._tensors(message, payload, spec.get("inputs", [])) as arrays:
            inputs = [InferInput(d["n"], d["d"], tuple(d["s"]), array) for d, array in arrays]
        parameters: dict[str, Any] = json.loads(spec.get("parameters") or "{}")
        correlation = spec.get("correlation_id", 0)
        if correlation:
            parameters["sequence_id"] = correlation
        flags = int(spec.get("flags", 0))
        if flags & 1:
            parameters["sequence_start"] = True
        if flags & 2:
            parameters["sequence_end"] = True
        timeout = spec.get("timeout", 0)
        if timeout:
            parameters["timeout"] = int(timeout)  # microseconds, as the frontends pass a client's timeout
        names = spec.get("outputs", [])
        request = InferRequest(
            model_name=str(spec.get("model_name", "")),
            model_version=int(spec.get("model_version", -1)),
            id=str(spec.get("id", "")),
            inputs=inputs,
            outputs=[RequestedOutput(n) for n in names] if names else None,
            parameters=parameters,
        )
        # Passed ``trace=request.trace()``: the call is traced as a child of the request the model serves.
        parent = LIVE.traces.get(spec["trace"]) if "trace" in spec else None
        request.trace = trace = parent.child() if parent is not None else None
        task = asyncio.ensure_future(self._run_bls(call, request, bool(message.get("decoupled"))))
        if trace is not None:  # ended however the call ends (the service ends it once it ran)
            task.add_done_callback(lambda _: trace.close())
        self._bls[call] = (request, task)
        task.add_done_callback(lambda _: self._bls.pop(call, None))

    async def _run_bls(self, call: int, request: InferRequest, decoupled: bool) -> None:
        final_sent = False
        try:
            if self._server is None:
                raise EdgedError(ErrorCode.UNAVAILABLE, "BLS is only available inside the daemon")
            if decoupled:
                async for item in self._server.infer_stream(request):
                    self._send_bls(call, item.response, item.error, item.final)
                    final_sent = item.final
            else:
                self._send_bls(call, await self._server.infer(request), None, True)
                final_sent = True
        except EdgedError as exc:
            if not request.arrival_ns:
                # Refused before it was queued (unknown model, invalid inputs): Triton's text for a request its
                # server would not take.
                text = f"Model {request.model_name} - Error when running inference: {exc.message}"
                exc = EdgedError(exc.code, text)
            self._send_bls(call, None, exc, True)
            final_sent = True
        except asyncio.CancelledError:
            self._send_bls(call, None, EdgedError(ErrorCode.CANCELLED, "the BLS request was cancelled"), True)
            final_sent = True
        except Exception:
            log.exception("BLS request from model instance '%s' failed", self._instance)
            self._send_bls(call, None, EdgedError(ErrorCode.INTERNAL, "internal error"), True)
            final_sent = True
        if not final_sent:
            self._send_bls(call, None, None, True)

    def _send_bls(self, call: int, response: InferResponse | None, error: EdgedError | None, final: bool) -> None:
        stub = self._stub()
        if stub is None or stub.gone:
            return
        tensors = ipc.TensorWriter()
        spec: ipc.ResponseMsg = {}
        if error is not None:
            spec["error"] = {"msg": ipc.cut(error.message), "code": error.code.name}
        elif response is not None:
            spec["outputs"] = [tensors.add(o.name, o.datatype, list(o.shape), o.data) for o in response.outputs]
            if response.parameters:
                spec["parameters"] = dict(response.parameters)
        try:
            stub.send({"t": "bls_response", "call": call, "response": spec, "final": final}, tensors)
        except (ValueError, shm.RingFull) as exc:
            stub.send(
                {
                    "t": "bls_response",
                    "call": call,
                    "response": {"error": {"msg": str(exc), "code": "INTERNAL"}},
                    "final": True,
                }
            )

    # --- model management -----------------------------------------------------------------------------------

    def on_call(self, message: dict[str, Any], payload: memoryview | None) -> None:
        """load_model, unload_model and is_model_ready. Loads and unloads take time: they run as tasks."""
        stub = self._stub()
        assert stub is not None
        call, op, args = int(message["call"]), message.get("op"), message.get("args") or {}
        server = self._server
        if op == "is_model_ready":
            version = str(args.get("model_version") or "")
            valid = server is not None and (not version or version.isdigit())
            number = int(version) if version else -1
            ready = bool(valid and server is not None and server.model_ready(str(args.get("model_name")), number))
            stub.send({"t": "call_done", "call": call, "result": ready})
            return
        if op not in ("load_model", "unload_model") or server is None:
            stub.send({"t": "call_done", "call": call, "error": f"unknown call '{op}'"})
            return
        # Override files travel as UINT8 tensors named after their "file:<version>/<path>" keys.
        with self._tensors(message, payload, args.get("files", [])) as arrays:
            files = {d["n"].removeprefix("file:"): array.tobytes() for d, array in arrays}
        name = str(args.get("model_name", ""))
        if op == "load_model":
            work = server.load_model(name, str(args.get("config") or "") or None, files)
        else:
            work = server.unload_model(name, bool(args.get("unload_dependents")))
        task = asyncio.ensure_future(work)
        task.add_done_callback(functools.partial(self._call_done, call))

    def _call_done(self, call: int, task: asyncio.Future[None]) -> None:
        stub = self._stub()
        if stub is None or stub.gone:
            return
        reply: dict[str, Any] = {"t": "call_done", "call": call}
        if task.cancelled():
            reply["error"] = "the call was cancelled"
        elif isinstance(exc := task.exception(), EdgedError):
            reply["error"] = exc.message
        elif exc is not None:
            log.error("load/unload of model instance '%s' failed: %r", self._instance, exc)
            reply["error"] = str(exc)
        stub.send(reply)

    @contextlib.contextmanager
    def _tensors(
        self, message: dict[str, Any], payload: memoryview | None, descs: list[Any]
    ) -> Iterator[list[tuple[Any, np.ndarray[Any, Any]]]]:
        """Copies of the message's tensors, with their descriptors; the ring block they came in is released after."""
        stub = self._stub()
        assert stub is not None
        block = stub.consumer.hold(int(message["blk"][1])) if "blk" in message else None
        try:
            yield [(d, ipc.read_tensor(stub.consumer, d, copy=True, payload=payload)) for d in descs]
        finally:
            if block is not None:
                block.release()
