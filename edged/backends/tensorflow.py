"""Triton's TensorFlow backend for SavedModels (``platform: "tensorflow_savedmodel"``, ``model.savedmodel/`` in
the version folder), run by TensorFlow's CPU build in the daemon.

As Triton's backend: the signature is ``TF_SIGNATURE_DEF`` (``serving_default`` unless set) of the MetaGraph tagged
``TF_GRAPH_TAG`` (``serve`` unless set); the config's inputs and outputs are the signature's input and output keys,
and a config that leaves them out is filled from the signature (batching when every tensor's first dimension is
unknown). Requests batched together are concatenated along dimension 0 and their outputs split back. Instances have
Triton's names; KIND_GPU instances run on ``/GPU:<id>`` where the installed TensorFlow has GPUs (the CPU build has
none, and refuses them with that reason).

TensorFlow comes with the ``tensorflow`` extra (``pip install edged[tensorflow]``, the CPU build) and is imported
with the first SavedModel; its own C++ logging below errors is silenced unless ``TF_CPP_MIN_LOG_LEVEL`` is set.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from edged.backends.batches import InstancesModel, split, stacked
from edged.core.devices import instance_placements
from edged.core.request.datatypes import CONFIG_BY_WIRE_NAME
from edged.errors import EdgedError, ErrorCode, invalid_arg

if TYPE_CHECKING:
    from edged.core.backend_api import LoadContext, ServerApi
    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.stats import ExecutionTiming
    from edged.proto.model_config_pb2 import ModelConfig

_KNOWN: Final = frozenset({"TF_SIGNATURE_DEF", "TF_GRAPH_TAG"})
_WIRE_BY_TF_TYPE: Final = {
    "float32": "FP32", "float16": "FP16", "float64": "FP64", "int8": "INT8", "int16": "INT16", "int32": "INT32",
    "int64": "INT64", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL",
    "string": "BYTES",
}  # fmt: skip


def _tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow
    except ImportError:
        raise EdgedError(
            ErrorCode.UNAVAILABLE,
            "the tensorflow backend needs TensorFlow, which is not installed: install edged[tensorflow]",
        ) from None
    return tensorflow


class TensorFlowBackend:
    def __init__(self, settings: dict[str, str], host: ServerApi | None = None) -> None:
        self._tf = _tensorflow()

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        if config.input and config.output:
            return
        signature = self._signature(config, context)
        inputs = signature.structured_input_signature[1]
        outputs = signature.structured_outputs
        specs = [*inputs.values(), *outputs.values()]
        can_batch = all(spec.shape.rank and spec.shape[0] is None for spec in specs)
        if config.max_batch_size == 0 and can_batch and default_max_batch_size > 0:
            config.max_batch_size = default_max_batch_size
            if config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        batching = config.max_batch_size > 0
        for declared, actual in ((config.input, inputs), (config.output, outputs)):
            if declared:
                continue
            for name in sorted(actual):
                spec = actual[name]
                dims = [-1 if d is None else int(d) for d in spec.shape]
                entry = declared.add(name=name, data_type=_config_type(config, spec.dtype.name))
                entry.dims.extend((dims[1:] if batching else dims) or [1])

    def load(self, config: ModelConfig, context: LoadContext) -> InstancesModel[TensorFlowInstance]:
        signature = self._signature(config, context)
        inputs = signature.structured_input_signature[1]
        outputs = signature.structured_outputs
        for tensors, have, side in ((config.input, inputs, "input"), (config.output, outputs, "output")):
            for tensor in tensors:
                if tensor.name not in have:
                    raise invalid_arg(
                        f"model '{config.name}': {side} '{tensor.name}' is not in the signature's {side}s "
                        f"({', '.join(sorted(have))})"
                    )
        instances = []
        for placement in instance_placements(config, context.devices):
            device = "/CPU:0"
            if placement.kind == "GPU":
                gpus = self._tf.config.list_physical_devices("GPU")
                if placement.device_id >= len(gpus):
                    raise EdgedError(
                        ErrorCode.UNSUPPORTED,
                        f"model '{config.name}': KIND_GPU on GPU {placement.device_id}, but this TensorFlow sees "
                        f"{len(gpus)} GPU(s) (tensorflow-cpu sees none: install a CUDA build of TensorFlow)",
                    )
                device = f"/GPU:{placement.device_id}"
            instances.append(TensorFlowInstance(placement.name, self._tf, signature, config, device))
        return InstancesModel(instances)

    def _signature(self, config: ModelConfig, context: LoadContext) -> Any:
        values = {key: parameter.string_value.strip() for key, parameter in config.parameters.items()}
        unknown = sorted(set(values) - _KNOWN)
        if unknown:
            raise invalid_arg(f"model '{config.name}': unknown tensorflow parameter(s) {', '.join(unknown)}")
        if config.platform == "tensorflow_graphdef":
            raise EdgedError(
                ErrorCode.UNSUPPORTED,
                f"model '{config.name}': TensorFlow GraphDef models are not served; save the model as a SavedModel",
            )
        path = context.model_file
        if not path.is_dir():
            raise invalid_arg(f"model '{config.name}': no SavedModel folder {path.name} in its version folder")
        tag = values.get("TF_GRAPH_TAG", "serve")
        try:
            loaded = self._tf.saved_model.load(str(path), tags=[tag])
        except (OSError, ValueError, RuntimeError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise invalid_arg(f"model '{config.name}': {path.name} is not a SavedModel: {reason}") from None
        name = values.get("TF_SIGNATURE_DEF", "serving_default")
        if name not in loaded.signatures:
            have = ", ".join(loaded.signatures) or "none"
            raise invalid_arg(f"model '{config.name}': no signature '{name}' in {path.name} ({have})")
        return loaded.signatures[name]


def _config_type(config: ModelConfig, dtype: str) -> int:
    wire = _WIRE_BY_TF_TYPE.get(dtype)
    if wire is None:
        raise EdgedError(ErrorCode.UNSUPPORTED, f"model '{config.name}': unsupported tensor type '{dtype}'")
    return CONFIG_BY_WIRE_NAME[wire]


class TensorFlowInstance:
    def __init__(self, name: str, tf: Any, signature: Any, config: ModelConfig, device: str) -> None:
        self._name = name
        self._device = device
        self._tf = tf
        self._signature = signature
        self._outputs = [output.name for output in config.output]
        self._batching = config.max_batch_size > 0

    @property
    def name(self) -> str:
        return self._name

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        tf = self._tf
        started = time.perf_counter_ns()
        with tf.device(self._device):
            feeds = {tensor.name: tf.constant(stacked(requests, tensor.name)) for tensor in requests[0].inputs}
            fed = time.perf_counter_ns()
            try:
                results = self._signature(**feeds)
            except (tf.errors.OpError, ValueError, TypeError) as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                return [EdgedError(ErrorCode.INTERNAL, f"tensorflow execute failure: {reason}")] * len(requests)
        ran = time.perf_counter_ns()
        arrays = {name: results[name].numpy() for name in self._outputs}
        responses = split(requests, arrays, self._batching)
        timing.input_ns, timing.infer_ns, timing.output_ns = fed - started, ran - fed, time.perf_counter_ns() - ran
        return responses
