"""Semantic checks on a complete model config, done before a model loads.

Parsing (edged.core.config.model_config) only proves the text is a ModelConfig; these checks prove it describes a model
edged can serve, and name the model, tensor and field that is wrong.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edged.core.devices import MIN_COMPUTE_CAPABILITY
from edged.core.request.datatypes import WIRE_NAME_BY_CONFIG
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence

    from edged.proto.model_config_pb2 import ModelConfig, ModelInput, ModelOutput

WILDCARD_DIM = -1
TYPE_INVALID = 0
KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL = 0, 1, 2, 3
_DELAY = 1  # ModelQueuePolicy.DELAY


def _error(message: str) -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, message)


def validate_model_config(config: ModelConfig) -> None:
    name = config.name
    if not name:
        raise _error("model configuration must specify 'name'")
    if config.max_batch_size < 0:
        raise _error(f"'max_batch_size' must be non-negative value for {name}")
    if not config.platform and not config.backend:
        raise _error(f"unexpected platform type '' for {name}")
    _validate_tensors(name, "input", config.input, config.max_batch_size)
    _validate_tensors(name, "output", config.output, config.max_batch_size)
    if config.WhichOneof("scheduling_choice") == "dynamic_batching":
        _validate_dynamic_batching(config)
    _validate_sequence_states(config)
    filename = config.default_model_filename
    if filename and (filename.startswith("/") or ".." in filename.split("/")):
        raise _error(f"default_model_filename '{filename}' must name a file inside the version folder for {name}")
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") == "latest" and policy.latest.num_versions < 1:
        raise _error(f"version_policy 'latest' must have num_versions >= 1 for {name}")
    _validate_warmup(config)


def _validate_warmup(config: ModelConfig) -> None:
    """Triton refuses warmup for an ensemble when it reads the config; the rest of a sample (its inputs, dims and
    data) is checked when it runs, at load (edged.core.repository.warmup). A data file must stay in the model's
    warmup folder."""
    if not config.model_warmup:
        return
    if config.platform == "ensemble":
        raise _error(f"model_warmup can not be specified for ensemble '{config.name}'")
    for sample in config.model_warmup:
        for input_name, meta in sample.inputs.items():
            path = meta.input_data_file
            if meta.WhichOneof("input_data_type") == "input_data_file" and (
                not path or path.startswith("/") or ".." in path.split("/")
            ):
                raise _error(
                    f"warmup sample '{sample.name}' input '{input_name}': input_data_file '{path}' must name a file "
                    f"in the model's 'warmup' folder for {config.name}"
                )


def _validate_dynamic_batching(config: ModelConfig) -> None:
    """Triton's checks, with its messages: preferred sizes within max_batch_size (0 included), priority levels in
    range, and no reordering (priorities, DELAY) where responses must keep their order."""
    name = config.name
    batching = config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size < 1:
            raise _error(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise _error(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise _error(f"default priority level must be in range [1, {levels}] for {name}")
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                raise _error(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    if batching.preserve_ordering:
        if levels > 1:
            raise _error(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == _DELAY for p in policies):
            raise _error(
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}"
            )


def validate_instance_groups(config: ModelConfig, gpus: Collection[int]) -> None:
    """Triton's checks of normalised instance groups against the GPUs there are (``gpus``, their ids), with
    Triton's messages: every group must run on devices this machine has."""
    name = config.name
    if config.platform == "ensemble":
        return  # an ensemble runs no instances of its own
    if not config.instance_group:
        raise _error(f"must specify one or more 'instance group's for {name}")
    for group in config.instance_group:
        prefix = f"instance group {group.name} of model {name}"
        if group.count < 1:
            raise _error(f"{prefix} must have count >= 1")
        if group.kind == KIND_MODEL:
            if group.gpus:
                raise _error(f"{prefix} has kind KIND_MODEL but specifies one or more GPUs")
        elif group.kind == KIND_GPU:
            if not group.gpus:
                raise _error(
                    f"{prefix} has kind KIND_GPU but no GPUs are available"
                    if not gpus
                    else f"{prefix} has kind KIND_GPU but specifies no GPUs"
                )
            for gpu in group.gpus:
                if gpu not in gpus:
                    raise _error(
                        f"{prefix} specifies invalid or unsupported gpu id {gpu}. GPUs with at least the minimum "
                        f"required CUDA compute compatibility of {MIN_COMPUTE_CAPABILITY:f} are: "
                        + ", ".join(str(g) for g in sorted(gpus))
                    )
        elif group.kind == KIND_CPU:
            if group.gpus:
                raise _error(f"{prefix} has kind KIND_CPU but specifies one or more GPUs")
        else:
            raise EdgedError(ErrorCode.INTERNAL, f"{prefix} has unexpected kind KIND_AUTO")


def _validate_tensors(
    model: str, kind: str, tensors: Sequence[ModelInput] | Sequence[ModelOutput], max_batch_size: int
) -> None:
    seen: set[str] = set()
    for tensor in tensors:
        if not tensor.name:
            raise _error(f"model {kind} must specify 'name' for {model}")
        if tensor.name in seen:
            raise _error(f"model '{model}' has duplicate {kind} named '{tensor.name}'")
        seen.add(tensor.name)
        if tensor.data_type == TYPE_INVALID:
            raise _error(f"model {kind} '{tensor.name}' must specify 'data_type' for {model}")
        if tensor.data_type not in WIRE_NAME_BY_CONFIG:
            # The enum is open: the text format takes any int32 (data_type: 32) where it takes a name.
            raise _error(f"model {kind} '{tensor.name}' has unknown 'data_type' {tensor.data_type} for {model}")
        _validate_dims(model, kind, tensor.name, tensor.dims)
        if tensor.HasField("reshape"):
            _validate_reshape(model, kind, tensor.name, tensor.dims, tensor.reshape.shape)
        if not tensor.dims:
            raise _error(f"model {kind} '{tensor.name}' must specify 'dims' for {model}")


def _validate_sequence_states(config: ModelConfig) -> None:
    """The implicit state of a sequence model is a tensor the backend outputs and the batcher feeds back: it needs
    both names, a known data type and dims, as an input or output does."""
    for state in config.sequence_batching.state:
        if not state.input_name or not state.output_name:
            raise _error(f"a sequence state of {config.name} must specify both 'input_name' and 'output_name'")
        if state.data_type == TYPE_INVALID or state.data_type not in WIRE_NAME_BY_CONFIG:
            raise _error(
                f"sequence state '{state.input_name}' has unknown 'data_type' {state.data_type} for {config.name}"
            )
        _validate_dims(config.name, "sequence state", state.input_name, state.dims)


def _validate_dims(model: str, kind: str, tensor: str, dims: Iterable[int]) -> None:
    for dim in dims:
        if dim != WILDCARD_DIM and dim < 1:
            raise _error(
                f"model {kind} '{tensor}' dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a "
                f"variable-size dimension for {model}"
            )


def _validate_reshape(model: str, kind: str, tensor: str, dims: Sequence[int], shape: Sequence[int]) -> None:
    _validate_dims(model, kind, tensor, shape)
    if WILDCARD_DIM in dims or WILDCARD_DIM in shape:
        if (WILDCARD_DIM in dims) != (WILDCARD_DIM in shape):
            raise _error(
                f"model {kind} '{tensor}' has different variable-size dimensions in 'dims' and 'reshape' for {model}"
            )
        return
    if math.prod(dims) != math.prod(shape):
        raise _error(f"model {kind} '{tensor}' has different size for dims and reshape for {model}")
