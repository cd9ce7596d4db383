"""Triton's TensorRT backend (``platform: "tensorrt_plan"`` / ``backend: "tensorrt"``): serialized TensorRT engines
(``model.plan``), run by TensorRT on NVIDIA GPUs in the daemon.

An engine is built for one GPU model and one TensorRT version (``trtexec --onnx=model.onnx --saveEngine=model.plan``
on the device, or TensorRT's builder API): one built elsewhere fails to load with TensorRT's reason. Instances run
on GPUs only, one execution context and one CUDA stream each, on the GPU their KIND_GPU group names; KIND_CPU and
KIND_MODEL are refused. Where the config leaves out inputs or outputs, they are filled from the engine's I/O
tensors; an engine whose every I/O tensor has a dynamic first dimension batches along it, up to the largest batch
of the instance's optimization profile (``instance_group { profile: [ "1" ] }`` picks one; profile 0 otherwise).
Requests batched together are concatenated along dimension 0, copied to the GPU, run, and the outputs copied back
and split per request.

TensorRT and its CUDA runtime bindings come with the ``tensorrt`` extra (``pip install edged[tensorrt]``: the
``tensorrt`` and ``cuda-python`` packages, which need an NVIDIA driver) and are imported with the first model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from edged.backends.batches import InstancesModel, split, stacked
from edged.core.devices import instance_placements
from edged.core.request.datatypes import CONFIG_BY_WIRE_NAME, WIRE_NAME_BY_CONFIG
from edged.errors import EdgedError, ErrorCode, invalid_arg

if TYPE_CHECKING:
    from edged.core.backend_api import LoadContext, ServerApi
    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.stats import ExecutionTiming
    from edged.proto.model_config_pb2 import ModelConfig

# TensorRT's data types (their names) as KServe wire types: those numpy has too (BF16, FP8 and INT4 tensors at the
# engine's edges are refused; inside the engine they are TensorRT's business).
_WIRE_BY_TRT_TYPE: Final = {
    "FLOAT": "FP32", "HALF": "FP16", "INT8": "INT8", "INT32": "INT32", "INT64": "INT64", "UINT8": "UINT8",
    "BOOL": "BOOL",
}  # fmt: skip
# Parameters of Triton's TensorRT backend that tune what this backend leaves to TensorRT's defaults.
_IGNORED: Final = frozenset({"execution_context_allocation_strategy"})


def _runtime() -> tuple[Any, Any]:
    try:
        import tensorrt
    except ImportError:
        raise EdgedError(
            ErrorCode.UNAVAILABLE,
            "the tensorrt backend needs TensorRT, which is not installed: install edged[tensorrt]",
        ) from None
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:  # cuda-python before 12.6
            from cuda import cudart
        except ImportError:
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                "the tensorrt backend needs CUDA's runtime bindings (cuda-python), which are not installed: "
                "install edged[tensorrt]",
            ) from None
    return tensorrt, cudart


class _Cuda:
    """The few CUDA runtime calls the backend makes, each checked: a failure raises with CUDA's own name of it."""

    def __init__(self, cudart: Any) -> None:
        self._rt = cudart
        self._ok = cudart.cudaError_t.cudaSuccess
        self.to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost

    def call(self, name: str, *args: Any) -> Any:
        result = getattr(self._rt, name)(*args)
        error, rest = result[0], result[1:]
        if error != self._ok:
            _, text = self._rt.cudaGetErrorString(error)
            raise RuntimeError(f"{name}: {text.decode() if isinstance(text, bytes) else text}")
        return rest[0] if len(rest) == 1 else rest


class _Log:
    """TensorRT's logger, keeping its last error for the message a model fails to load with."""

    def __init__(self, trt: Any) -> None:
        logger = self

        class Logger(trt.ILogger):  # type: ignore[misc]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)

            def log(self, severity: Any, message: str) -> None:
                if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                    logger.last_error = message

        self.last_error = ""
        self.logger = Logger()


class TensorRtBackend:
    def __init__(self, settings: dict[str, str], host: ServerApi | None = None) -> None:
        self._trt, cudart = _runtime()
        self._cuda = _Cuda(cudart)
        self._log = _Log(self._trt)
        self._runtime = self._trt.Runtime(self._log.logger)
        # TensorRT's runtime is shared; deserializing engines from several loading threads at once is not documented
        # as safe.
        self._lock = threading.Lock()

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        if config.input and config.output:
            return
        if not context.devices.gpus:
            raise EdgedError(
                ErrorCode.UNSUPPORTED,
                f"model '{config.name}': a TensorRT engine runs on an NVIDIA GPU, and this machine has none",
            )
        engine = self._engine(config, context, context.devices.gpus[0].id)
        tensors = _io_tensors(self._trt, engine)
        largest = _largest_batch(engine, tensors, 0)
        if config.max_batch_size == 0 and largest > 0 and default_max_batch_size > 0:
            config.max_batch_size = min(largest, default_max_batch_size)
            if config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        batching = config.max_batch_size > 0
        for declared, is_input in ((config.input, True), (config.output, False)):
            if declared:
                continue
            for tensor in tensors:
                if tensor.is_input == is_input:
                    entry = declared.add(name=tensor.name, data_type=_config_type(config, tensor.type_name))
                    entry.dims.extend((tensor.shape[1:] if batching else tensor.shape) or [1])

    def load(self, config: ModelConfig, context: LoadContext) -> TensorRtModel:
        unknown = sorted(set(config.parameters) - _IGNORED)
        if unknown:
            raise invalid_arg(f"model '{config.name}': unknown tensorrt parameter(s) {', '.join(unknown)}")
        if not context.model_file.is_file():
            raise invalid_arg(f"model '{config.name}': no model file {context.model_file.name} in its version folder")
        instances: list[TensorRtInstance] = []
        model = TensorRtModel(instances)
        try:
            for placement in instance_placements(config, context.devices):
                if placement.kind != "GPU":
                    raise EdgedError(
                        ErrorCode.UNSUPPORTED,
                        f"model '{config.name}': a TensorRT engine runs on an NVIDIA GPU, not KIND_{placement.kind}: "
                        "use KIND_GPU (on a machine with a GPU, the default)",
                    )
                profile = _profile(config, placement.group)
                engine = self._engine(config, context, placement.device_id)
                tensors = _io_tensors(self._trt, engine)
                _check_config(config, tensors)
                if config.max_batch_size > 0:
                    largest = _largest_batch(engine, tensors, profile)
                    if largest < config.max_batch_size:
                        raise invalid_arg(
                            f"model '{config.name}': max_batch_size {config.max_batch_size} is more than the engine's "
                            f"optimization profile {profile} allows ({largest}, or 0: no dynamic first dimension)"
                        )
                instances.append(
                    TensorRtInstance(placement.name, self._cuda, engine, tensors, placement.device_id, profile, config)
                )
        except BaseException:
            model.unload()
            raise
        return model

    def _engine(self, config: ModelConfig, context: LoadContext, device: int) -> Any:
        with self._lock:
            try:
                self._cuda.call("cudaSetDevice", device)
            except RuntimeError as exc:
                raise EdgedError(ErrorCode.UNAVAILABLE, f"model '{config.name}': GPU {device}: {exc}") from None
            self._log.last_error = ""
            engine = self._runtime.deserialize_cuda_engine(context.model_file.read_bytes())
            if engine is None:
                why = self._log.last_error or "TensorRT could not deserialize it"
                raise invalid_arg(
                    f"model '{config.name}': {context.model_file.name} is not a TensorRT engine for this GPU and "
                    f"TensorRT {self._trt.__version__}: {why}"
                )
            return engine


class _Tensor:
    def __init__(self, name: str, is_input: bool, type_name: str, dtype: Any, shape: list[int]) -> None:
        self.name = name
        self.is_input = is_input
        self.type_name = type_name
        self.dtype = dtype
        self.shape = shape


def _io_tensors(trt: Any, engine: Any) -> list[_Tensor]:
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        data_type = engine.get_tensor_dtype(name)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        try:
            dtype = np.dtype(trt.nptype(data_type))
        except TypeError:  # a type numpy has no dtype for (BF16, FP8): _config_type refuses it
            dtype = np.dtype(np.uint8)
        tensors.append(_Tensor(name, is_input, data_type.name, dtype, list(engine.get_tensor_shape(name))))
    return tensors


def _largest_batch(engine: Any, tensors: Sequence[_Tensor], profile: int) -> int:
    """The largest first dimension every input's optimization profile allows; 0 unless every I/O tensor's first
    dimension is dynamic (an engine that cannot batch)."""
    if not all(tensor.shape and tensor.shape[0] == -1 for tensor in tensors):
        return 0
    largest = [engine.get_tensor_profile_shape(t.name, profile)[2][0] for t in tensors if t.is_input]
    return int(min(largest)) if largest else 0


def _profile(config: ModelConfig, group: int) -> int:
    profiles = list(config.instance_group[group].profile)
    if not profiles:
        return 0
    if not profiles[0].isdigit():
        raise invalid_arg(f"model '{config.name}': optimization profile '{profiles[0]}' is not a number")
    return int(profiles[0])


def _config_type(config: ModelConfig, type_name: str) -> int:
    wire = _WIRE_BY_TRT_TYPE.get(type_name)
    if wire is None:
        raise EdgedError(ErrorCode.UNSUPPORTED, f"model '{config.name}': unsupported tensor type '{type_name}'")
    return CONFIG_BY_WIRE_NAME[wire]


def _check_config(config: ModelConfig, tensors: Sequence[_Tensor]) -> None:
    by_name = {tensor.name: tensor for tensor in tensors}
    for declared, kind in ((config.input, "input"), (config.output, "output")):
        for entry in declared:
            tensor = by_name.get(entry.name)
            if tensor is None or tensor.is_input != (kind == "input"):
                names = ", ".join(t.name for t in tensors if t.is_input == (kind == "input"))
                raise invalid_arg(
                    f"model '{config.name}': unable to find {kind} '{entry.name}' in the engine (its {kind}s: {names})"
                )
            if _config_type(config, tensor.type_name) != entry.data_type:
                raise invalid_arg(
                    f"model '{config.name}': {kind} '{entry.name}' is {WIRE_NAME_BY_CONFIG[entry.data_type]} in the "
                    f"config, {_WIRE_BY_TRT_TYPE[tensor.type_name]} in the engine"
                )


class TensorRtModel(InstancesModel["TensorRtInstance"]):
    def unload(self) -> None:
        for instance in self.instances:
            instance.release()
        super().unload()


class TensorRtInstance:
    def __init__(
        self,
        name: str,
        cuda: _Cuda,
        engine: Any,
        tensors: list[_Tensor],
        device: int,
        profile: int,
        config: ModelConfig,
    ) -> None:
        self._name = name
        self._cuda = cuda
        self._engine = engine  # the execution context needs its engine alive
        self._tensors = tensors
        self._device = device
        self._batching = config.max_batch_size > 0
        self._outputs = [output.name for output in config.output]
        self._context = engine.create_execution_context()
        self._stream = cuda.call("cudaStreamCreate")
        self._handle = int(self._stream)
        if profile:
            self._context.set_optimization_profile_async(profile, self._handle)
        self._buffers: dict[str, tuple[int, int]] = {}  # tensor -> (device pointer, bytes)

    @property
    def name(self) -> str:
        return self._name

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        started = time.perf_counter_ns()
        try:
            # The current device is the calling thread's: the worker pool runs every instance.
            self._cuda.call("cudaSetDevice", self._device)
            feeds = {
                t.name: np.ascontiguousarray(stacked(requests, t.name), t.dtype) for t in self._tensors if t.is_input
            }
            for name, array in feeds.items():
                if not self._context.set_input_shape(name, array.shape):
                    raise RuntimeError(f"input '{name}' of shape {list(array.shape)} is outside the engine's profile")
                pointer = self._buffer(name, array.nbytes)
                self._cuda.call(
                    "cudaMemcpyAsync", pointer, array.ctypes.data, array.nbytes, self._cuda.to_device, self._stream
                )
            outputs: dict[str, np.ndarray[Any, Any]] = {}
            for tensor in self._tensors:
                if not tensor.is_input:
                    shape = tuple(self._context.get_tensor_shape(tensor.name))
                    outputs[tensor.name] = np.empty(shape, tensor.dtype)
                    self._buffer(tensor.name, outputs[tensor.name].nbytes)
            for name, (pointer, _) in self._buffers.items():
                self._context.set_tensor_address(name, pointer)
            fed = time.perf_counter_ns()
            if not self._context.execute_async_v3(self._handle):
                raise RuntimeError("TensorRT could not enqueue the execution")
            for name, array in outputs.items():
                pointer = self._buffers[name][0]
                self._cuda.call(
                    "cudaMemcpyAsync", array.ctypes.data, pointer, array.nbytes, self._cuda.to_host, self._stream
                )
            self._cuda.call("cudaStreamSynchronize", self._stream)
            ran = time.perf_counter_ns()
        except RuntimeError as exc:
            return [EdgedError(ErrorCode.INTERNAL, f"tensorrt execute failure: {exc}")] * len(requests)
        responses = split(requests, {name: outputs[name] for name in self._outputs}, self._batching)
        timing.input_ns, timing.infer_ns, timing.output_ns = fed - started, ran - fed, time.perf_counter_ns() - ran
        return responses

    def _buffer(self, name: str, size: int) -> int:
        """The tensor's device memory, grown to ``size`` bytes (kept for the next batch)."""
        pointer, capacity = self._buffers.get(name, (0, 0))
        if capacity >= max(size, 1):
            return pointer
        if pointer:
            self._cuda.call("cudaFree", pointer)
        pointer = int(self._cuda.call("cudaMalloc", max(size, 1)))
        self._buffers[name] = (pointer, max(size, 1))
        return pointer

    def release(self) -> None:
        """Frees the instance's device memory and stream (the model is unloading: nothing executes)."""
        try:
            self._cuda.call("cudaSetDevice", self._device)
            for pointer, _ in self._buffers.values():
                self._cuda.call("cudaFree", pointer)
            self._cuda.call("cudaStreamDestroy", self._stream)
        except RuntimeError:
            pass  # a GPU that failed: its memory went with it
        self._buffers = {}
        self._context = None
