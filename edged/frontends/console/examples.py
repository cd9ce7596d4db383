"""A model's inputs and outputs as a person reads them, the requests that call it (curl and tritonclient, ready to
copy), and a test request the console sends through the core with sample inputs built from the model's metadata.

The sample inputs are zeros (``"text"`` for BYTES, false for BOOL) in the model's shape, a dynamic dimension taken
as 1; optional inputs are left out. Written-out JSON is offered only while it stays short: past that many elements
the curl example would be pages long, and the Python one builds the arrays instead."""

from __future__ import annotations

import json
import math
import shlex
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import numpy as np

from edged.core.request.datatypes import NUMPY_DTYPE_BY_WIRE_NAME
from edged.core.request.inference import InferInput, InferRequest
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.core.service import InferenceService, TensorMetadata

# The most elements the curl example writes out; larger inputs are left to the Python example.
CURL_MAX_ELEMENTS: Final = 64
# What a test request's answer shows of each output: its first values.
PREVIEW_VALUES: Final = 8


@dataclass(frozen=True, slots=True)
class TensorRow:
    name: str
    datatype: str
    shape: str  # "[-1, 4]": -1 a dimension of any size (the batch, for a batching model)
    optional: bool = False


@dataclass(frozen=True, slots=True)
class Signature:
    """What the model page shows of a READY model's interface, and the requests that call it."""

    inputs: tuple[TensorRow, ...]
    outputs: tuple[TensorRow, ...]
    curl: str | None  # None: the inputs are too large to write out
    python: str
    decoupled: bool


@dataclass(frozen=True, slots=True)
class OutputPreview:
    name: str
    datatype: str
    shape: str
    values: str


@dataclass(frozen=True, slots=True)
class TryResult:
    ok: bool
    text: str
    outputs: tuple[OutputPreview, ...] = ()


def signature(service: InferenceService, name: str, host: str, http_port: int, grpc_port: int) -> Signature | None:
    """None when no version of the model serves (its interface is known once it is loaded). ``host``: how the
    person reached the console, and so the device; the ports: the inference endpoints'."""
    try:
        metadata = service.model_metadata(name, -1)
        config = service.model_config(name, -1)
    except EdgedError:
        return None
    optional = {tensor.name for tensor in config.input if tensor.optional}
    inputs = tuple(_row(t, t.name in optional) for t in metadata.inputs)
    outputs = tuple(_row(t, False) for t in metadata.outputs)
    required = [t for t in metadata.inputs if t.name not in optional]
    decoupled = config.model_transaction_policy.decoupled
    return Signature(
        inputs,
        outputs,
        _curl(f"http://{host}:{http_port}", name, required),
        _python(
            f"{host}:{http_port}", f"{host}:{grpc_port}", name, required, [t.name for t in metadata.outputs], decoupled
        ),
        decoupled,
    )


async def try_model(service: InferenceService, name: str) -> TryResult:
    """Sends the model one request with sample inputs, as a client would, and shows what came back."""
    try:
        metadata = service.model_metadata(name, -1)
        config = service.model_config(name, -1)
    except EdgedError as exc:
        return TryResult(False, exc.message)
    if config.model_transaction_policy.decoupled:
        return TryResult(False, "a decoupled model answers over a stream: use the gRPC example to try it")
    optional = {tensor.name for tensor in config.input if tensor.optional}
    try:
        inputs = [_sample_input(t) for t in metadata.inputs if t.name not in optional]
    except EdgedError as exc:
        return TryResult(False, exc.message)
    request = InferRequest(model_name=name, model_version=-1, id=f"console-{uuid.uuid4().hex[:8]}", inputs=inputs)
    started = time.perf_counter()
    try:
        response = await service.infer(request)
    except EdgedError as exc:
        return TryResult(False, f"the request failed: {exc.message}")
    took_ms = (time.perf_counter() - started) * 1000
    previews = tuple(
        OutputPreview(output.name, output.datatype, str(list(output.shape)), _preview(output.data))
        for output in response.outputs
    )
    return TryResult(True, f"answered by version {response.model_version} in {took_ms:.1f} ms", previews)


def sample_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if dim < 0 else dim for dim in shape)


def _row(tensor: TensorMetadata, optional: bool) -> TensorRow:
    return TensorRow(tensor.name, tensor.datatype, str(list(tensor.shape)), optional)


def _sample_values(datatype: str, count: int) -> list[Any]:
    if datatype == "BYTES":
        return ["text"] * count
    if datatype == "BOOL":
        return [False] * count
    return [0] * count


def _curl(api_url: str, name: str, inputs: list[TensorMetadata]) -> str | None:
    counts = [math.prod(sample_shape(t.shape)) for t in inputs]
    if sum(counts) > CURL_MAX_ELEMENTS:
        return None
    body = {
        "inputs": [
            {
                "name": t.name,
                "shape": list(sample_shape(t.shape)),
                "datatype": t.datatype,
                "data": _sample_values(t.datatype, count),
            }
            for t, count in zip(inputs, counts, strict=True)
        ]
    }
    text = json.dumps(body, separators=(", ", ": "))
    url = shlex.quote(f"{api_url}/v2/models/{quote(name, safe='')}/infer")
    return f"curl -s -X POST {url} \\\n  -H 'Content-Type: application/json' \\\n  -d {shlex.quote(text)}"


def _python(
    http_host: str, grpc_host: str, name: str, inputs: list[TensorMetadata], outputs: list[str], decoupled: bool
) -> str:
    # A decoupled model answers over a gRPC stream, which the HTTP client cannot read.
    if decoupled:
        module, alias, host = "tritonclient.grpc", "grpcclient", grpc_host
    else:
        module, alias, host = "tritonclient.http", "httpclient", http_host
    lines = [
        "import numpy as np",
        f"import {module} as {alias}",
        "",
        f"client = {alias}.InferenceServerClient({json.dumps(host)})",
    ]
    lines.append("inputs = []")
    for tensor in inputs:
        shape = list(sample_shape(tensor.shape))
        if tensor.datatype == "BYTES":
            data = f'np.full({shape}, b"text", dtype=np.object_)'
        elif tensor.datatype == "BOOL":
            data = f"np.zeros({shape}, dtype=bool)"
        else:
            # tritonclient takes BF16 tensors as float32 arrays.
            dtype = NUMPY_DTYPE_BY_WIRE_NAME.get(tensor.datatype) or np.dtype(np.float32)
            data = f'np.zeros({shape}, dtype="{dtype.name}")'
        lines += [
            f'tensor = {alias}.InferInput({json.dumps(tensor.name)}, {shape}, "{tensor.datatype}")',
            f"tensor.set_data_from_numpy({data})",
            "inputs.append(tensor)",
        ]
    if decoupled:
        shown = ", ".join(f"result.as_numpy({json.dumps(output)})" for output in outputs)
        lines += [
            f"client.start_stream(callback=lambda result, error: print(error or ({shown},)))",
            f"client.async_stream_infer({json.dumps(name)}, inputs)",
            "client.stop_stream()  # waits for the model's last response",
        ]
    else:
        lines.append(f"result = client.infer({json.dumps(name)}, inputs)")
        lines += [f"print(result.as_numpy({json.dumps(output)}))" for output in outputs]
    return "\n".join(lines)


def _sample_input(tensor: TensorMetadata) -> InferInput:
    shape = sample_shape(tensor.shape)
    if tensor.datatype == "BYTES":
        data = np.full(shape, b"text", dtype=np.object_)
    else:
        dtype = NUMPY_DTYPE_BY_WIRE_NAME.get(tensor.datatype)
        if dtype is None and tensor.datatype != "BF16":
            raise EdgedError(ErrorCode.UNSUPPORTED, f"input '{tensor.name}': no sample for {tensor.datatype}")
        # BF16 travels as its 16-bit words (edged.core.request.tensors): zeros are zeros.
        data = np.zeros(shape, dtype=dtype if dtype is not None else np.uint16)
    return InferInput(tensor.name, tensor.datatype, shape, data)


def _preview(data: np.ndarray[Any, Any]) -> str:
    flat = data.reshape(-1)
    shown = [_value(v) for v in flat[:PREVIEW_VALUES]]
    more = f", … ({flat.size - PREVIEW_VALUES} more)" if flat.size > PREVIEW_VALUES else ""
    return ", ".join(shown) + more


def _value(value: Any) -> str:
    if isinstance(value, bytes):
        return repr(value)
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    return str(value)
