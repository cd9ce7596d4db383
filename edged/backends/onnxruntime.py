"""ONNX Runtime: one InferenceSession per model instance, run in-process.

ONNX Runtime releases the GIL inside ``run``, so sessions of different instances execute in parallel on the
scheduler's worker threads while the event loop keeps serving.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from edged.backends.ragged import batch_inputs, concatenate, ragged_inputs, scatter, scattered_outputs
from edged.core.devices import InstancePlacement, instance_placements
from edged.core.request.datatypes import CONFIG_BY_WIRE_NAME, WIRE_NAME_BY_CONFIG
from edged.core.request.inference import InferOutput, InferResponse
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.core.backend_api import LoadContext, ServerApi
    from edged.core.request.inference import InferRequest
    from edged.core.stats import ExecutionTiming
    from edged.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

log = logging.getLogger(__name__)

# ONNX Runtime's element type strings -> the protocol's datatype names.
_WIRE_BY_ORT_TYPE: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}
# optimization.execution_accelerators names -> ONNX Runtime execution providers.
_PROVIDER_BY_ACCELERATOR: dict[str, str] = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
}
# optimization.graph.level as Triton's onnxruntime backend reads it.
# (any other level means ORT_ENABLE_ALL, ONNX Runtime's default).
_GRAPH_LEVELS: dict[int, ort.GraphOptimizationLevel] = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}
KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL = 0, 1, 2, 3


def _is_dynamic(dim: Any) -> bool:
    return not isinstance(dim, int) or dim < 0


def _dims(shape: Sequence[Any]) -> list[int]:
    return [-1 if _is_dynamic(d) else int(d) for d in shape]


class OnnxRuntimeBackend:
    def __init__(self, backend_config: dict[str, str], host: ServerApi | None) -> None:
        # Its settings come from each model's config (parameters, optimization); its models call no other.
        del backend_config, host

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        """Triton's onnxruntime rules: batching when every model tensor has a variable first dimension; the
        side (inputs or outputs) the config leaves empty is filled from the graph; a given side is only checked."""
        if (config.input or config.batch_input) and config.output:
            log.info(
                "skipping model configuration auto-complete for '%s': inputs and outputs already specified",
                config.name,
            )
            return
        session = _open_session(context, ort.SessionOptions(), ["CPUExecutionProvider"])
        inputs, outputs = session.get_inputs(), session.get_outputs()
        can_batch = all(len(t.shape) > 0 and _is_dynamic(t.shape[0]) for t in [*inputs, *outputs])
        if can_batch:
            if config.max_batch_size == 0:
                config.max_batch_size = max(default_max_batch_size, 0)
                log.warning(
                    "autofilled max_batch_size to %d for model '%s' since batching is supported but no "
                    "max_batch_size is specified in model configuration",
                    config.max_batch_size,
                    config.name,
                )
            if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        elif config.max_batch_size != 0:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"autofill failed for model '{config.name}': model does not support batching while non-zero "
                "max_batch_size is specified",
            )
        batching = config.max_batch_size > 0
        for declared, actual in ((config.input, inputs), (config.output, outputs)):
            if declared:
                continue
            for tensor in actual:
                entry = declared.add(name=tensor.name, data_type=_config_type(context, tensor.type))
                dims = _dims(tensor.shape[1:] if batching else tensor.shape)
                entry.dims.extend(dims or [1])
                if not dims and batching:
                    # A per-item scalar: [1] in the config, reshaped to no dimensions for the model.
                    entry.reshape.SetInParent()

    def load(self, config: ModelConfig, context: LoadContext) -> OnnxRuntimeModel:
        model = OnnxRuntimeModel(config, context)
        model.resize(config, context)
        return model


class OnnxRuntimeModel:
    def __init__(self, config: ModelConfig, context: LoadContext) -> None:
        self._options = _session_options(config)
        self._config = config
        self._context = context
        self._instances: list[OnnxRuntimeInstance] = []

    @property
    def instances(self) -> Sequence[OnnxRuntimeInstance]:
        return self._instances

    def resize(
        self, config: ModelConfig, context: LoadContext
    ) -> tuple[list[OnnxRuntimeInstance], list[OnnxRuntimeInstance]]:
        """Open a session for each instance the config's groups ask for that does not exist yet (by Triton's
        instance name), and let go of those it no longer asks for: (added, removed). Blocking."""
        unused = list(self._instances)
        kept: list[OnnxRuntimeInstance] = []
        added: list[OnnxRuntimeInstance] = []
        for placement in instance_placements(config, context.devices):
            same = next((instance for instance in unused if instance.placement == placement), None)
            if same is not None:
                unused.remove(same)
                kept.append(same)
                continue
            group = config.instance_group[placement.group]
            providers = _providers(config, group, placement.device_id)
            session = _open_session(context, self._options, providers)
            if not self._instances and not added:
                _check_io(config, context, session)
            added.append(OnnxRuntimeInstance(placement, group.name, config, session))
        self._instances = kept + added
        self._config = config
        return added, unused

    def finish_resize(self) -> None:
        """Removed instances are idle by now; their sessions go with the last reference."""

    def unload(self) -> None:
        # Sessions free their memory when the last reference goes; dropping ours is the whole unload.
        self._instances = []


class OnnxRuntimeInstance:
    def __init__(
        self, placement: InstancePlacement, group: str, config: ModelConfig, session: ort.InferenceSession
    ) -> None:
        self.placement = placement
        self._name = placement.name
        self.group = group
        self._session = session
        # What the dynamic batcher counts (edged.core.backend_api.BackendInstance): a GPU or NPU run keeps no core.
        self.cpu_share = _cpu_share(session.get_session_options()) if placement.kind == "CPU" else 0.0
        self._model_name = config.name
        self._batching = config.max_batch_size > 0
        self._output_types = {o.name: WIRE_NAME_BY_CONFIG[o.data_type] for o in config.output}
        self._all_outputs = [o.name for o in config.output]
        # Implicit state of a sequence model: always computed, for the sequence batcher to carry forward.
        self._state_outputs = [s.output_name for s in config.sequence_batching.state]
        self._output_types.update(
            {s.output_name: WIRE_NAME_BY_CONFIG[s.data_type] for s in config.sequence_batching.state}
        )
        self._reshape_in = {i.name: tuple(i.reshape.shape) for i in config.input if i.HasField("reshape")}
        self._reshape_out = {o.name: tuple(o.reshape.shape) for o in config.output if o.HasField("reshape")}
        self._dims_out = {o.name: tuple(o.dims) for o in config.output}
        bf16 = CONFIG_BY_WIRE_NAME["BF16"]
        self._bf16 = {t.name for t in [*config.input, *config.output] if t.data_type == bf16}
        # Ragged batches (edged.backends.ragged): inputs fed flattened, outputs split by a source input's shapes,
        # and the batch inputs that tell the model where each request's part starts.
        self._config = config
        self._ragged = ragged_inputs(config)
        self._scattered = scattered_outputs(config)
        self._whole_batch_only = bool(self._ragged or self._scattered or config.batch_input)

    @property
    def name(self) -> str:
        return self._name

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        try:
            return self._execute(requests, timing)
        except EdgedError as exc:
            return [exc] * len(requests)
        except Exception as exc:  # ONNX Runtime raises its own exception types for run-time failures
            error = EdgedError(ErrorCode.INTERNAL, f"onnx runtime error: {_first_line(exc)}")
            return [error] * len(requests)

    def _execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        started = time.perf_counter_ns()
        if len(requests) == 1 and not self._whole_batch_only:
            request = requests[0]
            total = request.batch_size
            feeds = {t.name: self._feed(t.name, t.data, total) for t in request.inputs}
        else:
            # Requests of one batch have the same inputs and non-batch shapes (the batcher guarantees it, ragged
            # inputs excepted), so their tensors concatenate along the batch dimension; this copy is the price of
            # one run for many requests.
            total = sum(r.batch_size for r in requests)
            feeds = {
                tensor.name: self._feed(
                    tensor.name,
                    concatenate([r.inputs[i].data for r in requests])
                    if tensor.name in self._ragged
                    else np.concatenate([r.inputs[i].data for r in requests]),
                    total,
                )
                for i, tensor in enumerate(requests[0].inputs)
            }
            feeds.update(batch_inputs(self._config, requests))
        names = self._output_names(requests)
        fed = time.perf_counter_ns()
        results = self._run(names, feeds, _terminate_when_all_cancelled(requests))
        ran = time.perf_counter_ns()
        scattered = {
            name: scatter(array, requests, self._scattered[name])
            for name, array in zip(names, results, strict=True)
            if name in self._scattered
        }
        responses: list[InferResponse | EdgedError] = []
        start = 0
        for index, request in enumerate(requests):
            end = start + request.batch_size
            # A single request takes the arrays whole (no slicing, so batch-less models work too).
            outputs = [
                self._output(
                    name,
                    scattered[name][index] if name in scattered else array if len(requests) == 1 else array[start:end],
                    request.batch_size,
                )
                for name, array in zip(names, results, strict=True)
            ]
            responses.append(InferResponse(request.model_name, str(request.model_version), request.id, outputs))
            start = end
        timing.input_ns, timing.infer_ns, timing.output_ns = fed - started, ran - fed, time.perf_counter_ns() - ran
        return responses

    def _run(self, names: list[str], feeds: dict[str, np.ndarray[Any, Any]], options: ort.RunOptions) -> list[Any]:
        if not self._bf16:
            return list(self._session.run(names, feeds, options))
        # numpy has no bfloat16: BF16 tensors travel as their uint16 bits and cross into onnxruntime as OrtValues
        # typed BFLOAT16, which plain ``run`` cannot take or return.
        values = {
            name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(array), _ONNX_BFLOAT16)
            if name in self._bf16
            else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
            for name, array in feeds.items()
        }
        results = self._session.run_with_ort_values(names, values, options)
        return [
            _bf16_bits(value) if name in self._bf16 else value.numpy()
            for name, value in zip(names, results, strict=True)
        ]

    def _output_names(self, requests: Sequence[InferRequest]) -> list[str]:
        wanted: list[str] = []
        for request in requests:
            if request.outputs is None:
                return self._all_outputs + self._state_outputs
            wanted.extend(o.name for o in request.outputs if o.name not in wanted)
        return wanted + [name for name in self._state_outputs if name not in wanted]

    def _feed(self, name: str, data: np.ndarray[Any, Any] | None, batch_size: int) -> np.ndarray[Any, Any]:
        assert data is not None  # validation decodes every input before scheduling
        if data.dtype == np.object_:
            data = _utf8_strings(name, data)
        shape = self._reshape_in.get(name)
        if shape is not None:
            data = data.reshape(((batch_size,) if self._batching else ()) + shape)
        return data

    def _output(self, name: str, array: Any, batch_size: int) -> InferOutput:
        datatype = self._output_types.get(name, "")
        if datatype == "BYTES":
            array = np.array(
                [s.encode("utf-8") if isinstance(s, str) else s for s in array.ravel()], dtype=np.object_
            ).reshape(array.shape)
        if name in self._reshape_out:
            array = array.reshape(((batch_size,) if self._batching else ()) + self._dims_out[name])
        return InferOutput(name, datatype, tuple(array.shape), array)


def _terminate_when_all_cancelled(requests: Sequence[InferRequest]) -> ort.RunOptions:
    """Run options that stop the execution once every request in it was cancelled (the clients went away).

    The cancellation arrives on the event loop while the run is on a worker thread; onnxruntime's terminate flag
    is made to be set from another thread.
    """
    options = ort.RunOptions()
    remaining = [len(requests)]

    def cancelled() -> None:
        remaining[0] -= 1
        if remaining[0] == 0:
            options.terminate = True

    for request in requests:
        request.on_cancel(cancelled)
    return options


# onnx.TensorProto.BFLOAT16
_ONNX_BFLOAT16 = 16


def _bf16_bits(value: ort.OrtValue) -> np.ndarray[Any, Any]:
    """A BF16 OrtValue's elements as uint16 bits (copied: the OrtValue owns its buffer)."""
    shape = tuple(value.shape())
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype=np.uint16)
    buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(buffer, dtype=np.uint16).copy().reshape(shape)


def _utf8_strings(name: str, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    # onnxruntime's Python binding takes string tensors as str objects (bytes would be stored as their repr).
    out = np.empty(data.shape, dtype=np.object_)
    flat_in, flat_out = data.ravel(), out.ravel()
    try:
        for i, item in enumerate(flat_in):
            flat_out[i] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    except UnicodeDecodeError:
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"input '{name}' holds bytes that are not UTF-8, which onnxruntime cannot take",
        ) from None
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _config_type(context: LoadContext, ort_type: str) -> int:
    wire = _WIRE_BY_ORT_TYPE.get(ort_type)
    if wire is None:
        raise EdgedError(ErrorCode.UNSUPPORTED, f"unsupported tensor type '{ort_type}' in model '{context.model_name}'")
    return CONFIG_BY_WIRE_NAME[wire]


def _open_session(context: LoadContext, options: ort.SessionOptions, providers: list[Any]) -> ort.InferenceSession:
    path = context.model_file
    if path.is_dir():
        path = path / "model.onnx"
    if not path.is_file():
        raise EdgedError(
            ErrorCode.UNAVAILABLE,
            f"unable to find '{context.model_file.name}' for version {context.version} of model '{context.model_name}'",
        )
    try:
        return ort.InferenceSession(os.fspath(path), options, providers=providers)
    except Exception as exc:  # onnxruntime reports invalid graphs as several exception types
        # onnxruntime names the file by its absolute path; clients see it relative to the model folder.
        detail = _first_line(exc).replace(str(context.model_dir) + "/", "")
        raise EdgedError(
            ErrorCode.INVALID_ARG, f"onnx runtime error loading model '{context.model_name}': {detail}"
        ) from None


def _cpu_share(options: ort.SessionOptions) -> float:
    """The share of the cores one run of a CPU session keeps busy: its intra-op threads (by default one per core,
    as ONNX Runtime and Triton start it) over the cores this process may use."""
    cores = len(os.sched_getaffinity(0)) or 1
    threads = options.intra_op_num_threads or cores
    return min(1.0, threads / cores)


def _session_options(config: ModelConfig) -> ort.SessionOptions:
    options = ort.SessionOptions()
    params = {key: value.string_value for key, value in config.parameters.items()}
    # onnxruntime's pool threads spin after each run by default. On a device of a few cores that spinning takes
    # the cores the event loop and the other instances need (on 2 cores it halved ResNet-50 throughput with two
    # instances), so edged turns it off unless a model's config asks for it.
    for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
        options.add_session_config_entry(key, params.get(key, "0"))
    for key, value in params.items():
        if key.startswith("session.") and not key.endswith(".allow_spinning"):
            options.add_session_config_entry(key, value)
    try:
        if "intra_op_thread_count" in params:
            options.intra_op_num_threads = int(params["intra_op_thread_count"])
        if "inter_op_thread_count" in params:
            options.inter_op_num_threads = int(params["inter_op_thread_count"])
        mode = params.get("execution_mode", "0")
        if mode not in ("0", "1"):
            raise ValueError(f"execution_mode must be 0 or 1 but got {mode}")
        if mode == "1":
            options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        if "enable_mem_arena" in params:
            options.enable_cpu_mem_arena = params["enable_mem_arena"] not in ("0", "false")
    except ValueError as exc:
        raise EdgedError(ErrorCode.INVALID_ARG, f"invalid onnxruntime parameter for '{config.name}': {exc}") from None
    if config.optimization.HasField("graph"):
        options.graph_optimization_level = _GRAPH_LEVELS.get(
            config.optimization.graph.level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        )
    return options


def _providers(config: ModelConfig, group: ModelInstanceGroup, device_id: int) -> list[Any]:
    available = set(ort.get_available_providers())
    providers: list[Any] = []
    accelerators = config.optimization.execution_accelerators
    if group.kind == KIND_GPU:
        for accelerator in accelerators.gpu_execution_accelerator:
            providers.append(_accelerator(config, accelerator.name, available, device_id))
        if "CUDAExecutionProvider" not in available:
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                f"instance group '{group.name}' of model '{config.name}' asks for KIND_GPU, but this device "
                "has no CUDA-capable onnxruntime (CUDAExecutionProvider is not available)",
            )
        if not any(p[0] == "CUDAExecutionProvider" for p in providers):
            providers.append(("CUDAExecutionProvider", {"device_id": device_id}))
    else:
        for accelerator in accelerators.cpu_execution_accelerator:
            providers.append(_accelerator(config, accelerator.name, available, device_id))
    providers.append(("CPUExecutionProvider", {}))
    return providers


def _accelerator(config: ModelConfig, name: str, available: set[str], device_id: int) -> tuple[str, dict[str, Any]]:
    provider = _PROVIDER_BY_ACCELERATOR.get(name)
    if provider is None:
        raise EdgedError(ErrorCode.INVALID_ARG, f"unknown Execution Accelerator '{name}' is requested")
    if provider not in available:
        raise EdgedError(
            ErrorCode.UNAVAILABLE,
            f"execution accelerator '{name}' of model '{config.name}' needs onnxruntime's {provider}, which is "
            "not available on this device",
        )
    options: dict[str, Any] = {"device_id": device_id} if provider != "OpenVINOExecutionProvider" else {}
    return provider, options


def _check_io(config: ModelConfig, context: LoadContext, session: ort.InferenceSession) -> None:
    """The config must agree with the graph on names, types and dimensions, or requests would fail one by one."""
    model = context.model_name
    inputs, outputs = session.get_inputs(), session.get_outputs()
    required = len([t for t in config.input if not t.optional])
    # A sequence model's graph also takes the control inputs and state inputs the sequence batcher fills.
    sequences = config.sequence_batching
    extra = len([c.name for c in sequences.control_input]) + len(sequences.state)
    extra += sum(len(spec.target_name) for spec in config.batch_input)
    if not required <= len(inputs) <= len(config.input) + extra:
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"unable to load model '{model}', configuration expects {required} inputs, model provides {len(inputs)}",
        )
    batching = config.max_batch_size > 0
    # Ragged inputs and scattered outputs are flat in the graph: no batch dimension before the config's dims.
    flat = ragged_inputs(config) | set(scattered_outputs(config))
    for kind, declared, actual in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {t.name: t for t in actual}
        for tensor in declared:
            found = by_name.get(tensor.name)
            if found is None:
                allowed = ", ".join(sorted(by_name))
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"unexpected inference {kind} '{tensor.name}', allowed {kind}s are: {allowed}",
                )
            model_type = _config_type(context, found.type)
            if model_type != tensor.data_type:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"unable to load model '{model}', configuration expects datatype "
                    f"{_type_name(tensor.data_type)} for {kind} '{tensor.name}', model provides "
                    f"{_type_name(model_type)}",
                )
            config_dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
            batched = batching and tensor.name not in flat
            _compare_dims(model, tensor.name, _dims(found.shape), config_dims, batched, exact=kind == "output")


def _compare_dims(
    model: str, tensor: str, model_dims: list[int], config_dims: list[int], batching: bool, *, exact: bool
) -> None:
    if not model_dims:
        return  # scalars are checked by element count at run time
    shape = _shape_text(model_dims)
    if batching:
        if model_dims[0] != -1:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"model '{model}', tensor '{tensor}': for the model to support batching the shape should have at "
                f"least 1 dimension and the first dimension must be -1; but shape expected by the model is {shape}",
            )
        full = [-1, *config_dims]
        detail = (
            "an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
            f"complete shape {_shape_text(full)}"
        )
    else:
        full = config_dims
        detail = f"shape {_shape_text(full)}"
    same = len(full) == len(model_dims) and all(
        m == c or (not exact and m == -1) for m, c in zip(model_dims, full, strict=True)
    )
    if not same:
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"model '{model}', tensor '{tensor}': the model expects {len(model_dims)} dimensions (shape {shape}) "
            f"but the model configuration specifies {len(full)} dimensions ({detail})",
        )


def _shape_text(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _type_name(config_type: int) -> str:
    wire = WIRE_NAME_BY_CONFIG.get(config_type, "INVALID")
    return "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"
