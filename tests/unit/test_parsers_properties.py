"""Properties of every parser of bytes a client sends, in-process: what an encoder writes parses back to the same
tensors, and arbitrary input either parses or raises EdgedError with a code a client may be given, never another
exception, never a view outside the buffer it was given.

The parsers: the HTTP body (JSON header, Triton's binary tensor extension and its Inference-Header-Content-Length),
JSON ``data`` arrays, BYTES length prefixes, config.pbtxt text and the JSON form of a config, shared-memory windows
and the ``file:<version>/<path>`` overrides of the load API with the model names they are written under.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import msgspec
import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edged.core.config.defaults import normalize_model_config
from edged.core.config.model_config import model_config_from_json, model_config_to_json, parse_model_config
from edged.core.config.validation import validate_model_config
from edged.core.confined import PathOutsideRoot, inside
from edged.core.names import MAX_NAME_BYTES, model_name_problem
from edged.core.repository.files import make_private_copy, override_path
from edged.core.request.datatypes import CONFIG_BY_WIRE_NAME, NUMPY_DTYPE_BY_WIRE_NAME
from edged.core.request.inference import InferInput, InferRequest, RequestedOutput
from edged.core.request.tensors import (
    array_from_json,
    array_to_binary,
    array_to_json,
    deserialize_bytes_tensor,
    serialize_bytes_tensor,
)
from edged.core.request.validation import ModelSignature, TensorSpec, validate_request
from edged.core.shared_memory import SHM_DIRECTORY, SharedMemoryManager
from edged.errors import EdgedError, ErrorCode
from edged.frontends.http.codec import decode_infer_request, parse_header_length
from edged.proto.model_config_pb2 import ModelConfig

# Bounded so the whole file runs in seconds on a small machine; scripts/fuzz runs the byte parsers for longer.
FAST = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=40, deadline=4000, suppress_health_check=[HealthCheck.too_slow])

# JSON structure errors carry Triton's INTERNAL code (HTTP 500) on purpose, as tritonclient users expect; every
# other refusal of a body is INVALID_ARG.
HTTP_BODY_CODES = frozenset({ErrorCode.INVALID_ARG, ErrorCode.INTERNAL})

NUMERIC_TYPES = [name for name, dtype in NUMPY_DTYPE_BY_WIRE_NAME.items() if dtype is not None and name != "BYTES"]
# JSON carries no half-precision numbers (Triton refuses them); binary carries every type.
JSON_TYPES = [name for name in NUMERIC_TYPES if name != "FP16"]

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)


def _numeric_arrays(datatype: str, *, finite: bool) -> st.SearchStrategy[np.ndarray[Any, Any]]:
    dtype = NUMPY_DTYPE_BY_WIRE_NAME[datatype]
    assert dtype is not None
    width: Literal[16, 32, 64] = 16 if dtype.itemsize == 2 else 32 if dtype.itemsize == 4 else 64
    elements = st.floats(allow_nan=not finite, allow_infinity=not finite, width=width) if dtype.kind == "f" else None
    return hnp.arrays(dtype, shapes, elements=elements)


def _bytes_arrays() -> st.SearchStrategy[np.ndarray[Any, Any]]:
    return shapes.flatmap(
        lambda shape: st.lists(st.binary(max_size=12), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))).map(
            lambda items: _object_array(items, shape)
        )
    )


def _object_array(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.reshape(shape)


@st.composite
def tensors(draw: st.DrawFn) -> tuple[str, np.ndarray[Any, Any]]:
    datatype = draw(st.sampled_from([*NUMERIC_TYPES, "BYTES"]))
    array = draw(_bytes_arrays() if datatype == "BYTES" else _numeric_arrays(datatype, finite=False))
    return datatype, array


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def _assert_client_error(exc: EdgedError, codes: frozenset[ErrorCode]) -> None:
    assert exc.code in codes, f"{exc!r} has a code a client is not given for this input"
    assert "Traceback" not in exc.message


# --- HTTP: Inference-Header-Content-Length -----------------------------------------------------------------


@FAST
@given(value=st.none() | st.text(max_size=24) | st.integers().map(str), body_length=st.integers(0, 2**40))
def test_header_length_is_within_the_body_or_refused(value: str | None, body_length: int) -> None:
    try:
        length = parse_header_length(value, body_length)
    except EdgedError as exc:
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))
        return
    if value is None:
        assert length is None
    else:
        assert length is not None and 0 <= length <= body_length


# --- HTTP: the binary tensor extension and JSON tensors ------------------------------------------------------


def _binary_body(named: list[tuple[str, str, np.ndarray[Any, Any]]]) -> tuple[bytes, int]:
    """A body as tritonclient sends binary inputs: the JSON header, then each input's bytes in order."""
    header: dict[str, Any] = {"id": "p", "inputs": []}
    blobs: list[bytes] = []
    for name, datatype, array in named:
        blob = bytes(array_to_binary(array, datatype))
        header["inputs"].append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    encoded = msgspec.json.encode(header)
    return encoded + b"".join(blobs), len(encoded)


def _signature(named: list[tuple[str, str, np.ndarray[Any, Any]]]) -> ModelSignature:
    inputs = {name: TensorSpec(name, datatype, tuple(-1 for _ in array.shape)) for name, datatype, array in named}
    return ModelSignature("m", 0, inputs, {}, tuple(inputs))


def _as_bytes(array: np.ndarray[Any, Any]) -> list[bytes]:
    return [bytes(item) for item in array.ravel()]


@FAST
@given(st.lists(tensors(), min_size=1, max_size=3))
def test_binary_tensors_round_trip(drawn: list[tuple[str, np.ndarray[Any, Any]]]) -> None:
    named = [(f"IN{i}", datatype, array) for i, (datatype, array) in enumerate(drawn)]
    body, header_length = _binary_body(named)
    request, binary_default = decode_infer_request("m", -1, body, header_length)
    assert (request.id, binary_default) == ("p", False)
    _check_views_inside(request, body, header_length)
    validate_request(_signature(named), request)
    for (name, datatype, array), tensor in zip(named, request.inputs, strict=True):
        assert (tensor.name, tensor.datatype, tensor.shape) == (name, datatype, array.shape)
        assert tensor.data is not None
        if datatype == "BYTES":
            assert _as_bytes(tensor.data) == _as_bytes(array)
        else:
            # Compared bit for bit: NaN payloads and negative zeros come back as they were sent.
            assert tensor.data.tobytes() == np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


@FAST
@given(st.sampled_from([*JSON_TYPES, "BYTES"]).flatmap(lambda t: st.tuples(st.just(t), _json_arrays(t))))
def test_json_tensors_round_trip(drawn: tuple[str, np.ndarray[Any, Any]]) -> None:
    datatype, array = drawn
    wire = msgspec.json.encode(
        {
            "inputs": [
                {"name": "X", "datatype": datatype, "shape": list(array.shape), "data": array_to_json(array, datatype)}
            ]
        }
    )
    request, _ = decode_infer_request("m", -1, wire, None)
    (tensor,) = request.inputs
    assert tensor.data is not None and tensor.data.shape == array.shape
    if datatype == "BYTES":
        assert _as_bytes(tensor.data) == _as_bytes(array)
    else:
        assert tensor.data.dtype == array.dtype
        np.testing.assert_array_equal(tensor.data, array)


def _json_arrays(datatype: str) -> st.SearchStrategy[np.ndarray[Any, Any]]:
    if datatype == "BYTES":
        # JSON carries text: BYTES elements that are UTF-8.
        return _bytes_arrays().filter(lambda a: all(_is_utf8(item) for item in a.ravel()))
    return _numeric_arrays(datatype, finite=True)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@FAST
@given(
    datatype=st.sampled_from([*NUMERIC_TYPES, "BYTES", "BF16", "", "FP128"]),
    shape=st.lists(st.integers(0, 2**64), max_size=4).map(tuple),
    data=json_values,
)
def test_json_data_parses_or_is_refused(datatype: str, shape: tuple[int, ...], data: Any) -> None:
    try:
        array = array_from_json("X", datatype, shape, data)
    except EdgedError as exc:
        _assert_client_error(exc, HTTP_BODY_CODES)
        return
    assert array.shape == shape


input_entries = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["IN0", "IN1"]) | json_values,
        "datatype": st.sampled_from([*NUMERIC_TYPES, "BYTES"]) | json_values,
        "shape": st.lists(st.integers(-2, 6), max_size=3) | json_values,
    },
    optional={
        "data": st.lists(st.integers(-300, 300) | st.floats() | st.booleans() | st.text(max_size=3), max_size=8)
        | json_values,
        "parameters": st.fixed_dictionaries(
            {},
            optional={
                "binary_data_size": st.integers(-4, 2**64) | json_values,
                "shared_memory_region": st.text(max_size=4) | json_values,
                "shared_memory_byte_size": st.integers(-4, 2**64) | json_values,
                "shared_memory_offset": st.integers(-4, 2**64) | json_values,
            },
        )
        | json_values,
    },
)
headers = st.fixed_dictionaries(
    {"inputs": st.lists(input_entries, max_size=3) | json_values},
    optional={
        "id": st.text(max_size=4) | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_output", "triton_x", "k", "sequence_start"]), json_values, max_size=3
        )
        | json_values,
        "outputs": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=3) | json_values},
                optional={
                    "parameters": st.dictionaries(
                        st.sampled_from(
                            ["binary_data", "classification", "shared_memory_region", "shared_memory_byte_size"]
                        ),
                        json_values,
                        max_size=3,
                    )
                },
            ),
            max_size=2,
        )
        | json_values,
    },
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """An infer body near a valid one (a drawn header, then blobs) with the header length a client might claim."""
    header = msgspec.json.encode(draw(headers))
    tail = draw(st.binary(max_size=64))
    quotes = [i for i, byte in enumerate(header) if byte == ord('"')]
    in_string = draw(st.booleans())
    if quotes and in_string:
        # Right after a quote: often inside a string, where the bytes must still be UTF-8.
        cut = draw(st.sampled_from(quotes)) + 1
        header = header[:cut] + draw(st.binary(min_size=1, max_size=3)) + header[cut:]
    elif draw(st.booleans()):
        cut = draw(st.integers(0, len(header)))
        header = header[:cut] + draw(st.binary(max_size=4)) + header[cut:]
    body = header + tail
    claimed = draw(
        st.none() | st.just(str(len(header))) | st.integers(-2, len(body) + 2).map(str) | st.text(max_size=4)
    )
    return body, claimed


def _check_views_inside(request: InferRequest, body: bytes, header_length: int | None) -> None:
    """Every binary input is a view over the body, the blobs follow the JSON header one after the other, and together
    they reach exactly the end of the body."""
    start = len(body) if header_length is None else header_length
    for tensor in request.inputs:
        if tensor.raw is None:
            continue
        assert isinstance(tensor.raw, memoryview) and tensor.raw.obj is body
        assert bytes(tensor.raw) == body[start : start + len(tensor.raw)]
        start += len(tensor.raw)
    assert start == len(body)


@FAST
@given(bodies())
# Found by this test: msgspec raised UnicodeDecodeError, not DecodeError, for a string that is not UTF-8.
@example((b'{"\x80inputs":[]}', None))
@example((b'{"\x80inputs":[]}', "14"))
def test_infer_bodies_parse_or_are_refused(drawn: tuple[bytes, str | None]) -> None:
    body, claimed = drawn
    try:
        header_length = parse_header_length(claimed, len(body))
        request, _ = decode_infer_request("m", -1, body, header_length)
    except EdgedError as exc:
        _assert_client_error(exc, HTTP_BODY_CODES)
        return
    _check_views_inside(request, body, header_length)
    signature = ModelSignature(
        "m",
        0,
        {name: TensorSpec(name, "FP32", (-1,)) for name in ("IN0", "IN1")},
        {"OUT": TensorSpec("OUT", "FP32", (-1,))},
        (),
    )
    # Validation is where a binary blob meets its shape: it too parses or refuses, and never reads past the blob.
    try:
        validate_request(signature, request)
    except EdgedError as exc:
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))


@FAST
@given(
    drawn=st.lists(tensors(), min_size=1, max_size=3),
    sizes=st.lists(st.integers(0, 64), min_size=3, max_size=3),
    cut=st.integers(0, 64),
)
def test_binary_sizes_that_lie_are_refused(
    drawn: list[tuple[str, np.ndarray[Any, Any]]], sizes: list[int], cut: int
) -> None:
    """A header whose binary_data_size values (or a body cut short) disagree with the blobs after it."""
    named = [(f"IN{i}", datatype, array) for i, (datatype, array) in enumerate(drawn)]
    body, header_length = _binary_body(named)
    header = msgspec.json.decode(body[:header_length])
    for entry, size in zip(header["inputs"], sizes, strict=False):
        entry["parameters"]["binary_data_size"] = size
    encoded = msgspec.json.encode(header)
    body = encoded + body[header_length:]
    body = body[: max(len(encoded), len(body) - cut)]
    try:
        request, _ = decode_infer_request("m", -1, body, len(encoded))
        _check_views_inside(request, body, len(encoded))
        validate_request(_signature(named), request)
    except EdgedError as exc:
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))
        return
    for tensor in request.inputs:
        assert tensor.data is not None and tensor.raw is not None


@FAST
@given(body=st.binary(max_size=256), claimed=st.none() | st.integers(-1, 300).map(str))
def test_arbitrary_bytes_as_an_infer_body(body: bytes, claimed: str | None) -> None:
    try:
        header_length = parse_header_length(claimed, len(body))
        request, _ = decode_infer_request("m", -1, body, header_length)
    except EdgedError as exc:
        _assert_client_error(exc, HTTP_BODY_CODES)
        return
    _check_views_inside(request, body, header_length)


# --- BYTES length prefixes ---------------------------------------------------------------------------------


@FAST
@given(st.lists(st.binary(max_size=40) | st.text(max_size=10), max_size=20))
def test_bytes_prefixes_round_trip(items: list[bytes | str]) -> None:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    wire = serialize_bytes_tensor(array)
    expected = [item.encode() if isinstance(item, str) else item for item in items]
    assert deserialize_bytes_tensor(wire, "X") == expected
    assert len(wire) == sum(4 + len(item) for item in expected)


@FAST
@given(buffer=st.binary(max_size=300), limit=st.none() | st.integers(0, 10))
def test_bytes_prefixes_of_arbitrary_bytes(buffer: bytes, limit: int | None) -> None:
    try:
        elements = deserialize_bytes_tensor(memoryview(buffer), "X", limit)
    except EdgedError as exc:
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))
        return
    array = np.empty(len(elements), dtype=np.object_)
    array[:] = elements
    consumed = serialize_bytes_tensor(array)
    # What was read is exactly a prefix of the buffer (all of it unless the element limit stopped the reader).
    assert buffer.startswith(consumed)
    if limit is None:
        assert consumed == buffer
    else:
        assert len(elements) <= limit + 1


# --- config.pbtxt and the JSON form of a config ------------------------------------------------------------

config_names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
tensor_configs = st.fixed_dictionaries(
    {
        "name": config_names,
        "data_type": st.sampled_from(sorted(CONFIG_BY_WIRE_NAME.values())),
        "dims": st.lists(st.integers(-1, 2**40), max_size=4),
    }
)


@st.composite
def model_configs(draw: st.DrawFn) -> ModelConfig:
    config = ModelConfig(
        name=draw(config_names),
        backend=draw(st.sampled_from(["", "onnxruntime", "python"])),
        max_batch_size=draw(st.integers(0, 2**31 - 1)),
    )
    for fields in draw(st.lists(tensor_configs, max_size=3)):
        config.input.add(**fields)
    for fields in draw(st.lists(tensor_configs, max_size=3)):
        config.output.add(**fields)
    for key, value in draw(st.dictionaries(config_names, config_names, max_size=3)).items():
        config.parameters[key].string_value = value
    if draw(st.booleans()):
        config.dynamic_batching.max_queue_delay_microseconds = draw(st.integers(0, 2**64 - 1))
    return config


@FAST
@given(model_configs())
def test_config_text_and_json_round_trip(config: ModelConfig) -> None:
    assert parse_model_config(text_format.MessageToString(config), "m/config.pbtxt") == config
    assert model_config_from_json(model_config_to_json(config)) == config


pbtxt_tokens = st.sampled_from(
    [
        "name",
        ":",
        '"a"',
        "input",
        "[",
        "]",
        "{",
        "}",
        ",",
        "dims",
        "-1",
        "18446744073709551616",
        "data_type",
        "TYPE_FP32",
        "max_batch_size",
        "parameters",
        "key",
        "value",
        "string_value",
        "#",
        "\n",
        "'",
        '"\\x',
        "<",
        ">",
        "1e9",
        "nan",
        "dynamic_batching",
        "instance_group",
        "count",
        "kind",
        "KIND_GPU",
        "[ext.x]",
    ]
)


# Found by scripts/fuzz: an enum field given a number past int32 raised ValueError from protobuf.
@example("input [ { name: 'X' data_type: 99999999999 dims: [1] } ]")
@FAST
@given(st.lists(pbtxt_tokens, max_size=30).map(" ".join) | st.text(max_size=80))
def test_config_text_parses_or_is_refused(text: str) -> None:
    try:
        parse_model_config(text, "m/config.pbtxt")
    except EdgedError as exc:
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))
        assert exc.message.startswith("m/config.pbtxt"), exc.message


@FAST
@given(st.binary(max_size=120) | json_values.map(msgspec.json.encode))
def test_config_json_parses_or_is_refused(data: bytes) -> None:
    try:
        model_config_from_json(data)
    except EdgedError as exc:
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))


@FAST
@given(
    data_type=st.integers(-(2**31), 2**31 - 1) | st.sampled_from(["TYPE_FP32", "TYPE_STRING", "TYPE_BF16"]),
    dims=st.lists(st.integers(-2, 4), max_size=3),
    max_batch_size=st.integers(-1, 8),
)
# Found by scripts/fuzz: an enum number no data type has passed validation, then failed building the signature.
@example(data_type=32, dims=[1], max_batch_size=0)
def test_parsed_configs_validate_or_are_refused(data_type: int | str, dims: list[int], max_batch_size: int) -> None:
    text = (
        f'name: "m" backend: "python" max_batch_size: {max_batch_size} '
        f'input [ {{ name: "IN" data_type: {data_type} dims: {dims} }} ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    )
    try:
        config = parse_model_config(text, "m/config.pbtxt")
        normalize_model_config(config, ())
        validate_model_config(config)
    except EdgedError as exc:
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))
        return
    signature = ModelSignature.from_config(config)
    assert signature.inputs["IN"].datatype in NUMPY_DTYPE_BY_WIRE_NAME


# --- shared memory windows ---------------------------------------------------------------------------------

SHM_SIZE = 64


@pytest.fixture(scope="module")
def shm_object() -> Iterator[tuple[str, bytes]]:
    """A client's shared memory object: its key and contents."""
    name = f"edged_props_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    contents = bytes(range(SHM_SIZE))
    path = Path(SHM_DIRECTORY) / name
    path.write_bytes(contents)
    try:
        yield "/" + name, contents
    finally:
        path.unlink()


@contextlib.contextmanager
def _manager() -> Iterator[SharedMemoryManager]:
    manager = SharedMemoryManager(allowed=True)
    try:
        yield manager
    finally:
        manager.close()


offsets = st.integers(-2, SHM_SIZE + 2) | st.integers(-(2**64), 2**64)


@FAST
@given(offset=offsets, byte_size=offsets, start=offsets | st.booleans() | st.text(max_size=2), size=offsets)
def test_shared_memory_reads_stay_inside_the_window(
    shm_object: tuple[str, bytes], offset: int, byte_size: int, start: Any, size: int
) -> None:
    key, contents = shm_object
    with _manager() as manager:
        try:
            manager.register_system("r", key, offset, byte_size)
        except EdgedError as exc:
            _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))
            assert offset < 0 or byte_size <= 0 or offset + byte_size > SHM_SIZE
            return
        assert offset >= 0 and byte_size > 0 and offset + byte_size <= SHM_SIZE
        params: dict[str, Any] = {"shared_memory_region": "r", "shared_memory_byte_size": size}
        params["shared_memory_offset"] = start
        request = InferRequest("m", -1, "", [InferInput("X", "UINT8", (size,), None, None, params)])
        try:
            held = manager.bind_inputs(request)
        except EdgedError as exc:
            _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG}))
            return
        manager.release(held)
        assert isinstance(start, int) and not isinstance(start, bool)
        assert start >= 0 and size >= 0 and start + size <= byte_size
        raw = request.inputs[0].raw
        assert raw is not None and bytes(raw) == contents[offset + start : offset + start + size]


@FAST
@given(data=st.data())
def test_shared_memory_keys_stay_in_dev_shm(shm_object: tuple[str, bytes], data: st.DataObject) -> None:
    real, _ = shm_object
    # The key of an object that exists, spelled every way a client might (or might try to escape /dev/shm with).
    spellings = [real, real[1:], f"/..{real}", f"/../shm{real}", f"{real}/", f"/dev/shm{real}", f"{real}\0"]
    key = data.draw(
        st.sampled_from(spellings)
        | st.sampled_from(["", "/", ".", "..", "/../etc/passwd", "/edged-x", "edged-x", "a/b"])
        | st.text(max_size=20)
    )
    with _manager() as manager:
        try:
            manager.register_system("r", key, 0, 1)
        except EdgedError as exc:
            # A key that names no object here is the server's open failure, as Triton reports it.
            _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG, ErrorCode.INTERNAL}))
            return
        (status,) = manager.system_status("r")
        name = key.removeprefix("/")
        assert "/" not in name and name not in ("", ".", "..") and not name.startswith("edged-")
        assert os.path.dirname(os.path.join(SHM_DIRECTORY, name)) == SHM_DIRECTORY
        assert status.key == key


# --- load overrides and model names ------------------------------------------------------------------------

path_parts = st.sampled_from(["1", "2", "0", "01", "a", "..", ".", "", "model.onnx", "x\\y", "x\0", "é", "/"])
override_keys = st.lists(path_parts, min_size=0, max_size=4).map("/".join) | st.text(max_size=12)


@FAST
@given(override_keys)
def test_override_paths_are_relative_and_inside_the_model(key: str) -> None:
    try:
        path = override_path(key)
    except EdgedError as exc:
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG, ErrorCode.INTERNAL}))
        return
    # Anywhere inside the model's folder (a version's files, or beside the versions as Triton writes them), but
    # never its config, which is a parameter of its own.
    assert not path.is_absolute() and path.parts and path.parts != ("config.pbtxt",)
    assert not {"..", "."} & set(path.parts) and "\\" not in key and "\0" not in key
    assert str(path) == key


@SLOW
@given(files=st.dictionaries(override_keys, st.binary(max_size=8), max_size=4))
def test_override_files_are_written_inside_the_copy(
    tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes]
) -> None:
    root = tmp_path_factory.mktemp("copies")
    destination = root / "model"
    try:
        make_private_copy("model", destination, None, "name: 'model'", files)
    except EdgedError as exc:
        # INTERNAL: a name no file system holds, answered as Triton answers files it cannot write.
        _assert_client_error(exc, frozenset({ErrorCode.INVALID_ARG, ErrorCode.INTERNAL}))
        assert not destination.exists(), "a refused copy leaves nothing behind"
        return
    written = {
        PurePosixPath(os.path.relpath(os.path.join(folder, name), destination)).as_posix()
        for folder, _, names in os.walk(destination)
        for name in names
    }
    assert written == {*files, "config.pbtxt"}
    for key, content in files.items():
        assert (destination / key).read_bytes() == content
    assert sorted(os.listdir(root)) == ["model"]


@FAST
@given(st.text(max_size=40) | st.sampled_from([".", "..", "a/b", "..\\x", "x" * 256, "é" * 128]))
def test_model_names_are_one_folder_inside_the_root(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    root = tmp_path_factory.getbasetemp()
    problem = model_name_problem(name)
    if problem is not None:
        return
    assert len(name.encode("utf-8")) <= MAX_NAME_BYTES
    confined = inside(root, root / name)
    assert confined.parent == Path(os.path.realpath(root)) and confined.name == name


@FAST
@given(st.lists(st.sampled_from(["..", ".", "a", "", "b"]), max_size=4).map("/".join))
def test_confined_paths_never_leave_their_root(tmp_path_factory: pytest.TempPathFactory, relative: str) -> None:
    root = tmp_path_factory.getbasetemp() / "root"
    try:
        confined = inside(root, root / relative)
    except PathOutsideRoot:
        return
    real_root = os.path.realpath(root)
    assert os.path.commonpath([real_root, confined]) == real_root and str(confined) != real_root


def test_requested_outputs_keep_their_parameters() -> None:
    # A fixed example beside the properties: an output's shared-memory parameters survive parsing untouched.
    body = msgspec.json.encode(
        {
            "inputs": [{"name": "IN0", "datatype": "FP32", "shape": [1], "data": [1.5]}],
            "outputs": [{"name": "OUT", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}],
        }
    )
    request, _ = decode_infer_request("m", -1, body, None)
    assert request.outputs == [RequestedOutput("OUT", 0, {"shared_memory_region": "r", "shared_memory_byte_size": 4})]
