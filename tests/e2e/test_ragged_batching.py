"""Ragged batching, as Triton's ONNX Runtime backend does it: requests whose ``allow_ragged_batch`` input differs in
shape share a batch, the model gets that input flattened and concatenated with the ``batch_input`` tensors that say
where each request's part is, and a ``batch_output`` is split back into each request's part in its input's shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from server import Server, run_server

# OUTPUT0 = INPUT0 + the sum of COUNT (the batch's element counts): each request's answer shows both that its part
# came back to it and how many elements the whole batch held.
CONFIG = """
name: "ragged"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 source_input: "INPUT0" } ]
batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUTPUT0" source_input: "INPUT0" } ]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 60000000 }
"""


def _write_model(model_dir: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["COUNT"], ["TOTAL"], keepdims=0),
            helper.make_node("Add", ["INPUT0", "TOTAL"], ["OUTPUT0"]),
        ],
        "ragged",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("COUNT", TensorProto.FLOAT, ["r"]),
        ],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(CONFIG, encoding="utf-8")


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("ragged")
    _write_model(repo / "ragged")
    with run_server([repo]) as server:
        yield server


def _input(values: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]


def test_requests_of_different_shapes_share_a_batch(ragged_server: Server) -> None:
    client = httpclient.InferenceServerClient(ragged_server.http_url, concurrency=2)
    long = np.arange(16, dtype=np.float32).reshape(1, 16)
    short = np.arange(100, 108, dtype=np.float32).reshape(1, 8)
    # The batch waits (a minute at most) for a second request: the two shapes differ, and still make one batch.
    calls = [client.async_infer("ragged", _input(values)) for values in (long, short)]
    results = [call.get_result().as_numpy("OUTPUT0") for call in calls]
    assert [r.shape for r in results] == [(1, 16), (1, 8)]
    np.testing.assert_array_equal(results[0], long + 24)
    np.testing.assert_array_equal(results[1], short + 24)
    stats = client.get_inference_statistics("ragged")["model_stats"][0]
    assert stats["execution_count"] == 1
    assert stats["batch_stats"][0]["batch_size"] == 2
