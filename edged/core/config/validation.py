"""Semantic checks on a complete model config, done before a model loads.

Parsing (edged.core.config.model_config) only proves the text is a ModelConfig; these checks prove it describes a model
edged can serve, and name the model, tensor and field that is wrong. Where Triton 2.51 checks the same thing the check
and its message are Triton's (its qa greps for the texts), and they come in Triton's order: the model-level checks
(ValidateModelConfig), then the inputs, outputs and batch inputs/outputs (ValidateModelIOConfig), then what Triton
only finds when it looks for the backend library (the ``runtime`` field).
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from edged.core.devices import MIN_COMPUTE_CAPABILITY
from edged.core.request.datatypes import WIRE_NAME_BY_CONFIG
from edged.errors import EdgedError, ErrorCode
from edged.proto.model_config_pb2 import BatchInput, BatchOutput, DataType, ModelSequenceBatching

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence

    from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper as _EnumType

    from edged.proto.model_config_pb2 import ModelConfig, ModelEnsembling, ModelInput, ModelOutput

WILDCARD_DIM = -1
TYPE_INVALID = 0
KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL = 0, 1, 2, 3
_DELAY = 1  # ModelQueuePolicy.DELAY
ENSEMBLE_PLATFORM = "ensemble"
# The backends Triton knows by type and the platforms of each (edged.core.repository.scan fills the backend from these
# platforms): a model of one of them must name one of its platforms; another backend may take any platform.
PLATFORMS_BY_BACKEND: dict[str, frozenset[str]] = {
    "tensorflow": frozenset({"tensorflow_graphdef", "tensorflow_savedmodel"}),
    "tensorrt": frozenset({"tensorrt_plan"}),
    "onnxruntime": frozenset({"onnxruntime_onnx"}),
    "pytorch": frozenset({"pytorch_libtorch", "libtorch", "torch_aoti"}),
}
_Control = ModelSequenceBatching.Control
_BOOLEAN_CONTROLS = (_Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_END, _Control.CONTROL_SEQUENCE_READY)
_CONTROL_VALUES = ("int32_false_true", "fp32_false_true", "bool_false_true")
_CORRID_TYPES = frozenset(
    {DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32, DataType.TYPE_STRING}
)
_BATCH_INPUT_TYPES = frozenset({DataType.TYPE_INT32, DataType.TYPE_FP32})
_TENSORRT_PLATFORM = "tensorrt_plan"
_FORMAT_NONE = 0  # ModelInput.FORMAT_NONE: NHWC and NCHW need 3 dims
_PYTHON_RUNTIME = "model.py"


def _error(message: str) -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, message)


def validate_model_config(config: ModelConfig) -> None:
    """Every check of a config whose backend fields are filled and that is auto-completed and normalised."""
    name = config.name
    if not name:
        raise _error("model configuration must specify 'name'")
    validate_platform(config)
    if config.max_batch_size < 0:
        raise _error(f"'max_batch_size' must be non-negative value for {name}")
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") == "latest" and policy.latest.num_versions < 1:
        raise _error(f"version_policy 'latest' must have num_versions >= 1 for {name}")
    scheduling = config.WhichOneof("scheduling_choice")
    if scheduling == "dynamic_batching":
        _validate_dynamic_batching(config)
    if scheduling == "sequence_batching":
        _validate_sequence_batching(config)
    _validate_ensemble(config)
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise _error(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. Please "
            "disable the response cache."
        )
    _validate_tensors(config, "input", config.input)
    _validate_tensors(config, "output", config.output)
    _validate_batch_io(config)
    _validate_sequence_states(config)
    filename = config.default_model_filename
    if filename and (filename.startswith("/") or ".." in filename.split("/")):
        raise _error(f"default_model_filename '{filename}' must name a file inside the version folder for {name}")
    _validate_warmup(config)
    validate_runtime(config)


def validate_platform(config: ModelConfig) -> None:
    """Triton's: a backend for every model but an ensemble, none for an ensemble, and a platform that agrees with a
    backend Triton knows. edged fills ``backend`` from a known platform before this (repository.scan), and leaves
    ``platform`` empty where Triton would fill it (tensorrt, pytorch): an empty platform is taken as filled. Every
    platform edged maps to a backend is that backend's (Triton 2.51 knows fewer: not "libtorch" or "torch_aoti").
    Public so that it can run before the backend is looked up, as Triton checks the pair first."""
    name, platform, backend = config.name, config.platform, config.backend
    if not backend:
        if platform != ENSEMBLE_PLATFORM:
            raise _error(f"unexpected platform type '{platform}' for {name}")
    elif platform == ENSEMBLE_PLATFORM:
        raise _error(f"Ensemble model '{name}' must have platform type '{platform}' and empty backend type")
    if platform and platform not in PLATFORMS_BY_BACKEND.get(backend, (platform,)):
        raise _error(f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}")


def _validate_warmup(config: ModelConfig) -> None:
    """The rest of a sample (its inputs, dims and data) is checked when it runs, at load
    (edged.core.repository.warmup); an ensemble's warmup is refused with its scheduling. A data file must stay in the
    model's warmup folder."""
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
    _validate_preferred_sizes(config, batching.preferred_batch_size, "dynamic batching preferred size")
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


def _validate_preferred_sizes(config: ModelConfig, sizes: Iterable[int], what: str) -> None:
    for size in sizes:
        if size < 1:
            raise _error(f"{what} must be positive for {config.name}")
        if size > config.max_batch_size:
            raise _error(f"{what} must be <= max batch size for {config.name}")


def _validate_sequence_batching(config: ModelConfig) -> None:
    """Triton's: at most one tensor per control kind and one kind per tensor; START, END and READY say their false
    and true values in exactly one of int32, fp32 or bool; CORRID says none, only a data type."""
    name, batcher = config.name, config.sequence_batching
    if config.response_cache.enable:
        raise _error(
            f"Response Cache does not currently support model {name} with sequence batching scheduler. Please "
            "disable the response cache."
        )
    for kind in _BOOLEAN_CONTROLS:
        _find_control(batcher, name, kind)
    corrid = _find_control(batcher, name, _Control.CONTROL_SEQUENCE_CORRID)
    if corrid is not None and corrid.data_type not in _CORRID_TYPES:
        raise _error(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    if batcher.HasField("oldest"):
        _validate_preferred_sizes(config, batcher.oldest.preferred_batch_size, "sequence batching preferred batch size")
    if batcher.HasField("direct") and not 0.0 <= batcher.direct.minimum_slot_utilization <= 1.0:
        raise _error(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}")


def _find_control(batcher: ModelSequenceBatching, model: str, kind: int) -> ModelSequenceBatching.Control | None:
    """The one control of ``kind``, checked, as Triton looks for it: the tensors are checked on the way, in order, so
    the first problem in the list is the one reported."""
    kind_name = _Control.Kind.Name(kind)
    tensors: set[str] = set()
    found = None
    for control_input in batcher.control_input:
        if not control_input.name:
            raise _error(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in tensors:
            raise _error(
                f"sequence batching control tensor '{control_input.name}' is specified for multiple control kinds "
                f"for {model}"
            )
        tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if found is not None:
                raise _error(f"sequence batching specifies multiple {kind_name} tensors for {model}")
            found = control
            _check_control_values(control, kind_name, model)
    return found


def _check_control_values(control: ModelSequenceBatching.Control, kind_name: str, model: str) -> None:
    given = [field for field in _CONTROL_VALUES if getattr(control, field)]
    choices = "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"
    if control.kind == _Control.CONTROL_SEQUENCE_CORRID:
        if given:
            raise _error(f"sequence batching must not specify either {choices} for {kind_name} for {model}")
        return
    if not given:
        raise _error(f"sequence batching must specify either {choices} for {kind_name} for {model}")
    if len(given) > 1:
        raise _error(
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
            f"'bool_false_true' for {kind_name} for {model}"
        )
    if len(getattr(control, given[0])) != 2:
        raise _error(f"sequence batching control '{given[0]}' must have exactly 2 entries for {kind_name} for {model}")


def _validate_ensemble(config: ModelConfig) -> None:
    """Triton's checks of an ensemble's own config. What its steps say of the models they name, and the flow of
    tensors through them, is checked when the ensemble loads (edged.core.scheduling.ensemble.check_ensemble)."""
    name = config.name
    if not config.HasField("ensemble_scheduling"):
        if config.platform == ENSEMBLE_PLATFORM:
            raise _error(f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}")
        return
    if config.platform != ENSEMBLE_PLATFORM:
        raise _error(f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}")
    if config.instance_group:
        raise _error(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise _error(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise _error(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise _error(f"must specify 'step' for ensemble '{name}'")
    _validate_ensemble_steps(name, config.ensemble_scheduling)


def _validate_ensemble_steps(name: str, scheduling: ModelEnsembling) -> None:
    written: set[str] = set()
    for index, step in enumerate(scheduling.step):
        for member in ("model_name", "input_map", "output_map"):
            if not getattr(step, member):
                raise _error(f"must specify '{member}' in step {index} of ensemble '{name}'")
        for tensor in step.output_map.values():
            if tensor in written:
                raise _error(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' step "
                    f"{index}"
                )
            written.add(tensor)


def validate_instance_groups(config: ModelConfig, gpus: Collection[int]) -> None:
    """Triton's checks of normalised instance groups against the GPUs there are (``gpus``, their ids), with
    Triton's messages: every group must run on devices this machine has."""
    name = config.name
    if config.platform == ENSEMBLE_PLATFORM:
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


def _validate_tensors(config: ModelConfig, kind: str, tensors: Sequence[ModelInput] | Sequence[ModelOutput]) -> None:
    """Triton's ValidateIOShape and what follows it, for each input then each output; a name used twice and a data
    type the enum does not name are edged's own checks."""
    model = config.name
    seen: set[str] = set()
    for tensor in tensors:
        if not tensor.name:
            raise _error(f"model {kind} must specify 'name' for {model}")
        if tensor.name in seen:
            raise _error(f"model '{model}' has duplicate {kind} named '{tensor.name}'")
        seen.add(tensor.name)
        prefix = f"model {kind} '{tensor.name}'"
        if tensor.data_type == TYPE_INVALID:
            raise _error(f"{prefix} must specify 'data_type' for {model}")
        if tensor.data_type not in WIRE_NAME_BY_CONFIG:
            # The enum is open: the text format takes any int32 (data_type: 32) where it takes a name.
            raise _error(f"{prefix} has unknown 'data_type' {tensor.data_type} for {model}")
        if not tensor.dims:
            raise _error(f"{prefix} must specify 'dims' for {model}")
        if tensor.HasField("reshape") and not tensor.reshape.shape and config.max_batch_size == 0:
            # A non-batching model would always see it empty (no data).
            raise _error(
                f"{prefix} cannot have empty reshape for non-batching model as scalar tensors are not supported "
                f"for {model}"
            )
        _validate_dims(model, kind, tensor.name, tensor.dims)
        if tensor.HasField("reshape"):
            _validate_reshape(f"{prefix} ", tensor.dims, tensor.reshape.shape, model)
        _validate_layout(config, kind, tensor)


def _validate_layout(config: ModelConfig, kind: str, tensor: ModelInput | ModelOutput) -> None:
    """Triton's: an image format needs 3 dims; shape tensors and non-linear formats are TensorRT's only."""
    model, tensorrt = config.name, config.platform == _TENSORRT_PLATFORM
    if kind == "input" and getattr(tensor, "format", _FORMAT_NONE) != _FORMAT_NONE and len(tensor.dims) != 3:
        raise _error(f"model input NHWC/NCHW require 3 dims for {model}")
    if tensor.is_shape_tensor and not tensorrt:
        raise _error(f"shape tensors are only supported for TensorRT platform for {model}")
    if tensor.is_non_linear_format_io:
        if not tensorrt:
            raise _error(f"Non-linear IO format is only supported for the TensorRT platform for {model}")
        if len(tensor.dims) != 3:
            raise _error(f"Non-linear IO format {kind} requires 3 dims for {model}")


def _element_count(dims: Iterable[int]) -> int:
    """Triton's element count of a shape: -1 with a variable-size dimension, 0 for no dimensions."""
    dims = list(dims)
    if WILDCARD_DIM in dims:
        return WILDCARD_DIM
    count = 1
    for dim in dims:
        count *= dim
    return count if dims else 0


def _fixed_runs(dims: Iterable[int]) -> list[int]:
    """The element counts of the runs of fixed dimensions between variable-size ones (one more than there are -1s):
    [2, 4, -1, 6] -> [8, 6]."""
    runs, count = [], 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            runs.append(count)
            count = 1
        else:
            count *= dim
    return [*runs, count]


def _validate_reshape(prefix: str, dims: Sequence[int], shape: Sequence[int], model: str) -> None:
    """Triton's: a reshape holds as many elements as dims (an empty reshape stands for dims of one element); with
    variable-size dimensions, as many of them, and each run of fixed dimensions between them the same size
    ([2, 4, -1, 6] may become [8, -1, 1, 6])."""
    if any(dim != WILDCARD_DIM and dim < 1 for dim in shape):
        raise _error(
            f"{prefix}reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to indicate a variable-size "
            f"dimension for {model}"
        )
    dims_size, reshape_size = _element_count(dims), _element_count(shape)
    different = f"{prefix}has different size for dims and reshape for {model}"
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        raise _error(different)
    if dims_size == WILDCARD_DIM:
        dim_runs, reshape_runs = _fixed_runs(dims), _fixed_runs(shape)
        if len(dim_runs) != len(reshape_runs):
            raise _error(f"{prefix}has different number of variable-size dimensions for dims and reshape for {model}")
        if dim_runs != reshape_runs:
            raise _error(different)


def _validate_batch_io(config: ModelConfig) -> None:
    """Triton's: every batch input and output kind takes exactly one source input, a model input; a batch input is
    INT32 or FP32; a batch output names model outputs, each once."""
    model = config.name
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for batch_input in config.batch_input:
        _check_source_count(
            "batch input", _enum_name(BatchInput.Kind, batch_input.kind), batch_input.source_input, model
        )
        if batch_input.data_type not in _BATCH_INPUT_TYPES:
            raise _error(f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {model}")
        _check_source_names(batch_input.source_input, inputs, model)
    for batch_output in config.batch_output:
        _check_source_count(
            "batch output", _enum_name(BatchOutput.Kind, batch_output.kind), batch_output.source_input, model
        )
        _check_source_names(batch_output.source_input, inputs, model)
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise _error(f"unknown target output name '{target}' for {model}")
            if target in targets:
                raise _error(f"target output name '{target}' can only be specified once for {model}")
            targets.add(target)


def _enum_name(enum: _EnumType, value: int) -> str:
    """The name of an enum value; as Triton prints it, empty for a number the enum does not name."""
    try:
        return str(enum.Name(value))
    except ValueError:
        return ""


def _check_source_count(what: str, kind: str, sources: Sequence[str], model: str) -> None:
    if not kind:
        raise _error(f"unknown {what} kind '' for {model}")
    if len(sources) != 1:
        raise _error(f"{what} kind '{kind}' expects 1 source input, got {len(sources)} for {model}")


def _check_source_names(sources: Iterable[str], inputs: Collection[str], model: str) -> None:
    for source in sources:
        if source not in inputs:
            raise _error(f"unknown source input name '{source}' for {model}")


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


def validate_runtime(config: ModelConfig) -> None:
    """``runtime`` names the backend library Triton loads for the model. Triton looks for it in the version folder,
    the model folder and the backend's folder, in that order; one found outside the folder it was looked for in
    "escapes" it. ``model.py`` asks for a Python-based backend: the backend's folder must hold a model.py.

    edged loads no libraries, so the rule is decided from the name alone, as a Triton install with only the
    standard library of each backend would decide it: no runtime, or the backend's own library
    (``libtriton_<backend>.so``, found in the backend's folder), is accepted; a name that climbs out of the folder
    (``..``) is refused as escaping, as Triton refuses it when the file it names exists; ``model.py`` is refused, as
    edged has no Python-based backends (Triton's Python backend folder holds no model.py either); any other name is
    a library that is not there. An ensemble loads no backend library. Triton's messages go on to name the folders
    it searched, which edged has none of."""
    runtime, name = config.runtime, config.name
    if not runtime or config.platform == ENSEMBLE_PLATFORM or runtime == f"libtriton_{config.backend}.so":
        return
    if runtime == _PYTHON_RUNTIME:
        raise _error(f"unable to find Python backend based backend library '{runtime}' for model '{name}'")
    normalized = posixpath.normpath(runtime)
    if normalized == ".." or normalized.startswith("../"):
        raise _error(
            f"backend library name '{runtime}' escapes backend directory, for model '{name}', check model config "
            "runtime field"
        )
    raise _error(f"unable to find backend library '{runtime}' for model '{name}'")
