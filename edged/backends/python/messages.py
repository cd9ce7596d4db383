"""The daemon's side of the execute messages: a core request as the stub reads it, and a stub's response as a core
response (its outputs compared with the model's configuration)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from edged.backends.python.wire import ipc
from edged.core.request.inference import InferOutput, InferResponse
from edged.errors import AnsweredError, EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.backends.python.model_state import ModelState
    from edged.backends.python.wire import shm
    from edged.core.request.inference import InferRequest

log = logging.getLogger("edged.backends.python")

# Request parameters that are request fields in Triton's API rather than entries of parameters().
_RESERVED = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"})


def request_spec(request: InferRequest, rid: int, tensors: ipc.TensorWriter) -> ipc.RequestMsg:
    """The request's part of an execute message; its tensors go into ``tensors``."""
    inputs: list[ipc.TensorDesc] = []
    for tensor in request.inputs:
        shape = list(tensor.shape)
        if tensor.datatype == "BYTES" and tensor.raw is not None:
            # Already in the binary form the stub reads: no need to serialise the elements again.
            inputs.append(tensors.add(tensor.name, "BYTES", shape, tensor.raw))
        else:
            assert tensor.data is not None  # validation decodes every input
            inputs.append(tensors.add(tensor.name, tensor.datatype, shape, tensor.data))
    # Fields at their default value stay out of the message (the stub fills them in).
    spec: ipc.RequestMsg = {"rid": rid, "inputs": inputs}
    if request.trace is not None:
        spec["trace"] = request.trace.id
    if request.id:
        spec["id"] = request.id
    if request.outputs:
        spec["outputs"] = [o.name for o in request.outputs]
    params = request.parameters
    if params:
        flags = (1 if params.get("sequence_start") else 0) | (2 if params.get("sequence_end") else 0)
        timeout = params.get("timeout", 0)
        sequence_id = params.get("sequence_id", 0)
        other = {key: value for key, value in params.items() if key not in _RESERVED}
        if flags:
            spec["flags"] = flags
        if sequence_id and isinstance(sequence_id, (int, str)):
            spec["correlation_id"] = sequence_id
        if timeout and isinstance(timeout, (int, float)):
            spec["timeout"] = int(timeout)
        if other:
            spec["parameters"] = json.dumps(other)
    return spec


def read_response(
    request: InferRequest,
    spec: ipc.ResponseMsg,
    payload: memoryview | None,
    consumer: shm.Consumer,
    state: ModelState,
) -> InferResponse | EdgedError:
    """The stub's response to ``request``: its error as the model gave it, or its outputs.

    As Triton 2.51 does, an output the configuration does not declare is dropped and one of another data type than
    declared goes out with its own (python_backend's own bls_decoupled example answers INT64 for a TYPE_INT32
    output); either is logged once per model and output, for a model that does not do it on purpose."""
    failure = spec.get("error")
    if failure is not None:
        code = ErrorCode.__members__.get(str(failure.get("code")), ErrorCode.INTERNAL)
        return AnsweredError(code, state.for_client(str(failure.get("msg", ""))))
    model = state.config.name
    outputs: list[InferOutput] = []
    for desc in spec.get("outputs", []):
        name, datatype = desc["n"], desc["d"]
        expected = state.output_types.get(name)
        if expected is None:
            _warn_once(
                state,
                name,
                f"model '{model}' answered with output '{name}', which its configuration does not declare "
                f"(its outputs: {', '.join(state.output_names)}); the output is dropped",
            )
            continue
        if datatype != expected:
            _warn_once(
                state,
                name,
                f"output '{name}' of model '{model}' is {datatype}, but the model configuration declares "
                f"{_config_type(expected)}; it is sent as {datatype}",
            )
        # Copied out of the stub's ring (or the packet), which is reused as soon as this message is read.
        array = ipc.read_tensor(consumer, desc, copy=True, payload=payload)
        outputs.append(InferOutput(name, datatype, tuple(array.shape), array))
    parameters = spec.get("parameters") or {}
    return InferResponse(request.model_name, str(request.model_version), request.id, outputs, dict(parameters))


def _warn_once(state: ModelState, output: str, message: str) -> None:
    if output not in state.warned_outputs:
        state.warned_outputs.add(output)
        log.warning("%s", message)


def _config_type(wire: str) -> str:
    return "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"
