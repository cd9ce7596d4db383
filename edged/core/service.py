"""InferenceService: the one object every frontend (HTTP, gRPC, console) calls.

It owns no wire format: it takes and returns the core's request/response objects and plain dataclasses, and
reports failures as EdgedError with Triton's codes for each frontend to map.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edged import __version__
from edged.core.classification import classify
from edged.core.inference import InferInput, InferOutput, InferRequest, InferResponse
from edged.core.shared_memory import SharedMemoryManager
from edged.core.tensors import array_to_binary
from edged.core.validation import raw_binary_input, validate_request
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.core.repository_manager import IndexEntry, ModelRepositoryManager, ModelVersion
    from edged.core.stats import ModelStatistics
    from edged.proto.model_config_pb2 import ModelConfig

# What this server implements of Triton's protocol extensions, as GET /v2 reports it.
EXTENSIONS: tuple[str, ...] = (
    "classification",
    "model_repository",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
)


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


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
    ) -> None:
        self._manager = manager
        # The shared-memory extension's regions; frontends call its register/unregister/status directly.
        self.shared_memory = shared_memory if shared_memory is not None else SharedMemoryManager(allowed=False)
        self._metadata = ServerMetadata(server_id, __version__, EXTENSIONS)
        self._strict_readiness = strict_readiness
        # Live from construction; ready once the daemon finished its start-up loads (set by the daemon).
        self.started = False
        self.stopping = False

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
        return self._manager.is_ready(name, version)

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

    def repository_index(self, ready_only: bool) -> list[IndexEntry]:
        return self._manager.index(ready_only)

    # --- inference ----------------------------------------------------------------------------------------

    def find_model(self, name: str, version: int) -> ModelVersion:
        """The READY version a request would go to; frontends look it up before decoding the body, as Triton does,
        so a request for an unknown model is answered as such whatever its body holds."""
        return self._manager.get_ready(name, version)

    def raw_input(self, model: ModelVersion, raw: bytes | memoryview) -> InferInput:
        if model.signature is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, f"model '{model.name}' is not ready")
        return raw_binary_input(model.signature, raw)

    async def infer(self, request: InferRequest, model: ModelVersion | None = None) -> InferResponse:
        if model is None:
            model = self._manager.get_ready(request.model_name, request.model_version)
        signature = model.signature
        scheduler = model.scheduler
        if signature is None or scheduler is None:
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                f"Request for unknown model: '{model.name}' version {model.version} is not at ready state",
            )
        held = self.shared_memory.bind_inputs(request)
        try:
            validate_request(signature, request)
            request.model_version = model.version
            request.arrival_ns = time.monotonic_ns()
            result = await scheduler.enqueue(request)
            if isinstance(result, EdgedError):
                raise result
            if request.outputs is not None:
                self._select_outputs(model, request, result)
                if held:
                    self.shared_memory.write_outputs(
                        request, result.outputs, lambda o: array_to_binary(o.data, o.datatype)
                    )
            return result
        finally:
            if held:
                self.shared_memory.release(held)

    def _select_outputs(self, model: ModelVersion, request: InferRequest, response: InferResponse) -> None:
        """Keep the requested outputs in the requested order, applying classification where asked."""
        assert request.outputs is not None
        by_name = {o.name: o for o in response.outputs}
        batching = model.signature is not None and model.signature.max_batch_size > 0
        selected: list[InferOutput] = []
        for wanted in request.outputs:
            output = by_name.get(wanted.name)
            if output is None:
                raise EdgedError(
                    ErrorCode.INTERNAL,
                    f"model '{model.name}' did not produce the requested output '{wanted.name}'",
                )
            if wanted.classification > 0:
                classes = classify(
                    output.datatype, output.data, wanted.classification, model.labels.get(output.name), batching
                )
                output = InferOutput(output.name, "BYTES", tuple(classes.shape), classes)
            selected.append(output)
        response.outputs = selected


def _config_of(model: ModelVersion) -> ModelConfig:
    if model.config is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, f"model '{model.name}' has no configuration")
    return model.config


def parse_version(text: str) -> int:
    """A version from a URL or message: empty means 'pick by policy' (-1)."""
    if not text:
        return -1
    if not text.isascii() or not text.isdigit():
        raise EdgedError(ErrorCode.INVALID_ARG, f"failed to parse model version '{text}'")
    return int(text)
