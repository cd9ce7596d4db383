"""Sequence batching with the framework backends on the real daemon: a TorchScript module, a TensorFlow SavedModel
and an OpenVINO IR whose graphs take the sequence batcher's control inputs (START and CORRID) beside the data, so
that each answer shows which sequence it was batched for and whether it started one. Two sequences are open at once,
their requests interleaved, each in its own batch slot of the Direct strategy; each gets its own control values."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import openvino
import pytest
import tensorflow as tf
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, run_server

# How long a model's load may take: a bound no machine reaches, never a measurement.
LOAD_S = 600.0


def _config(kind: str, output: str) -> str:
    """One FP32 input ``value`` and one FP32 output, with the control inputs START and CORRID (INT64). The idle time
    is a minute: only their END ends the sequences, however long a framework's first run takes."""
    return f"""
{kind}
max_batch_size: 4
input [{{ name: "value", data_type: TYPE_FP32, dims: [ 1 ] }}]
output [{{ name: "{output}", data_type: TYPE_FP32, dims: [ 1 ] }}]
sequence_batching {{
  direct {{ }}
  max_sequence_idle_microseconds: 60000000
  control_input [
    {{ name: "start" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "corrid" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 }} ] }}
  ]
}}
"""


class Marked(torch.nn.Module):
    """value + 1000 on a sequence's first request + 10 x its correlation id."""

    def forward(self, corrid: torch.Tensor, value: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return value + start * 1000 + corrid.to(torch.float32) * 10


def _savedmodel(path: Path) -> None:
    module = tf.Module()

    @tf.function(  # type: ignore[untyped-decorator]
        input_signature=[
            tf.TensorSpec([None, 1], tf.float32, name="value"),
            tf.TensorSpec([None, 1], tf.float32, name="start"),
            tf.TensorSpec([None, 1], tf.int64, name="corrid"),
        ]
    )
    def serve(value: Any, start: Any, corrid: Any) -> dict[str, Any]:
        return {"marked": value + start * 1000 + tf.cast(corrid, tf.float32) * 10}

    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})


def _ir(version: Path) -> None:
    """value + start * 1000 + corrid * 10 as an ONNX graph, converted to IR by OpenVINO."""
    helper = onnx.helper
    batch: list[str | int | None] = ["batch", 1]
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["thousand"], value=helper.make_tensor("t", onnx.TensorProto.FLOAT, [], [1000.0])
            ),
            helper.make_node(
                "Constant", [], ["ten"], value=helper.make_tensor("u", onnx.TensorProto.FLOAT, [], [10.0])
            ),
            helper.make_node("Mul", ["start", "thousand"], ["started"]),
            helper.make_node("Cast", ["corrid"], ["id"], to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", ["id", "ten"], ["tens"]),
            helper.make_node("Add", ["value", "started"], ["partial"]),
            helper.make_node("Add", ["partial", "tens"], ["marked"]),
        ],
        "marked",
        [
            helper.make_tensor_value_info("value", onnx.TensorProto.FLOAT, batch),
            helper.make_tensor_value_info("start", onnx.TensorProto.FLOAT, batch),
            helper.make_tensor_value_info("corrid", onnx.TensorProto.INT64, batch),
        ],
        [helper.make_tensor_value_info("marked", onnx.TensorProto.FLOAT, batch)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    version.mkdir(parents=True)
    onnx.save(model, str(version / "model.onnx"))
    converted = openvino.Core().read_model(str(version / "model.onnx"))
    openvino.save_model(converted, str(version / "model.xml"))
    (version / "model.onnx").unlink()


@pytest.fixture(scope="module")
def sequence_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    repository = tmp_path_factory.mktemp("sequences") / "repository"
    (repository / "torch_seq" / "1").mkdir(parents=True)
    script: Any = torch.jit.script(Marked())
    script.save(str(repository / "torch_seq" / "1" / "model.pt"))
    (repository / "torch_seq" / "config.pbtxt").write_text(
        _config('platform: "pytorch_libtorch"', "OUTPUT__0"), encoding="utf-8"
    )
    (repository / "tf_seq" / "1").mkdir(parents=True)
    _savedmodel(repository / "tf_seq" / "1" / "model.savedmodel")
    (repository / "tf_seq" / "config.pbtxt").write_text(
        _config('platform: "tensorflow_savedmodel"', "marked"), encoding="utf-8"
    )
    _ir(repository / "openvino_seq" / "1")
    (repository / "openvino_seq" / "config.pbtxt").write_text(
        _config('backend: "openvino"', "marked"), encoding="utf-8"
    )
    # Loaded one by one once the daemon is up, each load waited for as long as its framework takes (TensorFlow's
    # and PyTorch's first load are long on a busy machine), rather than within the daemon's start.
    with run_server([repository], "--model-control-mode=explicit") as server:
        client = httpclient.InferenceServerClient(server.http_url, connection_timeout=LOAD_S, network_timeout=LOAD_S)
        for model in ("torch_seq", "tf_seq", "openvino_seq"):
            client.load_model(model)
        client.close()
        yield server
        # The daemon stops at once, but its process ends only once Python has let go of TensorFlow and PyTorch, which
        # takes seconds, many more on a busy machine: waited for here for as long as it takes (run_server then
        # checks how it ended), not within the few seconds it gives a daemon that hangs.
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(LOAD_S)
        assert "edged stopped" in server.log()


def _send(client: grpcclient.InferenceServerClient, model: str, output: str, value: float, sequence: int,
          start: bool = False, end: bool = False) -> float:  # fmt: skip
    tensor = grpcclient.InferInput("value", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    result = client.infer(model, [tensor], sequence_id=sequence, sequence_start=start, sequence_end=end)
    answer = result.as_numpy(output)
    assert answer is not None
    return float(answer[0, 0])


@pytest.mark.parametrize(
    ("model", "output"), [("torch_seq", "OUTPUT__0"), ("tf_seq", "marked"), ("openvino_seq", "marked")]
)
def test_control_inputs_reach_the_framework_for_each_sequence(sequence_server: Server, model: str, output: str) -> None:
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    # Two sequences, interleaved: each answer carries its own sequence's id, and only first requests get START.
    assert _send(client, model, output, 1.0, 7, start=True) == 1.0 + 1000 + 70
    assert _send(client, model, output, 2.0, 9, start=True) == 2.0 + 1000 + 90
    assert _send(client, model, output, 3.0, 7) == 3.0 + 70
    assert _send(client, model, output, 4.0, 9) == 4.0 + 90
    assert _send(client, model, output, 5.0, 7, end=True) == 5.0 + 70
    assert _send(client, model, output, 6.0, 9, end=True) == 6.0 + 90
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) == 6
    client.close()
