"""Bad inputs, the classes of SECURITY.md (1-23 here): each gets a precise status, the daemon and its other models keep
serving, nothing is written where it does not belong and no error names an internal path.

Many classes are covered where their feature is tested; this module adds what those leave open, against one
daemon with default limits (explicit model control, every model loaded). Class -> tests:

| #  | class                        | covered by                                                                       |
|----|------------------------------|----------------------------------------------------------------------------------|
| 1  | file override traversal      | test_model_control.py::test_override_paths_that_leave_the_model_are_refused,     |
|    |                              | ::test_an_override_does_not_follow_links_out_of_the_model; test_model_names.py:: |
|    |                              | test_grpc_load_with_files_writes_nothing_outside,                                |
|    |                              | ::test_a_load_override_lands_in_the_state_directory_only                         |
| 2  | log file over the network    | test_logging.py::test_http_log_file_is_refused, ::test_grpc_log_file_is_refused  |
| 3  | shared-memory bounds         | test_shared_memory.py::test_input_window_outside_the_region_is_refused,          |
|    |                              | ::test_malformed_window_values_are_refused, ::test_registration_errors,          |
|    |                              | ::test_output_region_too_small; test_grpc_shared_memory.py::                     |
|    |                              | test_window_outside_the_region_is_refused, ::test_registration_errors            |
| 4  | load API integer overflow    | test_model_control.py::test_invalid_load_bodies (bad base64); here TestLoadFiles |
| 5  | shape / byte-size overflow   | test_http_errors.py::test_json_data_length_not_matching_shape,                   |
|    |                              | ::test_binary_data_length_not_matching_shape, ::test_bytes_element_cut_short,    |
|    |                              | ::test_huge_shape_with_a_zero_dimension; test_grpc_errors.py::                   |
|    |                              | test_raw_contents_size_mismatch, ::test_bytes_element_cut_short,                 |
|    |                              | ::test_negative_dimensions_are_refused,                                          |
|    |                              | ::test_a_huge_shape_is_refused_before_numpy_sees_it; here TestShapeOverflow      |
| 6  | JSON recursion               | test_http_errors.py::test_deeply_nested_data_is_refused,                         |
|    |                              | ::test_deeply_nested_parameters_are_refused; here TestJsonDepth (the limit of    |
|    |                              | 100 itself, on infer and the other routes)                                       |
| 7  | chunked-transfer floods      | here TestChunkFloods                                                             |
| 8  | internal names in errors     | test_shared_memory.py::test_keys_outside_dev_shm_or_internal_are_refused,        |
|    |                              | ::test_internal_region_is_refused_even_when_it_exists; test_http_repository.py:: |
|    |                              | test_reasons_do_not_reveal_server_paths; here TestNoInternalNames                |
| 9  | metacharacters in names      | test_model_names.py (the whole module); test_python_backend.py::                 |
|    |                              | test_a_model_name_with_shell_metacharacters_is_refused                           |
| 10 | decompression bomb           | test_http_errors.py::test_compressed_body_that_inflates_over_the_limit_is_refused|
|    |                              | (a small limit); here TestDecompressionBombs (10 MB -> 10 GB at the default      |
|    |                              | limit, gzip and deflate, and gRPC's own compression)                             |
| 11 | oversized payload            | test_http_errors.py::test_body_over_the_limit_is_413,                            |
|    |                              | ::test_chunked_body_over_the_limit_is_413,                                       |
|    |                              | ::test_client_sees_413_and_small_requests_still_work; test_http_connection.py::  |
|    |                              | test_a_declared_body_over_the_limit_is_refused_at_once; test_grpc_errors.py::    |
|    |                              | test_message_over_the_limit_is_resource_exhausted                                |
| 12 | config path fields           | here TestConfigPathFields                                                        |
| 13 | alternate routes             | history API: test_model_names.py::test_unload_and_history_refuse_such_names;     |
|    |                              | console and sync routes: not built yet                                           |
| 14 | archive slip                 | not built yet (model archives); Python environment archives:                     |
|    |                              | test_python_environment.py                                                       |
| 15 | authentication bypass        | being built separately (access policy)                                           |
| 16 | feature-off paths            | test_shared_memory.py::test_disabled_unless_allowed; test_grpc_errors.py::       |
|    |                              | test_shared_memory_input_while_disabled; test_shared_memory_changes.py (regions  |
|    |                              | cut short or unlinked while in use)                                              |
| 17 | unbounded response queues    | here TestStreamBacklog                                                           |
| 18 | HTTP/2 header-block cost     | test_grpc_http2_attacks.py::test_a_header_block_past_the_bound_is_refused_from_  |
|    |                              | its_frame_header, ::test_a_megabyte_of_table_size_updates_does_not_stall_the_    |
|    |                              | loop, ::test_more_than_two_table_size_updates_are_refused,                       |
|    |                              | ::test_a_settings_frame_of_many_entries_is_refused_whole                         |
| 19 | HTTP/2 control-frame floods  | test_grpc_http2_attacks.py::test_a_ping_flood_from_a_client_that_reads_nothing_  |
|    |                              | ends_and_memory_stays_flat, ::test_a_flood_is_answered_enhance_your_calm         |
|    |                              | (SETTINGS, rapid reset, empty CONTINUATION and DATA, unknown frames)             |
| 20 | held request bodies          | test_grpc_http2_attacks.py::test_request_bytes_are_bounded_per_connection_and_   |
|    |                              | for_the_endpoint, ::test_a_request_that_stops_arriving_is_refused_and_its_       |
|    |                              | connection_idles_out, ::test_a_reply_whose_client_opens_no_window_is_reset       |
| 21 | per-connection caches        | test_grpc_http2_attacks.py::test_distinct_large_header_blocks_on_many_           |
|    |                              | connections_are_not_kept, ::test_streams_past_the_endpoint_bound_are_refused     |
| 22 | expired deadlines            | test_grpc_http2_attacks.py::test_an_expired_deadline_is_answered_at_once_and_    |
|    |                              | frees_its_stream                                                                 |
| 23 | malformed HTTP/2 requests    | test_grpc_http2_attacks.py::test_a_malformed_request_is_a_stream_error_and_the_  |
|    |                              | connection_goes_on, ::test_trailers_from_the_client_are_checked_too;             |
|    |                              | test_grpc_http2.py (malformed frames); test_frontend_workers.py::test_metadata_  |
|    |                              | grpc_cannot_send_is_not_relayed_by_a_worker                                      |
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import socket
import struct
import textwrap
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
import modelgen
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import (
    Reply,
    Server,
    add_sub_inputs,
    api_token,
    assert_grpc_still_serving,
    assert_still_serving,
    bearer,
    post_json,
    request,
    run_server,
)
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

MIB: Final = 1024 * 1024
# Triton's defaults, which are edged's.
MAX_JSON_DEPTH: Final = 100
MAX_CHUNKS: Final = 65536
MAX_QUEUED_STREAM_BYTES: Final = 64 * MIB
DEFAULT_MAX_INPUT_SIZE: Final = 64 * MIB
INFER: Final = "/v2/models/add_sub/infer"

# A decoupled model that answers COUNT responses of SIZE bytes each, as fast as it can, until cancelled.
FLOOD_MODEL: Final = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])
            sender = request.get_response_sender()
            block = np.ones(size, dtype=np.uint8)
            sent = 0
            while sent < count and not request.is_cancelled():
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", block)]))
                sent += 1
            if request.is_cancelled():
                pb_utils.Logger.log_info(f"request '{request.request_id()}' cancelled after {sent} responses")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
FLOOD_CONFIG: Final = """
name: "flood"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SIZE" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
# A Python model that fails every request with an exception from its own file.
RAISER_MODEL: Final = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("no answer from this model")
"""
RAISER_CONFIG: Final = """
name: "%s"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
# A Python model that answers once the test lets it (the file its request's parameter "release" names, logged when it
# begins to wait): an answer still owed while the client pipelines the next request, for as long as the test needs.
SLEEPER_MODEL: Final = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            release = json.loads(request.parameters()).get("release")
            if release:
                pb_utils.Logger.log_info(f"sleeper holds its answer until {release} exists")
                deadline = time.monotonic() + 60  # only ends a test that failed
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""
# A Python model whose exception names a file in its own folder, as a model reading its weights would.
LEAKY_MODEL: Final = """
class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        open(self.folder + "/weights.bin")
"""


@dataclass(frozen=True)
class Site:
    """The daemon, where its repository and state live, and the folder around both (nothing else is written)."""

    server: Server
    root: Path
    repository: Path
    state: Path

    def outside_state(self) -> dict[str, int]:
        """Every file under the root but the state directory's, with its size."""
        return {
            str(path.relative_to(self.root)): path.stat().st_size if path.is_file() else -1
            for path in sorted(self.root.rglob("*"))
            if self.state not in path.parents and path != self.state
        }


def _python_model(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code, encoding="utf-8")
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip(), encoding="utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("bad-inputs")
    repo = root / "repo"
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_identity(repo / "identity_fp32", "FP32", max_batch_size=8, dims=[-1])
    modelgen.write_identity(repo / "identity_bytes", "BYTES", max_batch_size=8, dims=[-1])
    _python_model(repo, "flood", FLOOD_MODEL, FLOOD_CONFIG)
    _python_model(repo, "raiser", RAISER_MODEL, RAISER_CONFIG % "raiser")
    _python_model(repo, "leaky", LEAKY_MODEL, RAISER_CONFIG % "leaky")
    state = root / "state"
    with run_server([repo], "--model-control-mode=explicit", "--load-model=*", f"--state-dir={state}") as server:
        yield Site(server, root, repo, state)


@pytest.fixture(scope="module")
def client(site: Site) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(site.server.http_url, network_timeout=60.0)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def grpc_client(site: Site) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(site.server.grpc_url)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def stub(site: Site) -> Iterator[Any]:
    with grpc.insecure_channel(site.server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(autouse=True)
def _every_model_still_serves(
    site: Site, client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> Iterator[None]:
    """After every test: both endpoints still infer, and nothing appeared outside the state directory."""
    before = site.outside_state()
    yield
    assert_still_serving(client)
    assert_grpc_still_serving(grpc_client)
    assert site.outside_state() == before


def _rss_bytes(server: Server) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def _expect(reply: Reply, status: int, fragment: str) -> str:
    assert reply.status == status, reply
    message = reply.error()
    assert fragment in message, message
    return message


def _grpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def _good_request(padding: int = 0) -> bytes:
    """add_sub's request as JSON, with ``padding`` spaces of insignificant whitespace at its end."""
    document = {
        "inputs": [
            {"name": name, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16} for name in ("INPUT0", "INPUT1")
        ]
    }
    return json.dumps(document, separators=(",", ":")).encode() + b" " * padding


def _raw_grpc_request(model: str, shape: list[int], datatype: str, raw: bytes, name: str = "INPUT0") -> Any:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype=datatype)
    tensor.shape.extend(shape)
    request.raw_input_contents.append(raw)
    return request


# ------------------------------------------------------------------------------------------------------------
# 4. load API integer overflow: huge or odd base64 lengths in file: contents


class TestLoadFiles:
    @pytest.mark.parametrize("content", ["QQ", "QQ=", "Q", "QQ==QQ==", "!" * 4, "QUFB" * 3 + "Q"], ids=repr)
    def test_base64_of_an_odd_length_is_refused(self, site: Site, content: str) -> None:
        config = json.dumps({"name": "scratch", "backend": "onnxruntime"})
        reply = post_json(
            site.server.http_url,
            "/v2/repository/models/scratch/load",
            {"parameters": {"config": config, "file:1/model.onnx": content}},
            bearer(api_token(site.server)),  # overrides need a credential, from loopback too
        )
        _expect(reply, 400, "'file:1/model.onnx' is not valid base64")

    def test_a_file_past_the_body_limit_is_413_before_it_is_decoded(self, site: Site) -> None:
        content = base64.b64encode(bytes(DEFAULT_MAX_INPUT_SIZE)).decode()
        body = json.dumps({"parameters": {"config": "{}", "file:1/model.onnx": content}})
        reply = request(site.server.http_url, "POST", "/v2/repository/models/scratch/load", body)
        assert reply.status == 413, reply
        assert reply.error()

    def test_a_grpc_file_past_the_message_limit_is_resource_exhausted(self, stub: Any) -> None:
        load = service_pb2.RepositoryModelLoadRequest(model_name="scratch")
        load.parameters["config"].string_param = "{}"
        load.parameters["file:1/model.onnx"].bytes_param = bytes(DEFAULT_MAX_INPUT_SIZE + 1)
        error = _grpc_error(lambda: stub.RepositoryModelLoad(load))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# ------------------------------------------------------------------------------------------------------------
# 5. shape / byte-size overflow: element counts past any memory, dims that overflow int64 products, data whose
# length disagrees with shape x dtype, BYTES length prefixes that point past the end


# The most elements a tensor may have (2**40): checked before anything is allocated.
MAX_ELEMENTS: Final = 1099511627776
SHAPES_PAST_ANY_MEMORY: Final = [[1, 2**62], [1, 2**31, 2**31], [1, 2**63 - 1]]
INT64_MAX: Final = 2**63 - 1
# Triton's words (its qa/L0_http checks them): an element count past int64, or a byte size past it.
COUNT_OVERFLOW: Final = f"causes total element count to exceed maximum size of {INT64_MAX}"
BYTES_OVERFLOW: Final = f"* data type size (4) exceeds maximum allowed size ({INT64_MAX})"
TOO_DEEP: Final = f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"


class TestShapeOverflow:
    @pytest.mark.parametrize("shape", SHAPES_PAST_ANY_MEMORY, ids=str)
    def test_http_binary_data_for_a_huge_shape(self, site: Site, shape: list[int]) -> None:
        header = json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
        ).encode()
        reply = request(
            site.server.http_url,
            "POST",
            "/v2/models/identity_fp32/infer",
            header + bytes(16),
            {"Inference-Header-Content-Length": str(len(header))},
        )
        count = shape[1] * (shape[2] if len(shape) > 2 else 1)
        _expect(reply, 400, f"byte size overflow for input 'INPUT0': element count ({count}) {BYTES_OVERFLOW}")

    def test_http_batch_dimension_past_any_memory(self, site: Site) -> None:
        reply = post_json(
            site.server.http_url,
            "/v2/models/identity_fp32/infer",
            {"inputs": [{"name": "INPUT0", "shape": [2**62, 4], "datatype": "FP32", "data": [1.0] * 4}]},
        )
        _expect(reply, 400, f"invalid shape for input 'INPUT0': shape [4611686018427387904,4] {COUNT_OVERFLOW}")

    def test_http_dimension_past_uint64(self, site: Site) -> None:
        reply = post_json(
            site.server.http_url,
            "/v2/models/identity_fp32/infer",
            {"inputs": [{"name": "INPUT0", "shape": [1, 2**64], "datatype": "FP32", "data": [1.0]}]},
        )
        _expect(reply, 400, f"invalid shape for input 'INPUT0': shape [1,{2**64}] {COUNT_OVERFLOW}")

    def test_http_past_the_devices_memory_but_not_int64(self, site: Site) -> None:
        reply = post_json(
            site.server.http_url,
            "/v2/models/identity_fp32/infer",
            {"inputs": [{"name": "INPUT0", "shape": [1, 2**41], "datatype": "FP32", "data": [1.0]}]},
        )
        _expect(reply, 400, f"input 'INPUT0' has shape [1,{2**41}], more than {MAX_ELEMENTS} elements")

    @pytest.mark.parametrize("shape", SHAPES_PAST_ANY_MEMORY, ids=str)
    def test_grpc_raw_contents_for_a_huge_shape(self, stub: Any, shape: list[int]) -> None:
        error = _grpc_error(lambda: stub.ModelInfer(_raw_grpc_request("identity_fp32", shape, "FP32", bytes(16))))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert str(error.details()).endswith(BYTES_OVERFLOW), error.details()

    def test_grpc_batch_dimension_past_any_memory(self, stub: Any) -> None:
        error = _grpc_error(lambda: stub.ModelInfer(_raw_grpc_request("identity_fp32", [2**62, 4], "FP32", bytes(16))))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert str(error.details()).endswith(COUNT_OVERFLOW), error.details()

    @pytest.mark.parametrize("prefix", [2**32 - 1, 2**31, 17], ids=["uint32-max", "int32-min", "one-past"])
    def test_bytes_length_prefix_past_the_end(self, site: Site, stub: Any, prefix: int) -> None:
        element = struct.pack("<I", prefix) + b"x" * 16
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [1, 1],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(element)},
                    }
                ]
            }
        ).encode()
        reply = request(
            site.server.http_url,
            "POST",
            "/v2/models/identity_bytes/infer",
            header + element,
            {"Inference-Header-Content-Length": str(len(header))},
        )
        assert reply.status == 400, reply
        assert reply.error()
        error = _grpc_error(lambda: stub.ModelInfer(_raw_grpc_request("identity_bytes", [1, 1], "BYTES", element)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()

    def test_data_longer_than_the_shape_on_both_wires(self, site: Site, stub: Any) -> None:
        header = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 12}}
                ]
            }
        ).encode()
        reply = request(
            site.server.http_url,
            "POST",
            "/v2/models/identity_fp32/infer",
            header + bytes(12),
            {"Inference-Header-Content-Length": str(len(header))},
        )
        assert reply.status == 400, reply
        error = _grpc_error(lambda: stub.ModelInfer(_raw_grpc_request("identity_fp32", [1, 2], "FP32", bytes(12))))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


# ------------------------------------------------------------------------------------------------------------
# 6. JSON recursion: Triton's limit of 100 levels, where nothing else in the request would refuse the document


def _nested_extra(levels: int) -> bytes:
    """add_sub's request with an extra (ignored) member nested so that the document has ``levels`` levels in all."""
    body = _good_request()
    extra = b"[" * (levels - 1) + b"]" * (levels - 1)
    return body[:-1] + b',"extra":' + extra + b"}"


class TestJsonDepth:
    def test_a_document_at_the_limit_is_served(self, site: Site) -> None:
        reply = request(site.server.http_url, "POST", INFER, _nested_extra(MAX_JSON_DEPTH))
        assert reply.status == 200, reply

    @pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 500, 990, 5000])
    def test_a_document_past_the_limit_is_refused(self, site: Site, levels: int) -> None:
        reply = request(site.server.http_url, "POST", INFER, _nested_extra(levels))
        _expect(reply, 400, TOO_DEEP)

    @pytest.mark.parametrize("padding", [0, 100_000], ids=["small", "large"])
    def test_a_json_header_before_binary_data(self, site: Site, padding: int) -> None:
        deep = _nested_extra(MAX_JSON_DEPTH + 1) + b" " * padding
        reply = request(site.server.http_url, "POST", INFER, deep, {"Inference-Header-Content-Length": str(len(deep))})
        _expect(reply, 400, TOO_DEEP)
        at_limit = _nested_extra(MAX_JSON_DEPTH) + b" " * padding
        reply = request(
            site.server.http_url, "POST", INFER, at_limit, {"Inference-Header-Content-Length": str(len(at_limit))}
        )
        assert reply.status == 200, reply

    def test_gzip_bodies_are_measured_once_inflated(self, site: Site) -> None:
        reply = request(
            site.server.http_url,
            "POST",
            INFER,
            zlib.compress(_nested_extra(MAX_JSON_DEPTH + 1)),
            {"Content-Encoding": "deflate"},
        )
        _expect(reply, 400, TOO_DEEP)

    @pytest.mark.parametrize(
        "path",
        ["/v2/logging", "/v2/repository/index", "/v2/repository/models/add_sub/unload"],
    )
    def test_other_routes_refuse_it_too(self, site: Site, path: str) -> None:
        deep = b'{"x":' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"
        _expect(request(site.server.http_url, "POST", path, deep), 400, TOO_DEEP)

    def test_wide_documents_are_not_deep(self, site: Site) -> None:
        # Many brackets side by side: the count alone is no reason to refuse.
        body = _good_request()[:-1] + b',"extra":[' + b",".join([b"[[1]]"] * 10_000) + b"]}"
        assert request(site.server.http_url, "POST", INFER, body).status == 200


# ------------------------------------------------------------------------------------------------------------
# 7. chunked-transfer floods: Triton's limit of 65,536 chunks per body, then 400 and the connection closed


def _chunked(body: bytes, size: int = 1) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def _send_raw(server: Server, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, bool]:
    """One request on a fresh socket: the status, the whole answer, and whether the server then closed."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        closed = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                closed = True
                break
            answer += data
            if b"\r\n\r\n" in answer and b"connection: close" not in answer.lower():
                head_end = answer.index(b"\r\n\r\n") + 4
                length = int(answer.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(answer) >= head_end + length:
                    break
    status = int(answer.split(b" ", 2)[1]) if answer else 0
    return status, answer, closed


FEW_CHUNKS: Final = 8
SHALLOW: Final = 4


@pytest.fixture(scope="module")
def few_chunks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A daemon that takes bodies of at most FEW_CHUNKS chunks (and JSON at most SHALLOW levels deep), with a slow
    model to pipeline requests behind."""
    repo = tmp_path_factory.mktemp("few-chunks") / "repo"
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    _python_model(repo, "sleeper", SLEEPER_MODEL, RAISER_CONFIG % "sleeper")
    with run_server([repo], f"--http-max-chunks={FEW_CHUNKS}", f"--http-max-json-depth={SHALLOW}") as server:
        yield server


@pytest.mark.parametrize(
    "path", ["/v2/repository/index", "/v2/repository/models/add_sub/load", "/v2/logging", "/v2/models/add_sub/infer"]
)
def test_the_json_depth_limit_holds_on_every_route(few_chunks: Server, path: str) -> None:
    deep = b'{"a":' + b"[" * SHALLOW + b"]" * SHALLOW + b"}"
    reply = request(few_chunks.http_url, "POST", path, deep)
    _expect(reply, 400, f"JSON nesting depth exceeds maximum allowed limit ({SHALLOW})")


def _read_until_closed(sock: socket.socket) -> bytes:
    answer = b""
    while data := sock.recv(65536):
        answer += data
    return answer


def _read_one_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length (and whatever came after it in the same reads)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = sock.recv(65536)
        assert data, f"the connection closed within a response: {answer!r}"
        answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:] if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        data = sock.recv(65536)
        assert data, f"the connection closed within a response: {answer!r}"
        answer += data
        body += data
    return answer


def _wait_for_log(server: Server, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log():
        assert time.monotonic() < deadline, f"'{text}' never appeared in the daemon's log"
        time.sleep(0.05)


class TestChunkFloods:
    CHUNKED: Final = {"Transfer-Encoding": "chunked", "Content-Type": "application/json"}

    def test_a_body_of_exactly_the_limit_in_chunks_is_served(self, site: Site) -> None:
        body = _good_request()
        body += b" " * (MAX_CHUNKS - len(body))
        status, answer, _ = _send_raw(site.server, INFER, self.CHUNKED, _chunked(body))
        assert status == 200, answer[:300]

    @pytest.mark.parametrize("path", [INFER, "/v2/repository/index"])
    def test_one_chunk_more_is_400_and_the_connection_closes(self, site: Site, path: str) -> None:
        body = _good_request()
        body += b" " * (MAX_CHUNKS + 1 - len(body))
        status, answer, closed = _send_raw(site.server, path, self.CHUNKED, _chunked(body))
        assert status == 400, answer[:300]
        assert b"Chunked request body exceeds maximum of 65536 non-empty chunks" in answer
        assert closed

    def test_a_flood_far_past_the_limit(self, site: Site) -> None:
        status, answer, closed = _send_raw(site.server, INFER, self.CHUNKED, _chunked(b" " * 500_000))
        assert (status, closed) == (400, True), answer[:300]

    def test_the_limit_is_a_setting(self, few_chunks: Server) -> None:
        body = _good_request()
        assert _send_raw(few_chunks, INFER, self.CHUNKED, _chunked(body, len(body) // FEW_CHUNKS + 1))[0] == 200
        status, answer, closed = _send_raw(few_chunks, INFER, self.CHUNKED, _chunked(body, len(body) // 20))
        assert (status, closed) == (400, True), answer[:300]
        assert f"exceeds maximum of {FEW_CHUNKS} non-empty chunks".encode() in answer

    def test_a_pipelined_request_is_refused_in_its_turn(self, few_chunks: Server, tmp_path: Path) -> None:
        release = tmp_path / "release"
        slow = json.dumps(
            {
                "parameters": {"release": str(release)},
                "inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [1.0]}],
            }
        ).encode()
        first = b"POST /v2/models/sleeper/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
            len(slow),
            slow,
        )
        second = b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunks = [b"1\r\n%s\r\n" % bytes([byte]) for byte in _good_request()]
        with socket.create_connection(("127.0.0.1", few_chunks.http_port), timeout=60) as sock:
            try:
                # The second request is over the limit while the first one's answer is still owed (the model holds
                # it until the test lets it go) ...
                sock.sendall(first + second + b"".join(chunks[: FEW_CHUNKS + 4]))
                _wait_for_log(few_chunks, f"sleeper holds its answer until {release} exists")
            finally:
                release.touch()
            # ... and is refused once that answer is out, as the rest of its body arrives.
            answer = _read_one_response(sock)
            sock.sendall(b"".join(chunks[FEW_CHUNKS + 4 :]) + b"0\r\n\r\n")
            answer += _read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert answer.count(b"HTTP/1.1 ") == 2, answer
        refusal = answer[answer.index(b"HTTP/1.1 ", 1) :]
        assert refusal.startswith(b"HTTP/1.1 400 "), answer
        assert f"exceeds maximum of {FEW_CHUNKS} non-empty chunks".encode() in refusal

    def test_chunked_gzip_counts_the_chunks_on_the_wire(self, site: Site) -> None:
        # Random text barely compresses: the compressed body is longer than the chunk limit.
        document = json.loads(_good_request())
        document["extra"] = base64.b64encode(random.randbytes(100_000)).decode()
        body = gzip.compress(json.dumps(document).encode())
        assert len(body) > MAX_CHUNKS
        headers = {**self.CHUNKED, "Content-Encoding": "gzip"}
        assert _send_raw(site.server, INFER, headers, _chunked(body, 4096))[0] == 200
        status, answer, closed = _send_raw(site.server, INFER, headers, _chunked(body, 1))
        assert (status, closed) == (400, True), answer[:300]


# ------------------------------------------------------------------------------------------------------------
# 10. decompression bombs: 10 MB that inflate to 10 GB are refused once the inflated size passes the limit,
# without the daemon holding more than the limit


def _bomb(encoding: str, compressed_size: int) -> tuple[bytes, int]:
    """A gzip or deflate stream of zeros about ``compressed_size`` long, and how much it inflates to. Each MiB of
    zeros compresses to the same bytes once the window is full of zeros, so the stream is built by repetition."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = bytes(MIB)
    head = compressor.compress(block) + compressor.flush(zlib.Z_SYNC_FLUSH)
    repeated = compressor.compress(block) + compressor.flush(zlib.Z_SYNC_FLUSH)
    count = (compressed_size - len(head)) // len(repeated)
    return head + repeated * count, (count + 1) * MIB


class TestDecompressionBombs:
    @pytest.mark.parametrize("encoding", ["gzip", "deflate"])
    def test_ten_megabytes_to_ten_gigabytes(self, site: Site, encoding: str) -> None:
        body, inflated = _bomb(encoding, 10 * MIB)
        assert inflated > 9 * 1024 * MIB
        before = _rss_bytes(site.server)
        reply = request(site.server.http_url, "POST", INFER, body, {"Content-Encoding": encoding})
        _expect(
            reply,
            413,
            f"Decompressed data size exceeds the maximum allowed value of {DEFAULT_MAX_INPUT_SIZE} bytes. Use "
            "--http-max-input-size to increase the limit.",
        )
        # The body, the inflated bytes up to the limit and their copies: a bounded amount, far below 10 GB.
        assert _rss_bytes(site.server) - before < 4 * DEFAULT_MAX_INPUT_SIZE

    def test_through_tritonclient(self, client: httpclient.InferenceServerClient) -> None:
        big = np.zeros((8, 16), dtype=np.float32)
        result = client.infer("add_sub", add_sub_inputs(big, big), request_compression_algorithm="gzip")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), big)

    def test_grpc_compressed_message_inflating_past_the_limit(self, site: Site) -> None:
        elements = DEFAULT_MAX_INPUT_SIZE // 4 + 1
        request_message = _raw_grpc_request("identity_fp32", [1, elements], "FP32", bytes(elements * 4))
        with grpc.insecure_channel(
            site.server.grpc_url, options=[("grpc.max_send_message_length", -1)], compression=grpc.Compression.Gzip
        ) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            error = _grpc_error(lambda: stub.ModelInfer(request_message, timeout=60))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()


# ------------------------------------------------------------------------------------------------------------
# 8. internal names: no error a client can provoke names a server path, the state directory, shared memory or
# the Python backend's own files


def _provoked_errors(site: Site, stub: Any) -> list[str]:
    url = site.server.http_url
    messages: list[str] = []
    for path, body in [
        ("/v2/models/raiser/infer", {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [1]}]}),
        ("/v2/models/raiser/infer", {"inputs": [{"name": "IN", "shape": [2**40], "datatype": "FP32", "data": [1]}]}),
        ("/v2/models/flood/infer", {"inputs": []}),
        ("/v2/models/nope/infer", {"inputs": []}),
        ("/v2/repository/models/nope/load", {}),
        ("/v2/repository/models/add_sub/load", {"parameters": {"config": "{bad"}}),
        ("/v2/repository/models/scratch/load", {"parameters": {"config": "{}", "file:../x": "QUFB"}}),
        ("/v2/systemsharedmemory/region/r/register", {"key": "/edged-x", "offset": 0, "byte_size": 8}),
    ]:
        # A credential, so that the loads with overrides reach the errors they are sent for.
        reply = post_json(url, path, body, bearer(api_token(site.server)))
        assert reply.status >= 400, (path, reply)
        messages.append(reply.error())
    raw = _raw_grpc_request("raiser", [1], "FP32", bytes(4), name="IN")
    messages.append(str(_grpc_error(lambda: stub.ModelInfer(raw)).details()))
    raw = _raw_grpc_request("raiser", [1], "FP32", bytes(8 * MIB), name="IN")
    messages.append(str(_grpc_error(lambda: stub.ModelInfer(raw)).details()))
    return messages


def _forbidden_words(site: Site) -> list[str]:
    return [str(site.root), str(site.repository), str(site.state), "/dev/shm", "memfd", "/tmp", ".sock"]


class TestNoInternalNames:
    def test_errors_name_no_internal_path_or_key(self, site: Site, stub: Any) -> None:
        for message in _provoked_errors(site, stub):
            assert not [word for word in _forbidden_words(site) if word in message], message
            assert "Traceback" not in message

    def test_a_python_models_exception_does_not_name_its_folder(self, site: Site) -> None:
        reply = post_json(
            site.server.http_url,
            "/v2/models/leaky/infer",
            {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [1]}]},
        )
        message = _expect(reply, 500, "FileNotFoundError")
        assert not [word for word in _forbidden_words(site) if word in message], message
        # The rest of the model's text passes: the file it wanted, inside its folder.
        assert "<folder of model 'leaky'>" in message


# ------------------------------------------------------------------------------------------------------------
# 12. config path fields: a path in a configuration, from the repository or from a load override, stays inside
# the model's folder


class TestConfigPathFields:
    @pytest.mark.parametrize("label", ["../../../etc/passwd", "/etc/passwd", "../add_sub/config.pbtxt"])
    def test_a_label_file_outside_the_model_is_refused(
        self, site: Site, client: httpclient.InferenceServerClient, label: str
    ) -> None:
        config = client.get_model_config("identity_fp32")
        config["output"][0]["label_filename"] = label
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("identity_fp32", config=json.dumps(config), headers=bearer(api_token(site.server)))
        assert caught.value.status() == "400"
        assert "must name a file in the model folder" in str(caught.value.message())
        assert "root:" not in str(caught.value.message())

    @pytest.mark.parametrize("filename", ["../../../etc/passwd", "/etc/passwd", "../1/model.onnx"])
    def test_a_model_file_outside_the_version_is_refused(
        self, site: Site, client: httpclient.InferenceServerClient, filename: str
    ) -> None:
        config = client.get_model_config("identity_fp32")
        config["default_model_filename"] = filename
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("identity_fp32", config=json.dumps(config), headers=bearer(api_token(site.server)))
        assert caught.value.status() == "400"
        assert "must name a file inside the version folder" in str(caught.value.message())

    def test_a_repository_config_pointing_outside_is_unavailable(self, tmp_path: Path) -> None:
        repo = tmp_path / "repo"
        modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
        modelgen.write_identity(repo / "labels_out", "FP32", max_batch_size=8, dims=[-1])
        config = repo / "labels_out" / "config.pbtxt"
        text = config.read_text(encoding="utf-8")
        config.write_text(text.replace('name: "OUTPUT0"', 'name: "OUTPUT0" label_filename: "../../secret"', 1))
        (tmp_path / "secret").write_text("do not read\n", encoding="utf-8")
        with run_server([repo]) as server:
            triton = httpclient.InferenceServerClient(server.http_url)
            try:
                index = {entry["name"]: entry for entry in triton.get_model_repository_index()}
                assert index["labels_out"]["state"] == "UNAVAILABLE"
                assert "must name a file in the model folder" in index["labels_out"]["reason"]
                assert str(tmp_path) not in index["labels_out"]["reason"]
                assert_still_serving(triton)
            finally:
                triton.close()


# ------------------------------------------------------------------------------------------------------------
# 17. unbounded response queues: a stream whose client stops reading while a decoupled model answers on


def _peak_rss_until_steady(
    server: Server, after: Callable[[], bool], steady_s: float = 1.5, at_most_s: float = 10.0
) -> int:
    """The daemon's largest RSS until ``after()`` holds (waited for up to a minute) and from then until it has
    grown by less than 1 MiB for ``steady_s``."""
    peak = _rss_bytes(server)
    deadline = time.monotonic() + 60
    while not after():
        assert time.monotonic() < deadline, "timed out waiting for what the RSS is measured through"
        time.sleep(0.1)
        peak = max(peak, _rss_bytes(server))
    start = time.monotonic()
    steady_since = start
    while time.monotonic() - start < at_most_s and time.monotonic() - steady_since < steady_s:
        time.sleep(0.1)
        rss = _rss_bytes(server)
        if rss > peak + MIB:
            steady_since = time.monotonic()
        peak = max(peak, rss)
    return peak


def _flood_request(count: int, size: int, request_id: str) -> Any:
    message = service_pb2.ModelInferRequest(model_name="flood", id=request_id)
    for name, value in (("COUNT", count), ("SIZE", size)):
        tensor = message.inputs.add(name=name, datatype="INT32")
        tensor.shape.append(1)
        message.raw_input_contents.append(np.array([value], dtype=np.int32).tobytes())
    return message


class TestStreamBacklog:
    def test_a_client_that_never_reads_is_bounded(
        self, site: Site, grpc_client: grpcclient.InferenceServerClient, client: httpclient.InferenceServerClient
    ) -> None:
        count, size = 40_000, 16 * 1024  # 640 MB of responses, were they all held: ten times the bound
        before = _rss_bytes(site.server)
        with grpc.insecure_channel(site.server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            # The response iterator is never advanced: the client reads nothing, so flow control fills at once,
            # then the stream's bound: the daemon cancels the request, and the model says it saw that.
            replies = stub.ModelStreamInfer(iter([_flood_request(count, size, "flood-1")]))
            peak = _peak_rss_until_steady(
                site.server, after=lambda: "request 'flood-1' cancelled after " in site.server.log()
            )
            # Meanwhile the daemon serves everyone else.
            assert_grpc_still_serving(grpc_client)
            assert_still_serving(client)
            # What the client finally reads: what was held, then the error that cancelled the request.
            got = []
            for reply in replies:
                got.append(reply)
                if reply.error_message or reply.infer_response.parameters["triton_final_response"].bool_param:
                    break
            replies.cancel()
        assert peak - before < 3 * MAX_QUEUED_STREAM_BYTES, f"RSS grew by {(peak - before) // MIB} MiB"
        assert len(got) < count
        assert got[-1].error_message == (
            f"request 'flood-1' was cancelled: its stream holds more than {MAX_QUEUED_STREAM_BYTES} bytes of "
            "responses that the client has not read"
        )

    def test_a_reading_client_gets_every_response(self, site: Site) -> None:
        # Many small responses, sent faster than the daemon writes them: the client reads, none is lost.
        count = 5_000
        with grpc.insecure_channel(site.server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            replies = list(stub.ModelStreamInfer(iter([_flood_request(count, 16, "steady")]), timeout=60))
        assert [r.error_message for r in replies if r.error_message] == []
        assert len(replies) == count

    def test_a_response_pool_makes_the_model_wait_for_its_reader(self, site: Site, tmp_path: Path) -> None:
        # Triton's --grpc-max-response-pool-size, at its smallest: a stream holds one reply unread. A reading client
        # still gets every response of several requests on one stream; one that reads nothing is cancelled at the
        # byte bound, which covers what the model sends while it waits, as without a pool.
        bound = 8 * MIB
        with run_server(
            [site.repository],
            "--model-control-mode=explicit",
            "--load-model=flood",
            "--load-model=identity_fp32",
            "--grpc-max-response-pool-size=1",
            f"--grpc-max-queued-stream-bytes={bound}",
            f"--state-dir={tmp_path / 'state'}",
        ) as server:
            with grpc.insecure_channel(server.grpc_url) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                requests = [_flood_request(300, 64, f"pooled-{n}") for n in range(3)]
                replies = list(stub.ModelStreamInfer(iter(requests), timeout=120))
            assert [r.error_message for r in replies if r.error_message] == []
            ids = [r.infer_response.id for r in replies]
            assert {n: ids.count(f"pooled-{n}") for n in range(3)} == {0: 300, 1: 300, 2: 300}
            before = _rss_bytes(server)
            with grpc.insecure_channel(server.grpc_url) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                unread = stub.ModelStreamInfer(iter([_flood_request(40_000, 16 * 1024, "pooled-flood")]))
                peak = _peak_rss_until_steady(
                    server, after=lambda: "request 'pooled-flood' cancelled after " in server.log()
                )
                got = []
                for reply in unread:
                    got.append(reply)
                    if reply.error_message:
                        break
                unread.cancel()
            assert peak - before < 3 * bound + 16 * MIB, f"RSS grew by {(peak - before) // MIB} MiB"
            assert got[-1].error_message == (
                f"request 'pooled-flood' was cancelled: its stream holds more than {bound} bytes of responses that "
                "the client has not read"
            )
            # Requests to a model that is not decoupled, sent on and on by a client that reads nothing: once the
            # answers it has not read pass the byte bound, the daemon stops reading its requests.
            block = np.ones(64 * 1024, dtype=np.float32)  # 256 KiB in, 256 KiB out
            message = service_pb2.ModelInferRequest(model_name="identity_fp32")
            tensor = message.inputs.add(name="INPUT0", datatype="FP32")
            tensor.shape.extend([1, block.size])
            message.raw_input_contents.append(block.tobytes())
            sent = 0

            def unanswered() -> Iterator[Any]:
                nonlocal sent
                for _ in range(400):  # 100 MiB of answers, were they all held
                    sent += 1
                    yield message

            before = _rss_bytes(server)
            with grpc.insecure_channel(server.grpc_url) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                unread = stub.ModelStreamInfer(unanswered())
                peak = _peak_rss_until_steady(server, after=lambda: sent > 0)
                assert sent < 400, "the daemon read every request of a client that reads nothing"
                unread.cancel()
            assert peak - before < 3 * bound + 16 * MIB, f"RSS grew by {(peak - before) // MIB} MiB"
