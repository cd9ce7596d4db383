"""``import triton_python_backend_utils as pb_utils``: the module Triton Python-backend models are written against.

The stub process puts this file on the model's import path. Everything a model.py may call is here, with Triton's
names, signatures and behaviour; what Triton implements in C++ (Tensor, InferenceRequest, the response sender,
BLS, the logger, metrics) talks to the daemon through the stub's runtime (``_runtime``), which the stub sets
before it imports the model. Imported outside a stub (a model's own unit tests), the pure parts still work and
the logger prints to stderr.

This module is loaded by the stub interpreter, which may be a model's own Python environment: it uses the
standard library and numpy only.

Why one module of this size: it is one idea, the API models are written against, and it has to be one importable
name, as Triton's is: models import ``triton_python_backend_utils`` and reach every class and constant through it.
Splitting it into siblings would leave them as top-level modules a model's own imports could find (the stub takes
its folder off ``sys.path`` for that reason).
"""

from __future__ import annotations

import asyncio
import enum
import json
import struct
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Awaitable

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = 0
TRITONSERVER_MEMORY_CPU = 1
_MEMORY_DEFAULT = 2

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType values and the wire names they travel as.
_TYPE_BYTES = 13
_TYPE_BF16 = 14
_WIRE_BY_TRITON_TYPE: dict[int, str] = {
    1: "BOOL",
    2: "UINT8",
    3: "UINT16",
    4: "UINT32",
    5: "UINT64",
    6: "INT8",
    7: "INT16",
    8: "INT32",
    9: "INT64",
    10: "FP16",
    11: "FP32",
    12: "FP64",
    13: "BYTES",
    14: "BF16",
}
_TRITON_TYPE_BY_WIRE: dict[str, int] = {wire: code for code, wire in _WIRE_BY_TRITON_TYPE.items()}
_NUMPY_BY_TRITON_TYPE: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
# The numeric types by their exact numpy dtype (native byte order), for the lookup every Tensor makes.
_TRITON_TYPE_BY_DTYPE: dict[np.dtype[Any], int] = {
    np.dtype(numpy_type): code for code, numpy_type in _NUMPY_BY_TRITON_TYPE.items() if code != _TYPE_BYTES
}
_LENGTH = struct.Struct("<I")


def _text(value: Any, what: str) -> str:
    """A string argument as Triton's binding takes it: ``str``, or ``bytes`` holding UTF-8 (pybind11 converts both
    to the ``std::string`` the C++ side declares), so ``model_name=tensor.as_numpy()[0]`` works as it does there."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise TritonModelException(f"{what} must be UTF-8 text, got {bytes(value)!r}") from None
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")


def _incompatible(function: str, signature: str, arguments: str) -> TypeError:
    """pybind11's refusal of arguments that do not fit the C++ signature of Triton's binding."""
    kind = "constructor" if function == "__init__" else "function"
    return TypeError(
        f"{function}(): incompatible {kind} arguments. The following argument types are supported:\n"
        f"    1. {signature}\n\nInvoked with: {arguments}"
    )


class _Runtime(Protocol):
    """What the stub provides to this module."""

    model_dir: str
    decoupled: bool

    def log(self, level: int, message: str) -> None: ...

    def send_response(self, request: InferenceRequest, response: InferenceResponse | None, flags: int) -> None: ...

    def is_cancelled(self, request: InferenceRequest) -> bool: ...

    def bls(self, request: InferenceRequest, decoupled: bool) -> InferenceResponse | ResponseIterator: ...

    def cancel_bls(self, call: int) -> None: ...

    def call(self, op: str, args: dict[str, Any], files: dict[str, bytes] | None = None) -> Any: ...

    def metric(self, message: dict[str, Any]) -> None: ...


_runtime: _Runtime | None = None


def _require_runtime(what: str) -> _Runtime:
    if _runtime is None:
        raise TritonModelException(f"{what} is only available inside a model served by the Python backend")
    return _runtime


# --- errors -------------------------------------------------------------------------------------------------


class TritonError:
    """An error for a response: ``TritonError(message, code=TritonError.INTERNAL)``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str | bytes, code: int = INTERNAL) -> None:
        self._message = _text(message, "an error's message")
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


_CODE_NAMES = (
    "UNKNOWN",
    "INTERNAL",
    "NOT_FOUND",
    "INVALID_ARG",
    "UNAVAILABLE",
    "UNSUPPORTED",
    "ALREADY_EXISTS",
    "CANCELLED",
)


def _code_name(code: int) -> str:
    return _CODE_NAMES[code] if 0 <= code < len(_CODE_NAMES) else "INTERNAL"


def _code_value(name: str) -> int:
    return _CODE_NAMES.index(name) if name in _CODE_NAMES else TritonError.INTERNAL


class TritonModelException(Exception):
    """Raised by the backend's API on misuse or failure; a model may raise it too."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message


# --- tensors ------------------------------------------------------------------------------------------------


def serialize_byte_tensor(input_tensor: np.ndarray[Any, Any]) -> Any:
    """The length-prefixed binary form of a BYTES array; ``()`` when empty, None for other dtypes."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        parts: list[bytes] = []
        for item in input_tensor.reshape(-1, order="C"):
            data = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    return None


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray[Any, Any]:
    """The elements of a length-prefixed BYTES buffer as a 1-D object array of bytes."""
    items: list[bytes] = []
    offset = 0
    while offset < len(encoded_tensor):
        (length,) = _LENGTH.unpack_from(encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def triton_to_numpy_type(data_type: int) -> Any:
    return _NUMPY_BY_TRITON_TYPE.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    code = _TRITON_TYPE_BY_DTYPE.get(data_type) if isinstance(data_type, np.dtype) else None
    if code is not None:
        return code
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OS":
        return _TYPE_BYTES
    for code, numpy_type in _NUMPY_BY_TRITON_TYPE.items():
        if code != _TYPE_BYTES and dtype == np.dtype(numpy_type):
            return code
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


class Tensor:
    """A named tensor: ``Tensor(name, numpy_array)``. Object and bytes arrays are BYTES tensors."""

    __slots__ = ("_array", "_name", "_type")

    def __init__(self, name: str | bytes, data: Any) -> None:
        if data is None or not isinstance(name, (str, bytes, bytearray)):
            signature = "triton_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)"
            raise _incompatible("__init__", signature, f"{name!r}, {data!r}")
        if not isinstance(name, str):
            name = _text(name, "a tensor's name")
        array = data if isinstance(data, np.ndarray) else np.asarray(data)
        triton_type = _TRITON_TYPE_BY_DTYPE.get(array.dtype)
        if triton_type is None:
            if array.dtype.kind == "U":
                array = array.astype(np.object_)
            triton_type = numpy_to_triton_type(array.dtype)
        if triton_type is None:
            raise TritonModelException(
                f"Tensor dtype '{array.dtype}' used for '{name}' is not supported by the Python backend"
            )
        self._name = name
        self._array = array
        self._type = triton_type

    @classmethod
    def _from_wire(cls, name: str, datatype: str, array: np.ndarray[Any, Any]) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._type = _TRITON_TYPE_BY_WIRE[datatype]
        return tensor

    def _wire_datatype(self) -> str:
        return _WIRE_BY_TRITON_TYPE[self._type]

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        if self._type == _TYPE_BF16:
            raise TritonModelException(
                f"Tensor dtype is BF16 and cannot be converted to numpy (tensor '{self._name}'): use to_dlpack() "
                "and Tensor.from_dlpack() instead"
            )
        return self._array

    def triton_dtype(self) -> int:
        return self._type

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        if self._type == _TYPE_BYTES:
            raise TritonModelException(f"tensor '{self._name}' is BYTES, which DLPack cannot describe")
        capsule = np.ascontiguousarray(self._array).__dlpack__()
        if self._type == _TYPE_BF16:
            # Held as 16-bit unsigned words, which numpy exports; the consumer is told what they are.
            _set_dlpack_type(capsule, _DL_BFLOAT, 16)
        return capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0

    @staticmethod
    def from_dlpack(name: str | bytes, dlpack_tensor: Any) -> Tensor:
        """A tensor from a DLPack capsule or any object with ``__dlpack__`` (CPU memory, C-contiguous)."""
        name = _text(name, "a tensor's name")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if type(dlpack_tensor).__name__ != "PyCapsule" and not (
            hasattr(dlpack_tensor, "__dlpack__") and hasattr(dlpack_tensor, "__dlpack_device__")
        ):
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have `__dlpack__` and "
                "`__dlpack_device__` attributes"
            )
        if isinstance(dlpack_tensor, Tensor):
            # Another pb_utils tensor (BF16 included): share its data.
            return Tensor._from_wire(name, dlpack_tensor._wire_datatype(), dlpack_tensor._array)
        try:
            capsule = dlpack_tensor.__dlpack__() if hasattr(dlpack_tensor, "__dlpack__") else dlpack_tensor
            # numpy has no bfloat16: such a tensor is read as the 16-bit words it is made of, and stays BF16.
            bf16 = _dlpack_type(capsule) == (_DL_BFLOAT, 16)
            if bf16:
                _set_dlpack_type(capsule, _DL_UINT, 16)
            array = np.from_dlpack(_Capsule(capsule))
        except (TypeError, BufferError, RuntimeError, ValueError) as exc:
            raise TritonModelException(f"unable to read DLPack tensor for '{name}': {exc}") from None
        if not array.flags.c_contiguous:
            raise TritonModelException(f"DLPack tensor for '{name}' must be C-contiguous")
        if bf16:
            return Tensor._from_wire(name, "BF16", array)
        return Tensor(name, array)


# DLPack's type codes (DLDataTypeCode) and where a legacy "dltensor" capsule's DLManagedTensor keeps its type: after
# the data pointer (8 bytes), the device (two int32) and ndim (int32), a DLDataType of code (uint8), bits (uint8)
# and lanes (uint16).
_DL_UINT = 1
_DL_BFLOAT = 4
_DL_TYPE_OFFSET = 20


def _dlpack_tensor_address(capsule: Any) -> int:
    import ctypes

    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(capsule, b"dltensor")  # ValueError for anything else (a used or versioned capsule)
    if not address:
        raise ValueError("the DLPack capsule holds no tensor")
    return int(address)


def _dlpack_type(capsule: Any) -> tuple[int, int]:
    """The (type code, bits) of the tensor in an unused legacy DLPack capsule."""
    import ctypes

    address = _dlpack_tensor_address(capsule) + _DL_TYPE_OFFSET
    return ctypes.c_uint8.from_address(address).value, ctypes.c_uint8.from_address(address + 1).value


def _set_dlpack_type(capsule: Any, code: int, bits: int) -> None:
    import ctypes

    address = _dlpack_tensor_address(capsule) + _DL_TYPE_OFFSET
    ctypes.c_uint8.from_address(address).value = code
    ctypes.c_uint8.from_address(address + 1).value = bits


class _Capsule:
    """Lets numpy import a bare DLPack capsule, which it only takes through ``__dlpack__``."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("input", []):
        if properties["name"] == name:
            return dict(properties)
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("output", []):
        if properties["name"] == name:
            return dict(properties)
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


# --- requests and responses ---------------------------------------------------------------------------------


class PreferredMemory:
    def __init__(self, preferred_memory_type: int = _MEMORY_DEFAULT, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace, passed to a BLS request (``trace=request.trace()``) to trace the call as its child; it
    has no OpenTelemetry context."""

    def __init__(self, trace_id: int = 0) -> None:
        self._id = trace_id

    def get_context(self, mode: str = "") -> str | None:
        return None


class InferenceRequest:
    """A request given to ``execute``, or one a model builds to call another model (BLS)."""

    __slots__ = (
        "_correlation_id",
        "_flags",
        "_inputs",
        "_model_name",
        "_model_version",
        "_outputs",
        "_parameters",
        "_preferred_memory",
        "_release_flags",
        "_request_id",
        "_rid",
        "_sender",
        "_sent_response",
        "_timeout",
        "_trace",
    )

    def __init__(
        self,
        request_id: str | bytes = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str | bytes] | None = None,
        model_name: str | bytes | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if (
            inputs is None
            or requested_output_names is None
            or model_name is None
            or not isinstance(correlation_id, (int, str))
            or not isinstance(model_version, int)
            or not isinstance(flags, int)
            or not isinstance(timeout, int)
        ):
            raise _incompatible(
                "__init__",
                "triton_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, "
                "inputs: List[Tensor], requested_output_names: List[str], model_name: str, model_version: int = -1, "
                "flags: int = 0, timeout: int = 0, preferred_memory: PreferredMemory = ..., trace: InferenceTrace = "
                "..., parameters: object = None)",
                f"kwargs: inputs={inputs!r}, requested_output_names={requested_output_names!r}, "
                f"model_name={model_name!r}",
            )
        if parameters is not None and not isinstance(parameters, (dict, str)):
            raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
        parameters_json = parameters if isinstance(parameters, str) else json.dumps(_checked_parameters(parameters))
        self._request_id = _text(request_id, "a request's id")
        self._correlation_id = correlation_id
        self._outputs = [_text(name, "a requested output's name") for name in requested_output_names]
        self._model_name = _text(model_name, "a model's name")
        self._inputs = list(inputs)
        if any(tensor is None for tensor in self._inputs):
            raise TritonModelException(
                f"Input tensor for request with id '{self._request_id}' and model name '{self._model_name}' should "
                "not be empty."
            )
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters_json
        self._trace = trace or InferenceTrace()
        self._preferred_memory = preferred_memory or PreferredMemory()
        self._rid = -1  # the daemon's key; -1 for a request built by the model
        self._sender: InferenceResponseSender | None = None
        self._sent_response: InferenceResponse | None = None  # default mode answering through the sender
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _from_daemon(
        cls,
        rid: int,
        request_id: str,
        correlation_id: int | str,
        inputs: list[Tensor],
        requested_output_names: list[str],
        model_name: str,
        flags: int,
        timeout: int,
        parameters: str,
    ) -> InferenceRequest:
        """A request for ``execute``, from fields the daemon has already checked (no validation per request)."""
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._outputs = requested_output_names
        request._model_name = model_name
        request._model_version = -1
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters
        request._trace = _NO_TRACE
        request._preferred_memory = _DEFAULT_MEMORY
        request._rid = rid
        request._sender = None
        request._sent_response = None
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> InferenceResponseSender:
        if self._rid < 0:
            raise TritonModelException("only a request given to execute has a response sender")
        if self._sender is None:
            self._sender = InferenceResponseSender(self)
        return self._sender

    def is_cancelled(self) -> bool:
        if self._rid < 0 or _runtime is None:
            return False
        return _runtime.is_cancelled(self)

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE runs the request again in a later execute (a model with
        ``sequence_batching { iterative_sequence: true }``); a default-mode model answers None for it this time."""
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on another model of the server and wait for the response (a ResponseIterator of every
        response when ``decoupled``). Failures come back as a response with an error, never as an exception."""
        return _require_runtime("BLS").bls(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """``exec`` without blocking the model's event loop: await the result."""
        return asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)


_NO_TRACE = InferenceTrace()
_DEFAULT_MEMORY = PreferredMemory()


def _checked_parameters(parameters: dict[Any, Any] | None) -> dict[str, Any]:
    """Request or response parameters, refused as Triton's binding refuses them: keys are ``str``, values ``bool``,
    ``int`` or ``str`` (not ``bytes``: the binding checks these types itself rather than converting)."""
    for key, value in (parameters or {}).items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return parameters or {}


_EMPTY: list[Any] = []  # InferenceResponse's default output_tensors (never changed: a copy is kept)


class InferenceResponse:
    """``InferenceResponse(output_tensors=[...], error=None, parameters=None)``."""

    __slots__ = ("_error", "_parameters", "_tensors")

    def __init__(
        self,
        output_tensors: list[Tensor] = _EMPTY,
        error: TritonError | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        tensors = output_tensors
        if not isinstance(tensors, list):
            raise _incompatible(
                "__init__",
                "triton_python_backend_utils.InferenceResponse(output_tensors: List[Tensor] = [], error: TritonError "
                "= None, parameters: object = None)",
                f"kwargs: output_tensors={output_tensors!r}",
            )
        if any(tensor is None for tensor in tensors):
            raise TritonModelException("Output tensor for inference response should not be empty.")
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException('"error" must be a TritonError.')
        if parameters is not None and not isinstance(parameters, dict):
            # Triton's text, with the C++ type's mangled name.
            raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
        parsed: dict[str, Any] = _checked_parameters(dict(parameters)) if parameters else {}
        self._tensors = tensors if tensors is not _EMPTY else []
        self._error = error
        self._parameters: dict[str, Any] = parsed

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


class InferenceResponseSender:
    """Sends a request's responses as they are ready; the last send carries TRITONSERVER_RESPONSE_COMPLETE_FINAL."""

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request
        self._closed = False
        self._sent = 0  # sends so far, flag-only ones too (Triton's count)
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("send() takes an InferenceResponse")
        if response is None and flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero"
            )
        runtime = _require_runtime("the response sender")
        with self._lock:
            if not runtime.decoupled:
                # Default mode: one response, then (or with it) the final flag; Triton's rules and texts.
                if response is not None and self._sent:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL and not self._sent:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before sending a "
                        "response."
                    )
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
            self._sent += 1
        runtime.send_response(self._request, response, flags)

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()

    def _is_closed(self) -> bool:
        return self._closed


class ResponseIterator:
    """The responses of a decoupled BLS call, in order; the last one (possibly empty) ends the iteration. As in
    Triton, the responses are kept: iterating again starts from the first one."""

    _END = object()

    def __init__(self, call: int) -> None:
        self._call = call
        self._items: Any = __import__("queue").SimpleQueue()
        self._done = False
        self._seen: list[InferenceResponse] = []
        self._index = 0

    def _put(self, response: InferenceResponse, final: bool) -> None:
        self._items.put(response)
        if final:
            self._items.put(self._END)

    def __iter__(self) -> Iterator[InferenceResponse]:
        self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._index < len(self._seen):
            self._index += 1
            return self._seen[self._index - 1]
        if self._done:
            raise StopIteration
        item = self._items.get()
        if item is self._END:
            self._done = True
            raise StopIteration
        response: InferenceResponse = item
        self._seen.append(response)
        self._index += 1
        return response

    def cancel(self) -> None:
        if not self._done and _runtime is not None:
            _runtime.cancel_bls(self._call)


# --- logging ------------------------------------------------------------------------------------------------


class _LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Messages to the server's log, at Triton's levels (an enum, as in Triton: a plain int is refused)."""

    LogLevel = _LogLevel
    INFO = _LogLevel.INFO
    WARNING = _LogLevel.WARNING
    ERROR = _LogLevel.ERROR
    VERBOSE = _LogLevel.VERBOSE

    @staticmethod
    def log(message: str | bytes, level: _LogLevel = _LogLevel.INFO) -> None:
        if not isinstance(message, (str, bytes, bytearray)) or not isinstance(level, _LogLevel):
            signature = (
                "(message: str, level: triton_python_backend_utils.Logger.LogLevel = <LogLevel.INFO: 0>) -> None"
            )
            raise _incompatible("log", signature, f"{message!r}, {level!r}")
        text = message if isinstance(message, str) else _text(message, "a log message")
        if _runtime is None:
            print(text, file=sys.stderr)
            return
        _runtime.log(int(level), text)

    @staticmethod
    def log_info(message: str | bytes) -> None:
        if not isinstance(message, (str, bytes, bytearray)):
            raise _incompatible("log_info", "(message: str) -> None", repr(message))
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str | bytes) -> None:
        if not isinstance(message, (str, bytes, bytearray)):
            raise _incompatible("log_warn", "(message: str) -> None", repr(message))
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str | bytes) -> None:
        if not isinstance(message, (str, bytes, bytearray)):
            raise _incompatible("log_error", "(message: str) -> None", repr(message))
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str | bytes) -> None:
        if not isinstance(message, (str, bytes, bytearray)):
            raise _incompatible("log_verbose", "(message: str) -> None", repr(message))
        Logger.log(message, Logger.VERBOSE)


# --- custom metrics -----------------------------------------------------------------------------------------


class MetricFamily:
    """``MetricFamily(name, description, kind)``; its ``Metric(labels, buckets)`` are the labelled series.

    As in Triton, families with one name share their series (metrics with the same labels are one value), a name
    keeps its kind while a family of it exists, and a Metric outlives its family only to report that it is gone."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    _ids = 0

    def __init__(self, name: str | bytes, description: str | bytes, kind: int) -> None:
        name = _text(name, "a metric family's name")
        description = _text(description, "a metric family's description")
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException(f"unknown metric kind {kind}")
        for other in list(_FAMILIES):
            if other.name == name and other.kind != kind:
                raise _metric_error(
                    "Error when creating MetricFamily", "Family name already exists with different type"
                )
        MetricFamily._ids += 1
        self._id = MetricFamily._ids
        self.name: str = name
        self.description: str = description
        self.kind: int = kind
        _FAMILIES.add(self)
        if _runtime is not None:
            _runtime.metric(
                {"op": "family", "family": self._id, "name": name, "description": description, "kind": kind}
            )

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        return Metric(self, labels or {}, buckets)


# The families alive in this stub (a name's kind is fixed while one exists), and the series their metrics share.
_FAMILIES: weakref.WeakSet[MetricFamily] = weakref.WeakSet()
_SERIES: weakref.WeakValueDictionary[tuple[str, tuple[tuple[str, str], ...]], _Series] = weakref.WeakValueDictionary()
_KIND_NAMES = (
    "TRITONSERVER_METRIC_KIND_COUNTER",
    "TRITONSERVER_METRIC_KIND_GAUGE",
    "TRITONSERVER_METRIC_KIND_HISTOGRAM",
)


def _metric_error(what: str, message: str) -> TritonModelException:
    """Triton's text for a metric request the server refused."""
    instance = getattr(_runtime, "instance_name", "")
    return TritonModelException(f"{what}: Failed to process the request for model '{instance}', message: {message}")


class _Series:
    """One labelled series' value, shared by every Metric of it."""

    __slots__ = ("__weakref__", "lock", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.lock = threading.Lock()


class Metric:
    _ids = 0

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        if family.kind == MetricFamily.HISTOGRAM and buckets is None:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        if family.kind != MetricFamily.HISTOGRAM and buckets is not None:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        if buckets and list(buckets) != sorted(set(buckets)):  # strictly increasing
            raise _metric_error("Error when creating Metric", "Bucket Boundaries must be strictly sorted")
        Metric._ids += 1
        self._id = Metric._ids
        self._family = weakref.ref(family)
        self._kind = family.kind
        key = (family.name, tuple(sorted((str(k), str(v)) for k, v in labels.items())))
        series = _SERIES.get(key)
        if series is None:
            series = _SERIES[key] = _Series()
        self._series = series
        if _runtime is not None:
            _runtime.metric(
                {"op": "metric", "family": family._id, "metric": self._id, "labels": labels, "buckets": buckets}
            )

    def _check(self, what: str, operation: str, allowed: tuple[int, ...]) -> None:
        if self._family() is None:
            raise TritonModelException(
                f"{what}: Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
            )
        if self._kind not in allowed:
            raise _metric_error(what, f"{_KIND_NAMES[self._kind]} does not support {operation}")

    def _update(self, op: str, value: float) -> None:
        if _runtime is not None:
            _runtime.metric({"op": op, "metric": self._id, "value": value})

    def increment(self, value: float) -> None:
        self._check("Failed to increment metric value", "Increment", (MetricFamily.COUNTER, MetricFamily.GAUGE))
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise _metric_error(
                "Failed to increment metric value",
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values.",
            )
        with self._series.lock:
            self._series.value += value
        self._update("increment", value)

    def set(self, value: float) -> None:
        self._check("Failed to set metric value", "Set", (MetricFamily.GAUGE,))
        with self._series.lock:
            self._series.value = value
        self._update("set", value)

    def observe(self, value: float) -> None:
        self._check("Failed to observe metric value", "Observe", (MetricFamily.HISTOGRAM,))
        self._update("observe", value)

    def value(self) -> float:
        """The counter's or gauge's value (a histogram has none, as in Triton)."""
        self._check("Failed to get metric value", "Value", (MetricFamily.COUNTER, MetricFamily.GAUGE))
        return self._series.value


# --- model management ---------------------------------------------------------------------------------------


def load_model(model_name: str | bytes, config: str | bytes = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload a model (explicit model control only): ``config`` a model config as JSON, ``files``
    ``{"file:<version>/<path>": contents}`` for the model's private copy, as the repository API takes them."""
    for key, content in (files or {}).items():
        if not key.startswith("file:") or not isinstance(content, (bytes, bytearray)):
            raise TritonModelException(f"override files are given as {{'file:<version>/<path>': bytes}}, not '{key}'")
    arguments = {"model_name": _text(model_name, "a model's name"), "config": _text(config, "a model's config")}
    _require_runtime("load_model").call("load_model", arguments, files or {})


def unload_model(model_name: str | bytes, unload_dependents: bool = False) -> None:
    _require_runtime("unload_model").call(
        "unload_model", {"model_name": _text(model_name, "a model's name"), "unload_dependents": unload_dependents}
    )


def is_model_ready(model_name: str | bytes, model_version: str | bytes = "") -> bool:
    version = model_version if isinstance(model_version, (str, int)) else _text(model_version, "a model's version")
    return bool(
        _require_runtime("is_model_ready").call(
            "is_model_ready", {"model_name": _text(model_name, "a model's name"), "model_version": str(version)}
        )
    )


def get_model_dir() -> str:
    return _require_runtime("get_model_dir").model_dir


# --- auto-complete ------------------------------------------------------------------------------------------


class ModelConfig:
    """The model's configuration as auto_complete_config sees it; ``as_dict()`` reads it, the setters change it."""

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config["name"])

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for model "
                f"'{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for found in ("sequence_batching", "ensemble_scheduling"):
            if found in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{found}', but auto-complete-config function for "
                    f"model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict[str, Any], valid: tuple[str, ...]) -> None:
        model = self._name()
        for key in tensor:
            if key not in valid:
                allowed = ", ".join(f"'{v}'" for v in valid[:-1]) + f" and '{valid[-1]}'"
                raise ValueError(
                    f"{kind} '{tensor.get('name')}' in auto-complete-config function for model '{model}' contains "
                    f"property other than {allowed}."
                )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{model}' is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model '{model}' is missing "
                    f"'{key}' property."
                )
        entries: list[dict[str, Any]] = self._model_config.setdefault(kind, [])
        for current in entries:
            if current["name"] != tensor["name"]:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {current['data_type']} for "
                    f"{kind} '{tensor['name']}', model provides {tensor['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', tensor '{tensor['name']}': the model expects dims {tensor['dims']} but the "
                    f"model configuration specifies dims {current['dims']}"
                )
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', tensor '{tensor['name']}': the model expects optional {tensor['optional']} "
                    f"but the model configuration specifies optional {current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        entries.append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        model = self._name()
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{model}' contains "
                    "property other than 'decoupled'."
                )
        policy: dict[str, Any] = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{model}', which is "
                    f"already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
