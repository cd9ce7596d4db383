"""The system shared memory extension over HTTP: regions the client creates, registered by name, carrying
inputs and outputs with no tensor bytes on the wire; every window checked against its region."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, assert_still_serving, post_json, request, run_server
from tritonclient.utils import InferenceServerException

from edged.core.request.inference import InferInput, InferRequest
from edged.core.shared_memory import SharedMemoryManager
from edged.errors import EdgedError

REGION_BYTES = 128


@pytest.fixture(scope="module")
def shm_server(bundled_repository: Path) -> Iterator[Server]:
    with run_server([bundled_repository], "--allow-client-shm=true") as running:
        yield running


@pytest.fixture
def shm_client(shm_server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(shm_server.http_url)
    yield client
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []
    client.close()


@pytest.fixture
def regions() -> Iterator[tuple[Any, Any, str, str]]:
    """An input region holding add_sub's two inputs and an empty output region, with unique keys."""
    tag = uuid.uuid4().hex[:8]
    in_key, out_key = f"/edged_test_in_{tag}", f"/edged_test_out_{tag}"
    inputs = shm.create_shared_memory_region("in", in_key, REGION_BYTES)
    outputs = shm.create_shared_memory_region("out", out_key, REGION_BYTES)
    shm.set_shared_memory_region(inputs, [ADD_SUB_INPUT0, ADD_SUB_INPUT1])
    yield inputs, outputs, in_key, out_key
    shm.destroy_shared_memory_region(inputs)
    shm.destroy_shared_memory_region(outputs)


def _shm_inputs(offset0: int = 0, offset1: int = 64) -> list[httpclient.InferInput]:
    first = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    first.set_shared_memory("in", 64, offset=offset0)
    second = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    second.set_shared_memory("in", 64, offset=offset1)
    return [first, second]


def _error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_disabled_unless_allowed(client: httpclient.InferenceServerClient, regions: tuple[Any, Any, str, str]) -> None:
    _, _, in_key, _ = regions
    error = _error(lambda: client.register_system_shared_memory("in", in_key, REGION_BYTES))
    assert error.status() == "501"
    assert (
        error.message()
        == "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
    )
    error = _error(lambda: client.unregister_system_shared_memory("in"))
    assert error.status() == "501"
    assert client.get_system_shared_memory_status() == []
    error = _error(lambda: client.infer("add_sub", _shm_inputs()))
    assert error.status() == "501"
    assert_still_serving(client)


def test_inputs_and_outputs_travel_through_regions(
    shm_client: httpclient.InferenceServerClient, regions: tuple[Any, Any, str, str]
) -> None:
    _, out_region, in_key, out_key = regions
    shm_client.register_system_shared_memory("in", in_key, REGION_BYTES)
    shm_client.register_system_shared_memory("out", out_key, REGION_BYTES)
    status = {entry["name"]: entry for entry in shm_client.get_system_shared_memory_status()}
    assert status == {
        "in": {"name": "in", "key": in_key, "offset": 0, "byte_size": REGION_BYTES},
        "out": {"name": "out", "key": out_key, "offset": 0, "byte_size": REGION_BYTES},
    }
    assert shm_client.get_system_shared_memory_status("in") == [status["in"]]

    sum_out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    sum_out.set_shared_memory("out", 64)
    diff_out = httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)
    diff_out.set_shared_memory("out", 64, offset=64)
    result = shm_client.infer("add_sub", _shm_inputs(), outputs=[sum_out, diff_out])

    outputs = result.get_response()["outputs"]
    assert [o["name"] for o in outputs] == ["OUTPUT0", "OUTPUT1"]
    # As Triton answers: the entry names the output, its type and shape; the bytes are in the region.
    assert outputs == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16]},
    ]
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out_region, np.float32, [1, 16]), ADD_SUB_INPUT0 + ADD_SUB_INPUT1
    )
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out_region, np.float32, [1, 16], offset=64), ADD_SUB_INPUT0 - ADD_SUB_INPUT1
    )
    assert_still_serving(shm_client)


def test_shared_memory_input_beside_binary_input(
    shm_client: httpclient.InferenceServerClient, regions: tuple[Any, Any, str, str]
) -> None:
    _, _, in_key, _ = regions
    shm_client.register_system_shared_memory("in", in_key, REGION_BYTES)
    first = _shm_inputs()[0]
    second = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    second.set_data_from_numpy(ADD_SUB_INPUT1 * 3)
    result = shm_client.infer("add_sub", [first, second])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + 3)


@pytest.mark.parametrize(
    ("offset", "size", "message"),
    [
        (100, 64, "Invalid offset + byte size for shared memory region: 'in'"),
        (REGION_BYTES, 1, "Invalid offset for shared memory region: 'in'"),
        (0, REGION_BYTES + 1, "Invalid offset + byte size for shared memory region: 'in'"),
        # A sum Triton's size_t cannot hold: refused in its words.
        (
            100,
            2**64 - 50,
            f"Integer overflow detected: byte_size ({2**64 - 50}) + offset (100) exceeds maximum value "
            f"({2**64 - 1}) for region 'in'",
        ),
    ],
    ids=["past-end", "at-end", "too-long", "overflow"],
)
def test_input_window_outside_the_region_is_refused(
    shm_server: Server,
    shm_client: httpclient.InferenceServerClient,
    regions: tuple[Any, Any, str, str],
    offset: int,
    size: int,
    message: str,
) -> None:
    _, _, in_key, _ = regions
    shm_client.register_system_shared_memory("in", in_key, REGION_BYTES)
    reply = post_json(
        shm_server.http_url,
        "/v2/models/add_sub/infer",
        {
            "inputs": [
                {
                    "name": n,
                    "shape": [1, 16],
                    "datatype": "FP32",
                    "parameters": {
                        "shared_memory_region": "in",
                        "shared_memory_byte_size": size,
                        "shared_memory_offset": offset,
                    },
                }
                for n in ("INPUT0", "INPUT1")
            ]
        },
    )
    assert reply.status == 400, reply
    assert reply.error() == message
    assert_still_serving(shm_client)


@pytest.mark.parametrize("value", [-1, 2**64 - 1, "8"], ids=["negative", "huge", "string"])
def test_malformed_window_values_are_refused(
    shm_server: Server,
    shm_client: httpclient.InferenceServerClient,
    regions: tuple[Any, Any, str, str],
    value: Any,
) -> None:
    _, _, in_key, _ = regions
    shm_client.register_system_shared_memory("in", in_key, REGION_BYTES)
    params = {"shared_memory_region": "in", "shared_memory_byte_size": 64, "shared_memory_offset": value}
    reply = post_json(
        shm_server.http_url,
        "/v2/models/add_sub/infer",
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "FP32", "parameters": params} for n in ("INPUT0", "INPUT1")
            ]
        },
    )
    assert reply.status in (400, 500), reply
    message = reply.error()
    assert "shared_memory_offset" in message or message == "Invalid offset for shared memory region: 'in'"
    assert_still_serving(shm_client)


def test_unregistered_region_is_refused(shm_client: httpclient.InferenceServerClient) -> None:
    error = _error(lambda: shm_client.infer("add_sub", _shm_inputs()))
    assert error.status() == "404"
    assert error.message() == "Unable to find shared memory region: 'in'"
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    output.set_shared_memory("nowhere", 64)
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor, array in zip(inputs, (ADD_SUB_INPUT0, ADD_SUB_INPUT1), strict=True):
        tensor.set_data_from_numpy(array)
    error = _error(lambda: shm_client.infer("add_sub", inputs, outputs=[output]))
    assert error.message() == "Unable to find shared memory region: 'nowhere'"
    assert_still_serving(shm_client)


def test_output_region_too_small(
    shm_client: httpclient.InferenceServerClient, regions: tuple[Any, Any, str, str]
) -> None:
    _, _, in_key, out_key = regions
    shm_client.register_system_shared_memory("in", in_key, REGION_BYTES)
    shm_client.register_system_shared_memory("out", out_key, REGION_BYTES)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    output.set_shared_memory("out", 32)
    error = _error(lambda: shm_client.infer("add_sub", _shm_inputs(), outputs=[output]))
    assert error.status() == "500"
    assert error.message() == (
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be at least 64 bytes "
        "to hold the results"
    )
    assert_still_serving(shm_client)


def test_registration_errors(
    shm_server: Server, shm_client: httpclient.InferenceServerClient, regions: tuple[Any, Any, str, str]
) -> None:
    _, _, in_key, _ = regions
    shm_client.register_system_shared_memory("in", in_key, REGION_BYTES)
    error = _error(lambda: shm_client.register_system_shared_memory("in", in_key, REGION_BYTES))
    assert error.status() == "400"
    assert error.message() == "shared memory region 'in' already in manager"

    error = _error(lambda: shm_client.register_system_shared_memory("x", "/edged_no_such_key", 8))
    assert error.status() == "500"
    assert error.message() == "Unable to open shared memory region: '/edged_no_such_key'"

    error = _error(lambda: shm_client.register_system_shared_memory("big", in_key, REGION_BYTES, offset=64))
    assert error.status() == "400"
    assert str(error.message()).startswith("failed to register shared memory region 'big': invalid args")

    error = _error(lambda: shm_client.get_system_shared_memory_status("nowhere"))
    assert error.status() == "404"

    for bad in (-1, 2**64 - 1):
        reply = post_json(
            shm_server.http_url,
            "/v2/systemsharedmemory/region/bad/register",
            {"key": in_key, "offset": 0, "byte_size": bad},
        )
        assert reply.status in (400, 500), reply
        reply.error()
    assert {r["name"] for r in shm_client.get_system_shared_memory_status()} == {"in"}
    assert_still_serving(shm_client)


@pytest.mark.parametrize("key", ["/../../etc/passwd", "/a/b", "", "relative/../../x"], ids=repr)
def test_keys_outside_dev_shm_or_internal_are_refused(shm_client: httpclient.InferenceServerClient, key: str) -> None:
    error = _error(lambda: shm_client.register_system_shared_memory("evil", key, 8))
    assert error.status() == "500"
    assert error.message() == f"Unable to open shared memory region: '{key}'"
    # The message echoes only what the client sent, never a server path.
    assert "/dev/shm" not in str(error.message())
    assert shm_client.get_system_shared_memory_status() == []


@pytest.mark.parametrize(
    ("key", "prefix"),
    [
        ("/edged-internal", "edged-"),
        ("/triton_python_backend_shm_region_7", "triton_python_backend_shm_region_"),
        ("///triton_python_backend_shm_region_7", "triton_python_backend_shm_region_"),
    ],
)
def test_reserved_keys_are_refused(shm_client: httpclient.InferenceServerClient, key: str, prefix: str) -> None:
    error = _error(lambda: shm_client.register_system_shared_memory("evil", key, 8))
    assert error.status() == "400"
    assert error.message() == (
        f"cannot register shared memory region 'evil' with key '{key}' as the key contains the reserved prefix "
        f"'{prefix}'"
    )
    error = _error(lambda: shm_client.register_system_shared_memory("evil", "//", 8))
    assert (error.status(), error.message()) == (
        "400",
        "cannot register shared memory region 'evil' - invalid shm key '//'",
    )
    assert shm_client.get_system_shared_memory_status() == []


def test_internal_region_is_refused_even_when_it_exists(shm_client: httpclient.InferenceServerClient) -> None:
    key = f"/edged-{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("internal", key, 8)
    try:
        error = _error(lambda: shm_client.register_system_shared_memory("internal", key, 8))
        assert error.status() == "400" and "reserved prefix 'edged-'" in str(error.message())
    finally:
        shm.destroy_shared_memory_region(region)


def test_unregister_unknown_and_all(
    shm_client: httpclient.InferenceServerClient, regions: tuple[Any, Any, str, str]
) -> None:
    _, _, in_key, out_key = regions
    shm_client.unregister_system_shared_memory("never-registered")
    shm_client.register_system_shared_memory("in", in_key, REGION_BYTES)
    shm_client.register_system_shared_memory("out", out_key, REGION_BYTES)
    shm_client.unregister_system_shared_memory("in")
    assert [r["name"] for r in shm_client.get_system_shared_memory_status()] == ["out"]
    shm_client.unregister_system_shared_memory()
    assert shm_client.get_system_shared_memory_status() == []


def test_cuda_shared_memory_is_unsupported(shm_server: Server, shm_client: httpclient.InferenceServerClient) -> None:
    assert shm_client.get_cuda_shared_memory_status() == []
    reply = post_json(
        shm_server.http_url,
        "/v2/cudasharedmemory/region/gpu/register",
        {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8},
    )
    assert reply.status == 501, reply
    assert "CUDA" in reply.error()
    assert request(shm_server.http_url, "POST", "/v2/cudasharedmemory/unregister").status == 200


def test_a_region_in_use_cannot_be_unregistered() -> None:
    # A request holds its regions from decoding until its reply is written; drive the real manager through one.
    key = f"/edged_test_use_{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("use", key, 64)
    manager = SharedMemoryManager(allowed=True)
    try:
        manager.register_system("use", key, 0, 64)
        tensor = InferInput(
            "INPUT0",
            "FP32",
            (16,),
            None,
            None,
            {
                "shared_memory_region": "use",
                "shared_memory_byte_size": 64,
            },
        )
        held = manager.bind_inputs(InferRequest("m", -1, "", [tensor]))
        assert tensor.raw is not None and len(tensor.raw) == 64
        with pytest.raises(
            EdgedError, match=re.escape("Cannot unregister shared memory region 'use', it is currently in use.")
        ):
            manager.unregister_system("use")
        with pytest.raises(EdgedError, match="Failed to unregister the following system shared memory regions: use ,"):
            manager.unregister_system("")
        manager.release(held)
        manager.unregister_system("use")
        assert manager.system_status("") == []
    finally:
        manager.close()
        shm.destroy_shared_memory_region(region)
    assert not os.path.exists(f"/dev/shm/{key[1:]}")
