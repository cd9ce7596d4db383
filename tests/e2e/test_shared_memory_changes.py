"""A client's shared memory object changes under the daemon: truncated, shrunk or unlinked after registration.

The daemon never maps a client's object (edged.core.shared_memory), so none of this can kill it with SIGBUS: a
window that is no longer there is an error for that request, over HTTP and gRPC, for inputs and outputs; the
registration stays and works again once the size is restored; an unlinked object keeps working. The regions here
are made with plain file calls, never mapped by the test either, so a truncation cannot hurt the test process.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, assert_still_serving, run_server
from tritonclient.utils import InferenceServerException

BYTES = 128  # INPUT0 at 0, INPUT1 at 64 in the input region; OUTPUT0 at 0, OUTPUT1 at 64 in the output region
GONE = "no longer holds its registered window"


@pytest.fixture(scope="module")
def shm_server(bundled_repository: Path) -> Iterator[Server]:
    with run_server([bundled_repository], "--allow-client-shm=true") as running:
        yield running


class Region:
    """A POSIX shared memory object of the test's own: /dev/shm/<key>, written and read with pread/pwrite."""

    def __init__(self, data: bytes = b"") -> None:
        self.key = f"/edged_change_{uuid.uuid4().hex[:10]}"
        self.path = Path("/dev/shm") / self.key[1:]
        with self.path.open("wb") as handle:
            handle.write(data.ljust(BYTES, b"\0"))

    def resize(self, size: int) -> None:
        os.truncate(self.path, size)

    def read(self, offset: int, size: int) -> bytes:
        return self.path.read_bytes()[offset : offset + size]

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture
def regions() -> Iterator[tuple[Region, Region]]:
    inputs = Region(ADD_SUB_INPUT0.tobytes() + ADD_SUB_INPUT1.tobytes())
    outputs = Region()
    yield inputs, outputs
    inputs.remove()
    outputs.remove()


def _http(server: Server) -> tuple[httpclient.InferenceServerClient, Callable[[], Any]]:
    client = httpclient.InferenceServerClient(server.http_url)

    def infer() -> Any:
        tensors = []
        for name, offset in (("INPUT0", 0), ("INPUT1", 64)):
            tensor = httpclient.InferInput(name, [1, 16], "FP32")
            tensor.set_shared_memory("in", 64, offset=offset)
            tensors.append(tensor)
        outputs = []
        for name, offset in (("OUTPUT0", 0), ("OUTPUT1", 64)):
            output = httpclient.InferRequestedOutput(name, binary_data=True)
            output.set_shared_memory("out", 64, offset=offset)
            outputs.append(output)
        return client.infer("add_sub", tensors, outputs=outputs)

    return client, infer


def _grpc(server: Server) -> tuple[grpcclient.InferenceServerClient, Callable[[], Any]]:
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def infer() -> Any:
        tensors = []
        for name, offset in (("INPUT0", 0), ("INPUT1", 64)):
            tensor = grpcclient.InferInput(name, [1, 16], "FP32")
            tensor.set_shared_memory("in", 64, offset=offset)
            tensors.append(tensor)
        outputs = []
        for name, offset in (("OUTPUT0", 0), ("OUTPUT1", 64)):
            output = grpcclient.InferRequestedOutput(name)
            output.set_shared_memory("out", 64, offset=offset)
            outputs.append(output)
        return client.infer("add_sub", tensors, outputs=outputs)

    return client, infer


PROTOCOLS = {"http": _http, "grpc": _grpc}
EXPECTED_STATUS = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


def _served(outputs: Region) -> None:
    np.testing.assert_array_equal(np.frombuffer(outputs.read(0, 64), np.float32), (ADD_SUB_INPUT0 + ADD_SUB_INPUT1)[0])
    np.testing.assert_array_equal(np.frombuffer(outputs.read(64, 64), np.float32), (ADD_SUB_INPUT0 - ADD_SUB_INPUT1)[0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("which", ["input", "output"])
@pytest.mark.parametrize("size", [0, 1, 96], ids=["truncated", "one-byte", "shrunk"])
def test_a_region_cut_short_is_an_error_for_that_request(
    shm_server: Server, regions: tuple[Region, Region], protocol: str, which: str, size: int
) -> None:
    inputs, outputs = regions
    client, infer = PROTOCOLS[protocol](shm_server)
    client.register_system_shared_memory("in", inputs.key, BYTES)
    client.register_system_shared_memory("out", outputs.key, BYTES)
    try:
        infer()
        _served(outputs)
        (inputs if which == "input" else outputs).resize(size)
        with pytest.raises(InferenceServerException) as caught:
            infer()
        assert caught.value.status() == EXPECTED_STATUS[protocol]
        message = str(caught.value.message())
        assert GONE in message and f"is {size} bytes now" in message
        # The registration stays, and serves again once the object has its size back.
        assert _region_names(client) == {"in", "out"}
        region = inputs if which == "input" else outputs
        region.resize(BYTES)
        if which == "input":
            with region.path.open("r+b") as handle:
                handle.write(ADD_SUB_INPUT0.tobytes() + ADD_SUB_INPUT1.tobytes())
        infer()
        _served(outputs)
    finally:
        client.unregister_system_shared_memory()
    assert_still_serving(httpclient.InferenceServerClient(shm_server.http_url))


def _region_names(client: Any) -> set[str]:
    status = client.get_system_shared_memory_status()
    if isinstance(status, list):  # HTTP: a list of regions
        return {str(region["name"]) for region in status}
    return set(status.regions)  # gRPC: a map by name


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unlinked_region_keeps_working(shm_server: Server, regions: tuple[Region, Region], protocol: str) -> None:
    inputs, outputs = regions
    client, infer = PROTOCOLS[protocol](shm_server)
    client.register_system_shared_memory("in", inputs.key, BYTES)
    client.register_system_shared_memory("out", outputs.key, BYTES)
    try:
        with outputs.path.open("rb") as kept:  # the client's own hold on the object, as its mapping would be
            inputs.remove()
            outputs.remove()
            infer()
            data = kept.read()
        np.testing.assert_array_equal(np.frombuffer(data[:64], np.float32), (ADD_SUB_INPUT0 + ADD_SUB_INPUT1)[0])
    finally:
        client.unregister_system_shared_memory()
    assert _region_names(client) == set()


def test_truncation_between_many_requests_never_kills_the_daemon(
    shm_server: Server, regions: tuple[Region, Region]
) -> None:
    inputs, outputs = regions
    client, infer = _http(shm_server)
    client.register_system_shared_memory("in", inputs.key, BYTES)
    client.register_system_shared_memory("out", outputs.key, BYTES)
    outcomes = {"served": 0, "refused": 0}
    try:
        for round_ in range(40):
            (inputs if round_ % 2 else outputs).resize(BYTES if round_ % 4 < 2 else round_ % 3 * 40)
            try:
                infer()
                outcomes["served"] += 1
            except InferenceServerException as exc:
                assert GONE in str(exc.message()), exc
                outcomes["refused"] += 1
    finally:
        client.unregister_system_shared_memory()
    assert outcomes["served"] and outcomes["refused"]
    assert shm_server.process.poll() is None
    assert_still_serving(client)
