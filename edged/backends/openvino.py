"""Triton's OpenVINO backend (``backend: "openvino"``): OpenVINO IR (``model.xml`` with its ``model.bin``) and the
other formats OpenVINO reads (ONNX with ``default_model_filename: "model.onnx"``), compiled by OpenVINO for the
device each instance is placed on, in the daemon.

Devices: KIND_CPU instances run on OpenVINO's ``CPU``; KIND_GPU on ``GPU.<id>`` (Intel GPUs, as OpenVINO numbers
them); KIND_MODEL on ``NPU`` where OpenVINO has one, else ``CPU``. Parameters, as Triton's backend: ``NUM_STREAMS``,
``PERFORMANCE_HINT``, ``INFERENCE_NUM_THREADS``, ``COMPILATION_NUM_THREADS``, ``ENABLE_CPU_PINNING``,
``HINT_BF16`` and any other OpenVINO property name are passed to the compilation as they are (OpenVINO refuses what
it does not know, and the model says so); ``SKIP_OV_DYNAMIC_BATCHSIZE`` (``YES``) keeps a model's static first
dimension, which is otherwise made dynamic for batching.

As the ONNX backend: inputs and outputs the config leaves out are filled from the model; requests batched together
are concatenated along dimension 0; a CPU instance counts as a full share of the cores for the dynamic batcher
unless ``INFERENCE_NUM_THREADS`` says how many it uses. OpenVINO comes with the ``openvino`` extra.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from edged.backends.batches import InstancesModel, split, stacked
from edged.core.devices import InstancePlacement, instance_placements
from edged.core.request.datatypes import CONFIG_BY_WIRE_NAME
from edged.errors import EdgedError, ErrorCode, invalid_arg

if TYPE_CHECKING:
    from edged.core.backend_api import LoadContext, ServerApi
    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.stats import ExecutionTiming
    from edged.proto.model_config_pb2 import ModelConfig

_SKIP_DYNAMIC_BATCH: Final = "SKIP_OV_DYNAMIC_BATCHSIZE"
# OpenVINO element types (their names) as KServe wire types.
_WIRE_BY_OV_TYPE: Final = {
    "f32": "FP32", "f16": "FP16", "f64": "FP64", "i8": "INT8", "i16": "INT16", "i32": "INT32", "i64": "INT64",
    "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64", "boolean": "BOOL", "bf16": "BF16",
}  # fmt: skip


def _openvino() -> Any:
    try:
        import openvino
    except ImportError:
        raise EdgedError(
            ErrorCode.UNAVAILABLE,
            "the openvino backend needs OpenVINO, which is not installed: install edged[openvino]",
        ) from None
    return openvino


class OpenVinoBackend:
    def __init__(self, settings: dict[str, str], host: ServerApi | None = None) -> None:
        self._ov = _openvino()
        self._core = self._ov.Core()

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        if config.input and config.output:
            return
        model = self._read(config, context)
        tensors = [*model.inputs, *model.outputs]
        can_batch = all(t.get_partial_shape().rank.get_length() > 0 for t in tensors)
        if config.max_batch_size == 0 and can_batch and default_max_batch_size > 0:
            config.max_batch_size = default_max_batch_size
            if config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        batching = config.max_batch_size > 0
        for declared, actual in ((config.input, model.inputs), (config.output, model.outputs)):
            if declared:
                continue
            for tensor in actual:
                dims = [d.get_length() if d.is_static else -1 for d in tensor.get_partial_shape()]
                entry = declared.add(name=tensor.get_any_name(), data_type=_config_type(config, tensor))
                entry.dims.extend((dims[1:] if batching else dims) or [1])

    def load(self, config: ModelConfig, context: LoadContext) -> InstancesModel[OpenVinoInstance]:
        properties = {key: p.string_value.strip() for key, p in config.parameters.items()}
        skip_dynamic = properties.pop(_SKIP_DYNAMIC_BATCH, "NO").upper() == "YES"
        model = self._read(config, context)
        if config.max_batch_size > 0 and not skip_dynamic:
            model.reshape({tensor: _dynamic_batch(self._ov, tensor) for tensor in model.inputs})
        cores = os.cpu_count() or 1
        threads = properties.get("INFERENCE_NUM_THREADS", "")
        cpu_share = min(int(threads), cores) / cores if threads.isdigit() and int(threads) > 0 else 1.0
        instances = []
        for placement in instance_placements(config, context.devices):
            device = self._device(config, placement)
            try:
                compiled = self._core.compile_model(model, device, properties)
            except RuntimeError as exc:
                why = _first_line(exc)
                raise invalid_arg(f"model '{config.name}': OpenVINO cannot compile it for {device}: {why}") from None
            share = cpu_share if device == "CPU" else 0.0
            instances.append(OpenVinoInstance(placement.name, compiled, config, share))
        return InstancesModel(instances)

    def _read(self, config: ModelConfig, context: LoadContext) -> Any:
        path = context.model_file
        if not path.is_file():
            raise invalid_arg(f"model '{config.name}': no model file {path.name} in its version folder")
        try:
            return self._core.read_model(str(path))
        except RuntimeError as exc:
            raise invalid_arg(f"model '{config.name}': OpenVINO cannot read {path.name}: {_first_line(exc)}") from None

    def _device(self, config: ModelConfig, placement: InstancePlacement) -> str:
        available = self._core.available_devices
        if placement.kind == "GPU":
            name = f"GPU.{placement.device_id}" if f"GPU.{placement.device_id}" in available else "GPU"
            if name not in available:
                raise EdgedError(
                    ErrorCode.UNSUPPORTED,
                    f"model '{config.name}': KIND_GPU, but OpenVINO finds no GPU (devices: {', '.join(available)})",
                )
            return name
        if placement.kind == "MODEL" and "NPU" in available:
            return "NPU"
        return "CPU"


def _dynamic_batch(ov: Any, tensor: Any) -> Any:
    shape = tensor.get_partial_shape()
    dims = [ov.Dimension()] + [shape[i] for i in range(1, shape.rank.get_length())]
    return ov.PartialShape(dims)


def _config_type(config: ModelConfig, tensor: Any) -> int:
    name = tensor.get_element_type().get_type_name()
    wire = _WIRE_BY_OV_TYPE.get(name)
    if wire is None:
        raise EdgedError(ErrorCode.UNSUPPORTED, f"model '{config.name}': unsupported tensor type '{name}'")
    return CONFIG_BY_WIRE_NAME[wire]


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("[")]
    return lines[0] if lines else (text.splitlines()[0] if text else type(exc).__name__)


class OpenVinoInstance:
    def __init__(self, name: str, compiled: Any, config: ModelConfig, cpu_share: float) -> None:
        self._name = name
        self._request = compiled.create_infer_request()
        self._outputs = [output.get_any_name() for output in compiled.outputs]
        self._batching = config.max_batch_size > 0
        self.cpu_share = cpu_share

    @property
    def name(self) -> str:
        return self._name

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        started = time.perf_counter_ns()
        feeds = {tensor.name: stacked(requests, tensor.name) for tensor in requests[0].inputs}
        fed = time.perf_counter_ns()
        try:
            results = self._request.infer(feeds)
        except RuntimeError as exc:
            return [EdgedError(ErrorCode.INTERNAL, f"openvino execute failure: {_first_line(exc)}")] * len(requests)
        ran = time.perf_counter_ns()
        named = {port.get_any_name(): np.array(value) for port, value in results.items()}
        arrays = {name: named[name] for name in self._outputs}
        responses = split(requests, arrays, self._batching)
        timing.input_ns, timing.infer_ns, timing.output_ns = fed - started, ran - fed, time.perf_counter_ns() - ran
        return responses
