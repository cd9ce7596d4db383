"""The ``model.py`` that a framework model runs as when its backend is isolated (``--backend-config
<backend>,isolation=process``, edged.backends.isolation): a Triton Python-backend model, run by a stub process per
instance, that loads the model with edged's own framework backend and hands it each batch.

It is loaded by the stub as every model.py is, with the daemon's interpreter, so edged's modules are importable. The
daemon marks the config it sends with the framework backend's name, the model file and the default max batch size
(edged.backends.isolation.MARKS), which are taken off again before the framework sees the config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from edged.backends import BackendRegistry
from edged.backends.isolation import BACKEND, DEFAULT_MAX_BATCH_SIZE, MARKS, MODEL_FILE, VERSION_DIR
from edged.core.backend_api import LoadContext
from edged.core.config.model_config import model_config_from_json, model_config_to_json
from edged.core.devices import KIND_CPU, KIND_GPU, KIND_MODEL, Device, DeviceInventory
from edged.core.request.datatypes import wire_name_for_numpy
from edged.core.request.inference import InferInput, InferRequest, InferResponse
from edged.core.stats import ExecutionTiming
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    import edged.backends.python.stub.triton_python_backend_utils as pb_utils
else:  # the stub's module, beside every model.py it loads
    import triton_python_backend_utils as pb_utils

_CODES: Final = {
    ErrorCode.UNKNOWN: pb_utils.TritonError.UNKNOWN,
    ErrorCode.NOT_FOUND: pb_utils.TritonError.NOT_FOUND,
    ErrorCode.INVALID_ARG: pb_utils.TritonError.INVALID_ARG,
    ErrorCode.UNAVAILABLE: pb_utils.TritonError.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: pb_utils.TritonError.UNSUPPORTED,
    ErrorCode.ALREADY_EXISTS: pb_utils.TritonError.ALREADY_EXISTS,
    ErrorCode.CANCELLED: pb_utils.TritonError.CANCELLED,
}


def _unmarked(config_json: str) -> tuple[Any, dict[str, str]]:
    """The model's config without the daemon's marks, and the marks."""
    config = model_config_from_json(config_json)
    marks = {key: config.parameters[key].string_value for key in MARKS if key in config.parameters}
    for key in marks:
        del config.parameters[key]
    return config, marks


def _context(config: Any, marks: dict[str, str], devices: DeviceInventory) -> LoadContext:
    version_dir = Path(marks[VERSION_DIR])
    version = int(version_dir.name) if version_dir.name.isdigit() else 0
    return LoadContext(config.name, version, version_dir.parent, version_dir, Path(marks[MODEL_FILE]), devices)


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config: Any) -> Any:
        """The framework backend's auto-complete, written back through the calls Triton's API allows."""
        current = auto_complete_model_config.as_dict()
        config, marks = _unmarked(json.dumps(current))
        backend = BackendRegistry({}).get(marks[BACKEND])
        # Auto-complete reads the model on the first GPU where there is one (a TensorRT engine needs it).
        context = _context(config, marks, DeviceInventory.discover())
        backend.auto_complete_config(config, context, int(marks.get(DEFAULT_MAX_BATCH_SIZE, "0") or 0))
        completed = json.loads(model_config_to_json(config))
        if completed.get("max_batch_size", 0) != current.get("max_batch_size", 0):
            auto_complete_model_config.set_max_batch_size(completed["max_batch_size"])
        if "dynamic_batching" in completed and "dynamic_batching" not in current:
            auto_complete_model_config.set_dynamic_batching()
        for kind, add in (
            ("input", auto_complete_model_config.add_input),
            ("output", auto_complete_model_config.add_output),
        ):
            known = {tensor["name"] for tensor in current.get(kind, [])}
            for tensor in completed.get(kind, []):
                if tensor["name"] not in known:
                    add({key: tensor[key] for key in ("name", "data_type", "dims") if key in tensor})
        return auto_complete_model_config

    def initialize(self, args: dict[str, str]) -> None:
        config, marks = _unmarked(args["model_config"])
        # This stub is one instance: its group, on its device, is the whole config the framework sees.
        kind = {"CPU": KIND_CPU, "GPU": KIND_GPU, "MODEL": KIND_MODEL}[args["model_instance_kind"]]
        device = int(args["model_instance_device_id"])
        del config.instance_group[:]
        group = config.instance_group.add(name=args["model_instance_name"], kind=kind, count=1)
        gpus: tuple[Device, ...] = ()
        npus: tuple[Device, ...] = ()
        if kind == KIND_GPU:
            group.gpus.append(device)
            gpus = (Device("GPU", device),)
        elif kind == KIND_MODEL:
            npus = (Device("NPU", device),)
        devices = DeviceInventory(gpus=gpus, npus=npus)
        backend = BackendRegistry({}).get(marks[BACKEND])
        context = _context(config, marks, devices)
        # The daemon skipped auto-complete for a config that declares its tensors (edged.backends.isolation): the
        # backend's checks of it run here. Such a config comes back unchanged.
        backend.auto_complete_config(config, context, 0)
        self._model = backend.load(config, context)
        (self._instance,) = self._model.instances
        self._name = config.name
        self._version = int(args["model_version"])
        self._batching = config.max_batch_size > 0

    def execute(self, requests: list[Any]) -> list[Any]:
        batch = [self._request(request) for request in requests]
        results = self._instance.execute(batch, ExecutionTiming())
        return [self._response(result) for result in results]

    def finalize(self) -> None:
        self._model.unload()

    def _request(self, request: Any) -> InferRequest:
        inputs = []
        for tensor in request.inputs():
            data = tensor.as_numpy()
            inputs.append(InferInput(tensor.name(), wire_name_for_numpy(data.dtype), tuple(data.shape), data))
        first = inputs[0].shape if inputs else ()
        batch_size = first[0] if self._batching and first else 1
        return InferRequest(self._name, self._version, request.request_id(), inputs, batch_size=batch_size)

    def _response(self, result: InferResponse | EdgedError) -> Any:
        if isinstance(result, EdgedError):
            code = _CODES.get(result.code, pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(result.message, code))
        return pb_utils.InferenceResponse([pb_utils.Tensor(output.name, output.data) for output in result.outputs])
