"""What a sequence model's config declares beyond its inputs: the control inputs the sequence batcher fills (START,
END, READY, CORRID) in the types the config gives, and the implicit state it carries from request to request, with
its initial value (zeros, or the config's ``initial_state`` data file in the model folder). A string correlation id
given to a numeric CORRID input becomes a stable number."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.errors import EdgedError, ErrorCode
from edged.proto.model_config_pb2 import DataType, ModelSequenceBatching

if TYPE_CHECKING:
    from pathlib import Path

    from edged.proto.model_config_pb2 import ModelConfig

CorrelationId = int | str
Control = ModelSequenceBatching.Control
# Wire name and numpy type of the data types control inputs and states may use.
TYPES: dict[int, tuple[str, Any]] = {
    DataType.TYPE_BOOL: ("BOOL", np.bool_),
    DataType.TYPE_INT32: ("INT32", np.int32),
    DataType.TYPE_INT64: ("INT64", np.int64),
    DataType.TYPE_UINT64: ("UINT64", np.uint64),
    DataType.TYPE_FP32: ("FP32", np.float32),
    DataType.TYPE_FP16: ("FP16", np.float16),
    DataType.TYPE_FP64: ("FP64", np.float64),
    DataType.TYPE_INT8: ("INT8", np.int8),
    DataType.TYPE_UINT8: ("UINT8", np.uint8),
    DataType.TYPE_STRING: ("BYTES", np.object_),
}


@dataclass(frozen=True, slots=True)
class ControlInput:
    name: str
    kind: int
    datatype: str
    dtype: Any
    values: tuple[Any, Any]  # (false, true); unused for CORRID


@dataclass(frozen=True, slots=True)
class State:
    input_name: str
    output_name: str
    datatype: str
    dtype: Any
    dims: tuple[int, ...]
    initial: np.ndarray[Any, Any]  # what a sequence starts with: zeros, or the config's initial_state data file


def control_inputs(config: ModelConfig) -> list[ControlInput]:
    controls: list[ControlInput] = []
    for control_input in config.sequence_batching.control_input:
        for control in control_input.control:
            if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                datatype, dtype = TYPES.get(control.data_type, ("UINT64", np.uint64))
                controls.append(ControlInput(control_input.name, control.kind, datatype, dtype, (None, None)))
                continue
            if control.int32_false_true:
                pair: tuple[Any, Any] = tuple(control.int32_false_true[:2])
                datatype, dtype = "INT32", np.int32
            elif control.fp32_false_true:
                pair = tuple(control.fp32_false_true[:2])
                datatype, dtype = "FP32", np.float32
            else:
                pair = tuple(control.bool_false_true[:2]) or (False, True)
                datatype, dtype = "BOOL", np.bool_
            controls.append(ControlInput(control_input.name, control.kind, datatype, dtype, pair))
    return controls


def states(config: ModelConfig, model_dir: Path | None) -> list[State]:
    states = []
    for state in config.sequence_batching.state:
        datatype, dtype = TYPES.get(state.data_type, ("FP32", np.float32))
        dims = tuple(int(d) for d in state.dims)
        initial = np.zeros(dims, dtype=dtype)
        for given in state.initial_state:
            if given.WhichOneof("state_data") == "data_file":
                initial = _initial_from_file(config.name, state.input_name, model_dir, given.data_file, dtype, dims)
        states.append(State(state.input_name, state.output_name, datatype, dtype, dims, initial))
    return states


def check_sequence_config(config: ModelConfig, model_dir: Path) -> None:
    """What the sequence batcher will need from the model folder (its initial state files) is there and sound."""
    states(config, model_dir)


def _initial_from_file(
    model: str, state: str, model_dir: Path | None, name: str, dtype: Any, dims: tuple[int, ...]
) -> np.ndarray[Any, Any]:
    """Triton's rule: the file is in the model folder's initial_state/ subfolder, row-major, of the state's type."""
    if model_dir is None or "/" in name or name in ("", ".", ".."):
        raise EdgedError(ErrorCode.INVALID_ARG, f"initial state '{name}' of model '{model}' is not a file name")
    path = model_dir / "initial_state" / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EdgedError(
            ErrorCode.INVALID_ARG, f"unable to read initial state file '{name}' of model '{model}': {exc.strerror}"
        ) from None
    expected = int(np.prod(dims)) * np.dtype(dtype).itemsize
    if dtype is np.object_ or len(data) != expected:
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"initial state file '{name}' of state '{state}' in model '{model}' holds {len(data)} bytes, "
            f"expected {expected}",
        )
    return np.frombuffer(data, dtype=dtype).reshape(dims).copy()


def corrid_number(key: CorrelationId) -> int:
    """A string id for a numeric CORRID input: a stable 63-bit number derived from it."""
    if isinstance(key, int):
        return key
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 1
