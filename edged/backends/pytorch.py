"""Triton's PyTorch backend (``platform: "pytorch_libtorch"`` / ``backend: "pytorch"``) for TorchScript models
(``model.pt``), run by PyTorch in the daemon.

Names follow Triton's backend: an input named ``<anything>__<i>`` is the forward method's argument ``i``, any other
name must be the name of a forward argument; when every output is named ``<anything>__<i>``, output ``i`` of what
forward returns goes to it, otherwise the outputs are taken in the config's order. Requests batched together are
concatenated along dimension 0 and the outputs split back. The sequence batcher's control inputs (START, END, READY,
CORRID) are inputs like the others, named in the same way.

Parameters, as Triton's: ``INFERENCE_MODE`` (``torch.inference_mode``, on unless "false"),
``DISABLE_OPTIMIZED_EXECUTION`` (runs without TorchScript's profiling optimizer), ``INTRA_OP_THREAD_COUNT`` and
``INTER_OP_THREAD_COUNT`` (PyTorch's thread pools, which are the process's: the last model loaded sets them, as in
Triton), and ``ENABLE_*`` switches of the CUDA fuser and the JIT executor that PyTorch no longer has or that have
no effect on the CPU (accepted, ignored). KIND_GPU instances run on ``cuda:<id>`` where PyTorch has CUDA.

PyTorch comes with the ``pytorch`` extra (``pip install edged[pytorch]``) and is imported with the first model
that needs it. A run releases the GIL in PyTorch's operators.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from edged.backends.batches import InstancesModel, split, stacked
from edged.core.devices import instance_placements
from edged.errors import EdgedError, ErrorCode, invalid_arg

if TYPE_CHECKING:
    from edged.core.backend_api import LoadContext, ServerApi
    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.stats import ExecutionTiming
    from edged.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

_INDEXED: Final = re.compile(r"^.+__(\d+)$")
_IGNORED: Final = frozenset(
    {"ENABLE_NVFUSER", "ENABLE_JIT_EXECUTOR", "ENABLE_JIT_PROFILING", "ENABLE_TENSOR_FUSER", "ENABLE_CACHE_CLEANING"}
    | {"ENABLE_WEIGHT_SHARING", "ENABLE_CUDA_GRAPH"}
)
_KNOWN: Final = _IGNORED | {"INFERENCE_MODE", "DISABLE_OPTIMIZED_EXECUTION"}
_KNOWN_THREADS: Final = frozenset({"INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT"})


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise EdgedError(
            ErrorCode.UNAVAILABLE, "the pytorch backend needs PyTorch, which is not installed: install edged[pytorch]"
        ) from None
    return torch


class PyTorchBackend:
    def __init__(self, settings: dict[str, str], host: ServerApi | None = None) -> None:
        self._torch = _torch()

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        # TorchScript keeps no shapes or types of its arguments: the config names them, as Triton requires.
        if not config.input or not config.output:
            raise invalid_arg(f"model '{config.name}': a pytorch model's config must list its inputs and outputs")

    def load(self, config: ModelConfig, context: LoadContext) -> InstancesModel[PyTorchInstance]:
        torch = self._torch
        options = _options(config)
        if not context.model_file.is_file():
            raise invalid_arg(f"model '{config.name}': no model file {context.model_file.name} in its version folder")
        if "INTRA_OP_THREAD_COUNT" in options:
            torch.set_num_threads(options["INTRA_OP_THREAD_COUNT"])
        if "INTER_OP_THREAD_COUNT" in options:
            # PyTorch fixes its inter-op pool at its first parallel work: a later model cannot change it.
            with contextlib.suppress(RuntimeError):
                torch.set_num_interop_threads(options["INTER_OP_THREAD_COUNT"])
        instances = []
        for placement in instance_placements(config, context.devices):
            if placement.kind == "GPU":
                if not torch.cuda.is_available():
                    raise EdgedError(
                        ErrorCode.UNSUPPORTED, f"model '{config.name}': KIND_GPU, but this PyTorch has no CUDA device"
                    )
                device = torch.device(f"cuda:{placement.device_id}")
            else:
                device = torch.device("cpu")
            try:
                module = torch.jit.load(str(context.model_file), map_location=device)
            except (RuntimeError, ValueError) as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise invalid_arg(
                    f"model '{config.name}': {context.model_file.name} is not a TorchScript model: {reason}"
                ) from None
            module.eval()
            instances.append(PyTorchInstance(placement.name, torch, module, device, config, options))
        return InstancesModel(instances)


def _options(config: ModelConfig) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, parameter in config.parameters.items():
        value = parameter.string_value.strip()
        if key in _KNOWN_THREADS:
            if not value.isdigit() or int(value) < 1:
                raise invalid_arg(f"model '{config.name}': {key} must be a positive integer, not '{value}'")
            options[key] = int(value)
        elif key in _KNOWN:
            if value.lower() not in ("true", "false"):
                raise invalid_arg(f"model '{config.name}': {key} must be 'true' or 'false', not '{value}'")
            options[key] = value.lower() == "true"
        else:
            raise invalid_arg(f"model '{config.name}': unknown pytorch parameter '{key}'")
    return options


class PyTorchInstance:
    def __init__(
        self, name: str, torch: Any, module: Any, device: Any, config: ModelConfig, options: dict[str, Any]
    ) -> None:
        self._name = name
        self._torch = torch
        self._module = module
        self._device = device
        self._inference_mode = options.get("INFERENCE_MODE", True)
        self._optimized = not options.get("DISABLE_OPTIMIZED_EXECUTION", False)
        self._batching = config.max_batch_size > 0
        self._arguments = _argument_order(config, module)
        outputs = [output.name for output in config.output]
        indexed = [_INDEXED.match(name) for name in outputs]
        order = [int(match.group(1)) for match in indexed if match] if all(indexed) else list(range(len(outputs)))
        self._outputs = list(zip(order, outputs, strict=True))

    @property
    def name(self) -> str:
        return self._name

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        torch = self._torch
        started = time.perf_counter_ns()
        try:
            arguments = [self._argument(requests, name) for name in self._arguments]
            fed = time.perf_counter_ns()
            with torch.inference_mode(self._inference_mode), torch.jit.optimized_execution(self._optimized):
                result = self._module(*arguments)
            ran = time.perf_counter_ns()
            results = result if isinstance(result, (tuple, list)) else (result,)
            arrays = {name: results[index].detach().cpu().numpy() for index, name in self._outputs}
        except EdgedError as exc:
            return [exc] * len(requests)
        except (RuntimeError, IndexError, TypeError, ValueError) as exc:  # what TorchScript raises at run time
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return [EdgedError(ErrorCode.INTERNAL, f"pytorch execute failure: {reason}")] * len(requests)
        responses = split(requests, arrays, self._batching)
        timing.input_ns, timing.infer_ns, timing.output_ns = fed - started, ran - fed, time.perf_counter_ns() - ran
        return responses

    def _argument(self, requests: Sequence[InferRequest], name: str) -> Any:
        data = stacked(requests, name)
        if data.dtype == np.object_:
            raise EdgedError(ErrorCode.UNSUPPORTED, f"input '{name}': the pytorch backend takes no BYTES tensors")
        if not data.flags.writeable:  # a view over the request's bytes: torch.from_numpy wants memory it may write
            data = data.copy()
        return self._torch.from_numpy(data).to(self._device)


def _argument_order(config: ModelConfig, module: Any) -> list[str]:
    """The config's input names, with the sequence batcher's control inputs, in the order forward takes them, as
    Triton's PyTorch backend orders them: by forward's argument names when every input is one, else by the
    ``<name>__<index>`` convention when every input follows it, else in the config's order."""
    controls = [control.name for control in config.sequence_batching.control_input]
    names = [tensor.name for tensor in config.input] + controls
    arguments = [argument.name for argument in module.forward.schema.arguments][1:]  # less self
    if len(arguments) != len(names):
        raise invalid_arg(
            f"unable to load model '{config.name}', configuration expects {len(names)} inputs, "
            f"model provides {len(arguments)}"
        )
    if all(name in arguments for name in names):
        return sorted(names, key=arguments.index)
    indexed = [_INDEXED.match(name) for name in names]
    if all(indexed):
        by_index = {int(match.group(1)): name for match, name in zip(indexed, names, strict=True) if match}
        if sorted(by_index) != list(range(len(names))):
            raise invalid_arg(f"model '{config.name}': input indices must be 0 to {len(names) - 1}")
        return [by_index[i] for i in range(len(names))]
    log.warning(
        "the inputs of model '%s' are neither forward's arguments (%s) nor named <name>__<index>: they are given "
        "to forward in the configuration's order",
        config.name,
        ", ".join(arguments),
    )
    return names
