"""InferenceService: the one object every frontend (HTTP, gRPC, console) calls.

It owns no wire format: it takes and returns the core's request/response objects and plain dataclasses, and
reports failures as EdgedError with Triton's codes for each frontend to map.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from edged import __version__
from edged.core.model_memory import ModelMemory, model_memory
from edged.core.names import model_name_problem, printable
from edged.core.repository.summary import config_text, summaries, summary
from edged.core.request.classification import classify
from edged.core.request.inference import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    ResponseStream,
    StreamResponse,
)
from edged.core.request.tensors import array_to_binary
from edged.core.request.validation import raw_binary_input, validate_request
from edged.core.shared_memory import SharedMemoryManager
from edged.core.stats import UnroutedErrors
from edged.core.tracing import TraceManager
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from edged.core.alerts.engine import Alerts
    from edged.core.device_conditions import DeviceConditions, DeviceConditionsReader
    from edged.core.devices import DeviceInventory
    from edged.core.metrics_history import MetricsHistory
    from edged.core.repository.control import ModelController
    from edged.core.repository.manager import IndexEntry, ModelRepositoryManager, ModelVersion
    from edged.core.repository.summary import ModelSummary
    from edged.core.repository.uploads import ModelUploads
    from edged.core.repository.versions import ServedVersions
    from edged.core.request.validation import ModelSignature
    from edged.core.scheduling.scheduler import Scheduler
    from edged.core.stats import ModelStatistics
    from edged.core.sync_control import SyncControl
    from edged.proto.model_config_pb2 import ModelConfig
    from edged.state.store import HistoryEvent

# What this server implements of Triton's protocol extensions, as GET /v2 reports it: Triton's names, in Triton's
# order.
EXTENSIONS: tuple[str, ...] = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelHandle:
    """A READY model version as a frontend holds it for one request (InferenceService.find_model): its name,
    version, and whether it answers through a stream of responses. What stands behind it is the core's own."""

    name: str
    version: int
    decoupled: bool
    # None in a frontend worker's handle (edged.frontends.relay): the daemon looks the version up again.
    _record: ModelVersion | None = field(repr=False, compare=False)


class InferencePath(Protocol):
    """What the inference endpoints call: InferenceService in the daemon, edged.frontends.relay.remote's
    RemoteService in a frontend worker process."""

    # The trace settings; the endpoints sample a request only while ``tracing.enabled``.
    tracing: TraceManager

    def find_model(self, name: str, version: int) -> ModelHandle: ...

    def raw_input(self, model: ModelHandle, raw: bytes | memoryview) -> InferInput: ...

    def model_signature(self, model: ModelHandle) -> ModelSignature: ...

    async def infer(self, request: InferRequest, handle: ModelHandle | None = None) -> InferResponse: ...

    def infer_stream(
        self, request: InferRequest, handle: ModelHandle | None = None
    ) -> AsyncIterator[StreamResponse]: ...

    def refused(self, model: ModelHandle | None) -> None: ...


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


class InferenceService:
    def __init__(
        self,
        manager: ModelRepositoryManager,
        *,
        server_id: str,
        strict_readiness: bool,
        shared_memory: SharedMemoryManager | None = None,
        controller: ModelController | None = None,
        sync: SyncControl | None = None,
        history: MetricsHistory | None = None,
        uploads: ModelUploads | None = None,
        unrouted: UnroutedErrors | None = None,
        conditions: DeviceConditionsReader | None = None,
        alerts: Alerts | None = None,
    ) -> None:
        """``controller``: model control, for the repository API (None: loads and unloads are refused); ``sync``:
        repository sync, when a repository is remote; ``history``: the last minutes of metrics, for live charts;
        ``uploads``: model uploads (None: refused); ``unrouted``: where requests answered with an error for no
        served model are counted (the history reads it); ``conditions``: disk space and temperatures, for the
        console (None: not read); ``alerts``: the alert rules and their webhook (None: no state database keeps
        them)."""
        self._conditions = conditions
        self.sync = sync
        self.unrouted = unrouted if unrouted is not None else UnroutedErrors()
        self._history = history
        self.uploads = uploads
        self.alerts = alerts
        self._manager = manager
        # The shared-memory extension's regions; frontends call its register/unregister/status directly.
        self.shared_memory = shared_memory if shared_memory is not None else SharedMemoryManager(allowed=False)
        self._metadata = ServerMetadata(server_id, __version__, EXTENSIONS)
        self._strict_readiness = strict_readiness
        self._controller = controller
        self.tracing = TraceManager()
        # Live from construction; ready once the daemon finished its start-up loads (set by the daemon).
        self.started = False
        self.stopping = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the service runs on (backends that call back into the server use it)."""
        if self._loop is None:
            raise RuntimeError("the inference service was created outside an event loop")
        return self._loop

    # --- health and metadata ----------------------------------------------------------------------------

    def is_live(self) -> bool:
        return not self.stopping

    def is_ready(self) -> bool:
        if not self.started or self.stopping:
            return False
        return self._manager.all_ready() if self._strict_readiness else True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    def model_ready(self, name: str, version: int) -> bool:
        """READY, and the backend can serve it now (a Python model is not while an instance's process restarts)."""
        try:
            model = self._manager.get_ready(name, version)
        except EdgedError:
            return False
        # Optional in the backend protocol (edged.core.backend_api.BackendModel): only some backends can be unready.
        backend_ready = getattr(model.backend_model, "is_ready", None)
        return bool(backend_ready()) if backend_ready is not None else True

    def model_metadata(self, name: str, version: int) -> ModelMetadata:
        model = self._manager.get_ready(name, version)
        config = _config_of(model)
        versions = (str(version),) if version >= 0 else tuple(str(v) for v in self._manager.ready_versions(name))
        batch = (-1,) if config.max_batch_size > 0 else ()
        signature = model.signature
        assert signature is not None  # a READY version always has one
        return ModelMetadata(
            name=name,
            versions=versions,
            platform=config.platform or config.backend,
            inputs=tuple(TensorMetadata(t.name, t.datatype, batch + t.dims) for t in signature.inputs.values()),
            outputs=tuple(TensorMetadata(t.name, t.datatype, batch + t.dims) for t in signature.outputs.values()),
        )

    def model_config(self, name: str, version: int) -> ModelConfig:
        return _config_of(self._manager.get_ready(name, version))

    def statistics(self, name: str, version: int) -> list[ModelStatistics]:
        return self._manager.statistics(name, version)

    def metrics_history(self, model: str | None, since: float | None) -> dict[str, Any]:
        """The short metrics history (edged.core.metrics_history) of one model or of every model (None), the points
        after ``since`` only, JSON-ready."""
        if self._history is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, "this server keeps no metrics history")
        if model is not None and (problem := model_name_problem(model)) is not None:
            raise EdgedError(ErrorCode.INVALID_ARG, f"'{printable(model)}' cannot be a model name: {problem}")
        if since is not None and not math.isfinite(since):
            raise EdgedError(ErrorCode.INVALID_ARG, "'since' must be a finite number of seconds since the epoch")
        return self._history.history(model, since)

    async def load_model(self, name: str, config_json: str | None, files: dict[str, bytes]) -> None:
        """The repository extension's load: the model (re)loads beside what serves; errors say why."""
        await self._control().load(name, config_json=config_json, files=files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._control().unload(name, unload_dependents=unload_dependents)

    async def activate_version(self, name: str, version: int) -> ServedVersions:
        """Serve exactly ``version`` of a model, swapped in without downtime (edged.core.repository.versions)."""
        return await self._control().versions.activate(name, version)

    async def rollback_version(self, name: str) -> ServedVersions:
        """Serve again the versions that served before the model's last change of served versions."""
        return await self._control().versions.rollback(name)

    async def rollback_versions(self, name: str) -> list[int]:
        """The versions a rollback of the model would serve (empty: nothing to roll back to)."""
        if self._controller is None:
            return []
        return await self._controller.versions.previous(name)

    async def model_history(self, name: str | None, offset: int, limit: int) -> tuple[list[HistoryEvent], int]:
        """What happened to a model (every model when ``name`` is None), newest first, and how many events in all."""
        # SQLite's integers are 64-bit: an offset past them is no page of anything.
        if not 0 <= offset < 2**63 or not 1 <= limit <= 1000:
            raise EdgedError(ErrorCode.INVALID_ARG, "history paging needs 0 <= offset < 2**63 and 1 <= limit <= 1000")
        if name is not None and (problem := model_name_problem(name)) is not None:
            raise EdgedError(ErrorCode.INVALID_ARG, f"'{printable(name)}' cannot be a model name: {problem}")
        if self._controller is None:
            return [], 0
        return await self._controller.history(name, offset, limit)

    def _control(self) -> ModelController:
        if self._controller is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")
        return self._controller

    def repository_index(self, ready_only: bool) -> list[IndexEntry]:
        return self._manager.index(ready_only)

    # --- what the console shows -----------------------------------------------------------------------------

    @property
    def devices(self) -> DeviceInventory:
        return self._manager.devices

    @property
    def control_mode(self) -> str:
        """none, poll or explicit: whether models may be loaded and unloaded on request."""
        return self._controller.mode.value if self._controller is not None else "none"

    def model_summaries(self) -> list[ModelSummary]:
        """Every model of the repositories, loaded or not, with its versions on disk and its instances."""
        return summaries(self._manager, self._manager.devices)

    def model_summary(self, name: str) -> ModelSummary | None:
        return summary(self._manager, self._manager.devices, name)

    def model_memory(self, name: str) -> ModelMemory:
        """The memory of the model's instance processes, where its instances run in processes of their own (the
        Python backend, isolated frameworks); none listed for a model served inside the daemon."""
        return model_memory(self._manager, name)

    def device_conditions(self) -> DeviceConditions | None:
        """Free disk space where edged writes, and the temperatures the kernel exposes; None when not read.
        Blocking (statvfs, sysfs): call it off the event loop."""
        return self._conditions.read() if self._conditions is not None else None

    def model_config_text(self, name: str) -> str | None:
        """The model's config as loaded, as config.pbtxt text (None when it never loaded)."""
        return config_text(self._manager, name)

    # --- inference ----------------------------------------------------------------------------------------

    def find_model(self, name: str, version: int) -> ModelHandle:
        """The READY version a request would go to, looked up once per request: frontends look it up before
        decoding the body, as Triton does, so a request for an unknown model is answered as such whatever its body
        holds, and hand the handle back with the request."""
        found = self._manager.get_ready(name, version)
        return ModelHandle(found.name, found.version, _is_decoupled(found), found)

    def model_signature(self, model: ModelHandle) -> ModelSignature:
        """The inputs and outputs a request to the handle's version is checked against."""
        signature = self._record(None, model).signature
        if signature is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, f"model '{model.name}' is not ready")
        return signature

    def raw_input(self, model: ModelHandle, raw: bytes | memoryview) -> InferInput:
        return raw_binary_input(self.model_signature(model), raw)

    def refused(self, model: ModelHandle | None) -> None:
        """A frontend answered an inference request with an error found outside ``infer`` (an undecodable or too
        large body, a response it could not encode), or for no served model (None): counted for the metrics
        history as the version's refusal, or device-wide. What ``infer`` and ``infer_stream`` raise they count
        themselves, and the statistics extension and ``nv_*`` count neither (edged.core.stats)."""
        record = None
        if model is not None:
            record = model._record
            if record is None:  # a frontend worker's handle
                try:
                    record = self._manager.get_ready(model.name, model.version)
                except EdgedError:
                    record = None
        self._count_refusal(record)

    def _count_refusal(self, model: ModelVersion | None) -> None:
        if model is not None and model.stats is not None:
            model.stats.record_refusal()
        else:
            self.unrouted.count += 1

    async def infer(self, request: InferRequest, handle: ModelHandle | None = None) -> InferResponse:
        try:
            model = self._record(request, handle)
        except EdgedError:
            self.unrouted.count += 1
            raise
        return await self._infer(request, model)

    async def _infer(self, request: InferRequest, model: ModelVersion) -> InferResponse:
        # Every error that leaves here is counted once: by the scheduler (a failure, a refusal it made, or an error
        # the model answered with) from the moment it has the request until the model succeeded, else here: as the
        # version's refusal before that, as an answered error after it.
        scheduled = succeeded = False
        held = None
        try:
            if _is_decoupled(model):
                raise EdgedError(
                    ErrorCode.UNSUPPORTED,
                    f"model '{model.name}' uses the decoupled transaction policy: it answers through a stream of "
                    "responses, which this call cannot return",
                )
            scheduler = self._scheduler_of(model)
            held = self.shared_memory.bind_inputs(request)
            self._accept(model, request)
            scheduled = True
            result = await scheduler.enqueue(request)
            if isinstance(result, EdgedError):
                raise result
            scheduled, succeeded = False, True  # counted as a success: an error from here on is an answered one
            if result is None:
                raise EdgedError(ErrorCode.INTERNAL, f"model '{model.name}' returned no response")
            if request.outputs is not None:
                self._select_outputs(model, request, result)
                if held:
                    self.shared_memory.write_outputs(
                        request, result.outputs, lambda o: array_to_binary(o.data, o.datatype)
                    )
            return result
        except Exception:
            if succeeded:
                if model.stats is not None:
                    model.stats.record_answered_error()
            elif not scheduled:
                self._count_refusal(model)
            raise
        finally:
            if held:
                self.shared_memory.release(held)
            if request.trace is not None:
                request.trace.request_end()

    async def infer_stream(
        self, request: InferRequest, handle: ModelHandle | None = None
    ) -> AsyncIterator[StreamResponse]:
        """Every response of the request, in order, the last one marked final. A model that is not decoupled
        gives exactly one; a decoupled one zero or more, then possibly a final response with no data. Errors found
        before the model runs are raised; errors after come as responses. Leaving the iteration early cancels the
        request."""
        try:
            model = self._record(request, handle)
        except EdgedError:
            self.unrouted.count += 1
            raise
        if not _is_decoupled(model):
            yield StreamResponse(await self._infer(request, model), final=True)
            return
        held = None
        stream = request.stream = ResponseStream()
        try:
            try:
                scheduler = self._scheduler_of(model)
                held = self.shared_memory.bind_inputs(request)
                self._accept(model, request)
            except Exception:
                self._count_refusal(model)
                raise
            execution = asyncio.ensure_future(scheduler.enqueue(request))
            execution.add_done_callback(lambda done: _end_stream(stream, done))
            erred = False
            while True:
                item = await stream.get()
                if item.error is not None and not erred:
                    erred = True
                    execution.add_done_callback(lambda done: self._stream_erred(model, done))
                if item.response is not None and request.outputs is not None:
                    self._select_outputs(model, request, item.response)
                yield item
                if item.final:
                    break
        finally:
            if not stream.finished:
                request.cancel()
            if held:
                self.shared_memory.release(held)
            if request.trace is not None:
                request.trace.request_end()

    def _stream_erred(self, model: ModelVersion, execution: asyncio.Future[InferResponse | EdgedError | None]) -> None:
        """A decoupled request's stream carried an error: the scheduler counted it if the execution failed; if the
        execution counts as a success (the model sent the error), it is counted here, once, as an answered error."""
        if execution.cancelled() or execution.exception() is not None or isinstance(execution.result(), EdgedError):
            return
        if model.stats is not None:
            model.stats.record_answered_error()

    def _record(self, request: InferRequest | None, handle: ModelHandle | None) -> ModelVersion:
        """The version the request goes to: the frontend's handle, or (a call from a model or a frontend worker)
        looked up now."""
        if handle is not None:
            if handle._record is not None:
                return handle._record
            return self._manager.get_ready(handle.name, handle.version)
        assert request is not None
        return self._manager.get_ready(request.model_name, request.model_version)

    def _scheduler_of(self, model: ModelVersion) -> Scheduler:
        if model.signature is None or model.scheduler is None:
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                f"Request for unknown model: '{model.name}' version {model.version} is not at ready state",
            )
        return model.scheduler

    def _accept(self, model: ModelVersion, request: InferRequest) -> None:
        assert model.signature is not None
        validate_request(model.signature, request)
        request.model_version = model.version
        request.arrival_ns = time.monotonic_ns()
        if request.trace is not None:
            request.trace.accepted(request)

    def _select_outputs(self, model: ModelVersion, request: InferRequest, response: InferResponse) -> None:
        """Keep the requested outputs in the requested order, applying classification where asked. One the model
        did not return is left out, as Triton leaves it out: a Python model may skip an output (one that follows an
        optional input not given), and a decoupled model's responses may each carry only some of them."""
        assert request.outputs is not None
        by_name = {o.name: o for o in response.outputs}
        batching = model.signature is not None and model.signature.max_batch_size > 0
        selected: list[InferOutput] = []
        for wanted in request.outputs:
            output = by_name.get(wanted.name)
            if output is None:
                continue
            if wanted.classification > 0:
                classes = classify(
                    output.datatype, output.data, wanted.classification, model.labels.get(output.name), batching
                )
                output = InferOutput(output.name, "BYTES", tuple(classes.shape), classes)
            selected.append(output)
        response.outputs = selected


def _is_decoupled(model: ModelVersion) -> bool:
    return model.config is not None and model.config.model_transaction_policy.decoupled


def _end_stream(stream: ResponseStream, execution: asyncio.Future[InferResponse | EdgedError | None]) -> None:
    """A decoupled execution that failed before its model finished the stream ends it with the error; one that
    returned leaves the stream to the model, which may still be sending."""
    if execution.cancelled():
        error: EdgedError | None = EdgedError(ErrorCode.CANCELLED, "the request was cancelled")
    elif execution.exception() is not None:
        exc = execution.exception()
        error = exc if isinstance(exc, EdgedError) else EdgedError(ErrorCode.INTERNAL, "internal error")
    else:
        result = execution.result()
        error = result if isinstance(result, EdgedError) else None
    if error is not None and not stream.finished:
        stream.put(StreamResponse(None, error, final=True))


def _config_of(model: ModelVersion) -> ModelConfig:
    if model.config is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, f"model '{model.name}' has no configuration")
    return model.config
