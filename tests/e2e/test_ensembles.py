"""Ensembles through the real daemon and clients: a text pipeline of a tokenizer-like Python step, an ONNX model and a
Python post-processing step; a graph with two branches that run at once; errors that name the failing step;
ensembles Triton refuses at load; readiness that follows the composing models."""

from __future__ import annotations

import json
import shutil
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import modelgen
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import PYTHON_MODELS
from server import Server, run_server
from tritonclient.utils import InferenceServerException

TOKENIZE: Final = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            # One row of 16 numbers per text: its characters' codes, padded with zeros.
            rows = np.zeros((len(texts), 16), dtype=np.float32)
            for i, text in enumerate(texts.reshape(-1)):
                codes = [float(c) for c in text[:16]]
                rows[i, : len(codes)] = codes
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOKENS", rows)]))
        return responses
"""
DESCRIBE: Final = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            sums = pb_utils.get_input_tensor_by_name(request, "SUM").as_numpy()
            if (sums < 0).any():
                raise ValueError("negative sums cannot be described")
            labels = np.array([[f"total {int(row.sum())}".encode()] for row in sums], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", labels)]))
        return responses
"""
# A branch of "branches" (sleep_a or sleep_b): it marks that it began (a file "began" in its model folder) and ends
# only once the other branch has begun too, so the two overlap on any machine; run one after the other, the first
# waits out a deadline, and the test fails.
SLEEP: Final = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        other = "sleep_b" if args["model_name"] == "sleep_a" else "sleep_a"
        self.began = os.path.join(args["model_repository"], "began")
        self.other_began = os.path.join(os.path.dirname(args["model_repository"]), other, "began")

    def execute(self, requests):
        responses = []
        for request in requests:
            started = time.monotonic()
            open(self.began, "w").close()
            deadline = started + 20
            while not os.path.exists(self.other_began) and time.monotonic() < deadline:
                time.sleep(0.01)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            span = np.array([[started, time.monotonic()]], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x), pb_utils.Tensor("SPAN", span)]))
        return responses
"""


DOUBLE: Final = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * 2).astype(np.int32))]))
        return responses
"""
FANOUT: Final = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat_decoupled" model_version: -1 input_map { key: "IN" value: "IN" }
    output_map [ { key: "OUT" value: "value" }, { key: "IDX" value: "IDX" } ] },
  { model_name: "double_int" model_version: -1 input_map { key: "X" value: "value" }
    output_map { key: "Y" value: "Y" } }
] }
"""


# An ensemble whose first step is another ensemble: labeller's LABEL, next to add_sub's sum of X with itself.
NESTED: Final = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }, { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "labeller" model_version: -1 input_map { key: "X" value: "X" }
    output_map { key: "LABEL" value: "LABEL" } },
  { model_name: "add_sub" model_version: -1 input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "X" } ]
    output_map { key: "OUTPUT0" value: "SUM" } }
] }
"""


def _python_model(repo: Path, name: str, source: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source, encoding="utf-8")
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config), encoding="utf-8"
    )


def _ensemble(repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\n' + textwrap.dedent(config), encoding="utf-8"
    )


PIPELINE: Final = """
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }, { name: "DOUBLE" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "tokenize" model_version: -1 input_map { key: "TEXT" value: "TEXT" }
    output_map { key: "TOKENS" value: "tokens" } },
  { model_name: "add_sub" model_version: -1 input_map [ { key: "INPUT0" value: "tokens" },
      { key: "INPUT1" value: "tokens" } ]
    output_map [ { key: "OUTPUT0" value: "DOUBLE" } ] },
  { model_name: "describe" model_version: -1 input_map { key: "SUM" value: "DOUBLE" }
    output_map { key: "LABEL" value: "LABEL" } }
] }
"""
BRANCHES: Final = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "SPAN_A" data_type: TYPE_FP64 dims: [ 2 ] },
         { name: "SPAN_B" data_type: TYPE_FP64 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "sleep_a" model_version: -1 input_map { key: "X" value: "X" }
    output_map [ { key: "Y" value: "a" }, { key: "SPAN" value: "SPAN_A" } ] },
  { model_name: "sleep_b" model_version: -1 input_map { key: "X" value: "X" }
    output_map [ { key: "Y" value: "b" }, { key: "SPAN" value: "SPAN_B" } ] },
  { model_name: "add_sub" model_version: -1 input_map [ { key: "INPUT0" value: "a" }, { key: "INPUT1" value: "b" } ]
    output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""
LABELLER: Final = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1 input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "X" } ]
    output_map { key: "OUTPUT0" value: "sum" } },
  { model_name: "describe" model_version: -1 input_map { key: "SUM" value: "sum" }
    output_map { key: "LABEL" value: "LABEL" } }
] }
"""
SLEEP_CONFIG: Final = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] } ]
"""
SIMPLE_STEP: Final = """
  { model_name: "add_sub" model_version: -1 input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "X" } ]
    output_map { key: "OUTPUT0" value: "OUT" } }
"""
IO: Final = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""
# A model with an optional input: A_OUT is A, B_OUT is B when B was given (left out otherwise); PARAMS holds the
# request's parameters as JSON.
OPTIONAL_ECHO: Final = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = [pb_utils.Tensor("A_OUT", pb_utils.get_input_tensor_by_name(request, "A").as_numpy())]
            b = pb_utils.get_input_tensor_by_name(request, "B")
            if b is not None:
                outputs.append(pb_utils.Tensor("B_OUT", b.as_numpy()))
            params = np.array([request.parameters().encode()], dtype=np.object_)
            outputs.append(pb_utils.Tensor("PARAMS", params))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
OPTIONAL_IO: Final = """
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ -1 ] optional: true } ]
output [ { name: "A_OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "B_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
# One step, its optional input fed by the ensemble's optional input.
OPTIONAL_ONE: Final = (
    OPTIONAL_IO
    + """
ensemble_scheduling { step [
  { model_name: "optional_echo" model_version: -1 input_map [ { key: "A" value: "A" }, { key: "B" value: "B" } ]
    output_map [ { key: "A_OUT" value: "A_OUT" }, { key: "B_OUT" value: "B_OUT" }, { key: "PARAMS" value: "PARAMS" } ] }
] }
"""
)
# Two steps: the second's optional input is the first's output, absent when the first did not return it.
OPTIONAL_TWO: Final = (
    OPTIONAL_IO
    + """
ensemble_scheduling { step [
  { model_name: "optional_echo" model_version: -1 input_map [ { key: "A" value: "A" }, { key: "B" value: "B" } ]
    output_map [ { key: "A_OUT" value: "a" }, { key: "B_OUT" value: "b" } ] },
  { model_name: "optional_echo" model_version: -1 input_map [ { key: "A" value: "a" }, { key: "B" value: "b" } ]
    output_map [ { key: "A_OUT" value: "A_OUT" }, { key: "B_OUT" value: "B_OUT" }, { key: "PARAMS" value: "PARAMS" } ] }
] }
"""
)
# An ensemble that does not batch, whose step (an ONNX identity) does.
NOBATCH_OVER_BATCHING: Final = """
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "identity_batching" model_version: -1 input_map { key: "INPUT0" value: "X" }
    output_map { key: "OUTPUT0" value: "Y" } }
] }
"""
# An ensemble of an ensemble: "doubler" (add_sub's OUTPUT0 of X and X) as its one step.
NESTED_DOUBLER: Final = (
    IO
    + """
ensemble_scheduling { step [
  { model_name: "doubler" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "OUT" value: "OUT" } }
] }
"""
)
# Ensembles Triton refuses, each with a part of the reason it gives.
BROKEN: Final[dict[str, tuple[str, str]]] = {
    "unknown_member": (
        IO + 'ensemble_scheduling { step [ { model_name: "nowhere" model_version: -1 '
        'input_map { key: "A" value: "X" } output_map { key: "B" value: "OUT" } } ] }',
        "ensemble unknown_member depends on model nowhere, which is not available",
    ),
    "wrong_input": (
        IO + 'ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1 '
        'input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "X" }, { key: "INPUT9" value: "X" } ] '
        'output_map { key: "OUTPUT0" value: "OUT" } } ] }',
        "in ensemble wrong_input, ensemble tensor X is mapping to non-existing input INPUT9 in model add_sub",
    ),
    "unmapped_input": (
        IO + 'ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1 '
        'input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "OUT" } } ] }',
        "in ensemble unmapped_input, input INPUT1 in model add_sub is not mapped to any ensemble tensors",
    ),
    "wrong_type": (
        IO.replace('name: "X" data_type: TYPE_FP32', 'name: "X" data_type: TYPE_INT32')
        + f"ensemble_scheduling {{ step [ {SIMPLE_STEP} ] }}",
        "in ensemble wrong_type, ensemble tensor X: inconsistent data type: TYPE_INT32 is inferred from model "
        "wrong_type while TYPE_FP32 is inferred from model add_sub",
    ),
    "no_producer": (
        IO + 'output [ { name: "EXTRA" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        f"ensemble_scheduling {{ step [ {SIMPLE_STEP} ] }}",
        "ensemble output EXTRA is not produced by any step of ensemble no_producer",
    ),
    "cycle": (
        IO + "ensemble_scheduling { step [ "
        '{ model_name: "add_sub" model_version: -1 input_map [ { key: "INPUT0" value: "X" }, '
        '{ key: "INPUT1" value: "loop" } ] output_map [ { key: "OUTPUT0" value: "OUT" }, '
        '{ key: "OUTPUT1" value: "loop" } ] } ] }',
        "reads ensemble tensor loop, which no step before it produces",
    ),
}


@pytest.fixture(scope="module")
def ensemble_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("ensembles")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
    _python_model(
        repo,
        "tokenize",
        TOKENIZE,
        """
        max_batch_size: 8
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "TOKENS" data_type: TYPE_FP32 dims: [ 16 ] } ]
        """,
    )
    _python_model(
        repo,
        "describe",
        DESCRIBE,
        """
        max_batch_size: 8
        input [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] } ]
        """,
    )
    _python_model(repo, "sleep_a", SLEEP, SLEEP_CONFIG)
    _python_model(repo, "sleep_b", SLEEP, SLEEP_CONFIG)
    _ensemble(repo, "pipeline", PIPELINE)
    _ensemble(repo, "branches", BRANCHES)
    _ensemble(repo, "labeller", LABELLER)
    shutil.copytree(PYTHON_MODELS / "repeat_decoupled", repo / "repeat_decoupled")
    _python_model(
        repo,
        "double_int",
        DOUBLE,
        """
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """,
    )
    _ensemble(repo, "fanout", FANOUT)
    _python_model(repo, "optional_echo", OPTIONAL_ECHO, OPTIONAL_IO)
    _ensemble(repo, "optional_one", OPTIONAL_ONE)
    _ensemble(repo, "optional_two", OPTIONAL_TWO)
    modelgen.write_identity(repo / "identity_batching", "FP32", max_batch_size=8, dims=[-1])
    _ensemble(repo, "nobatch_over_batching", NOBATCH_OVER_BATCHING)
    _ensemble(repo, "nested", NESTED)
    for name, (config, _) in BROKEN.items():
        _ensemble(repo, name, config)
    return repo


@pytest.fixture(scope="module")
def ensemble_server(ensemble_repository: Path) -> Iterator[Server]:
    with run_server(
        [ensemble_repository],
        "--model-control-mode=explicit",
        "--load-model=*",
        "--http-header-forward-pattern=my_header|sequence_id",
        "--grpc-header-forward-pattern=(?-i)my_header_3",
    ) as server:
        yield server


def _text(value: bytes) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.object_))
    return [tensor]


def test_a_pipeline_of_python_and_onnx_steps(ensemble_server: Server) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    before = client.get_inference_statistics("add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    result = client.infer("pipeline", _text(b"ab"))
    # "ab" -> [97, 98, 0...] -> doubled -> 390
    assert result.as_numpy("LABEL")[0, 0] == b"total 390"
    np.testing.assert_array_equal(result.as_numpy("DOUBLE")[0, :3], [194.0, 196.0, 0.0])
    # Each step is a request to its model, counted in its statistics.
    after = client.get_inference_statistics("add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after == before + 1
    assert client.get_model_metadata("pipeline")["platform"] == "ensemble"
    # Its config holds the transaction policy, as Triton's always does.
    assert client.get_model_config("pipeline")["model_transaction_policy"] == {"decoupled": False}
    # Over gRPC too.
    grpc = grpcclient.InferenceServerClient(ensemble_server.grpc_url)
    tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a"]], dtype=np.object_))
    assert grpc.infer("pipeline", [tensor]).as_numpy("LABEL")[0, 0] == b"total 194"


def test_independent_steps_run_at_once(ensemble_server: Server, ensemble_repository: Path) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    for name in ("sleep_a", "sleep_b"):
        (ensemble_repository / name / "began").unlink(missing_ok=True)
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor = httpclient.InferInput("X", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("branches", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x + x)
    (start_a, end_a), (start_b, end_b) = result.as_numpy("SPAN_A")[0], result.as_numpy("SPAN_B")[0]
    # Each branch began before the other ended.
    assert start_a < end_b and start_b < end_a


def test_a_failing_step_is_named(ensemble_server: Server) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    tensor = httpclient.InferInput("X", [1, 16], "FP32")
    tensor.set_data_from_numpy(-np.ones((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("labeller", [tensor])
    message = info.value.message()
    assert message.startswith("in ensemble 'labeller', step 1 (model 'describe') failed: ")
    assert "negative sums cannot be described" in message
    # The daemon and the ensemble go on.
    tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    assert client.infer("labeller", [tensor]).as_numpy("LABEL")[0, 0] == b"total 32"


def test_broken_ensembles_are_unavailable_with_the_reason(ensemble_server: Server) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    index = {(e["name"], e.get("version", "")): e for e in client.get_model_repository_index()}
    for name, (_, reason) in BROKEN.items():
        entry = index.get((name, "1")) or index[(name, "")]
        assert entry["state"] == "UNAVAILABLE", name
        assert reason in entry["reason"], (name, entry["reason"])
    assert client.is_server_live()
    assert client.is_model_ready("pipeline")


def test_readiness_follows_the_composing_models(ensemble_server: Server) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    client.unload_model("describe")
    try:
        assert not client.is_model_ready("pipeline")
        with pytest.raises(InferenceServerException):
            client.infer("pipeline", _text(b"a"))
    finally:
        client.load_model("describe")
    assert client.is_model_ready("pipeline")
    assert client.infer("pipeline", _text(b"a")).as_numpy("LABEL")[0, 0] == b"total 194"


def test_unload_dependents_takes_the_models_an_ensemble_loaded_for_itself(ensemble_server: Server) -> None:
    """As Triton: with unload_dependents, an ensemble's unload also unloads the models it loaded for itself (never
    loaded by name), once no other loaded ensemble uses them; a model loaded by name stays. Unloading a model that
    ensembles use leaves them loaded, not ready until it is back."""
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    ready_before = _ready(client)
    assert {"fanout", "double_int", "repeat_decoupled", "describe", "pipeline", "labeller"} <= ready_before
    try:
        client.unload_model("fanout")
        client.unload_model("double_int")
        client.load_model("fanout")  # loads double_int for itself; repeat_decoupled is there, loaded by name
        assert {"fanout", "double_int", "repeat_decoupled"} <= _ready(client)
        client.unload_model("fanout", unload_dependents=True)
        ready = _ready(client)
        assert not {"fanout", "double_int"} & ready
        assert "repeat_decoupled" in ready
        client.unload_model("describe", unload_dependents=True)
        ready = _ready(client)
        assert "describe" not in ready and {"add_sub", "tokenize"} <= ready
        loaded = {entry["name"] for entry in client.get_model_repository_index() if entry.get("state") == "READY"}
        assert {"pipeline", "labeller"} <= loaded  # still loaded, though not ready without 'describe'
        assert not client.is_model_ready("pipeline")
    finally:
        for name in ("describe", "double_int", "fanout"):
            client.load_model(name)
    assert _ready(client) == ready_before
    assert client.infer("pipeline", _text(b"a")).as_numpy("LABEL")[0, 0] == b"total 194"


def _ready(client: httpclient.InferenceServerClient) -> set[str]:
    """The models with a READY version in the index (an ensemble may be READY but not ready to serve)."""
    return {entry["name"] for entry in client.get_model_repository_index() if entry.get("state") == "READY"}


def test_loading_an_ensemble_loads_its_models(tmp_path: Path) -> None:
    """As Triton in explicit mode: an ensemble named at start, or loaded through the API, loads the models its
    steps name first; unloading one of them leaves the ensemble unready, and an ensemble unloaded on purpose stays
    unloaded when its model loads again."""
    repo = tmp_path / "repo"
    repo.mkdir()
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
    _ensemble(repo, "doubler", IO + f"ensemble_scheduling {{ step [ {SIMPLE_STEP} ] }}")
    _ensemble(repo, "outer", NESTED_DOUBLER)
    _ensemble(repo, "missing_member", BROKEN["unknown_member"][0])
    with run_server([repo], "--model-control-mode=explicit", "--load-model=doubler") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("doubler") and client.is_model_ready("add_sub")
        client.unload_model("doubler")
        client.unload_model("add_sub")
        assert _ready(client) == set()
        # Through the API, across two levels of ensembles.
        client.load_model("outer")
        assert _ready(client) == {"outer", "doubler", "add_sub"}
        tensor = httpclient.InferInput("X", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.full((1, 16), 2, dtype=np.float32))
        np.testing.assert_array_equal(client.infer("outer", [tensor]).as_numpy("OUT"), np.full((1, 16), 4))
        client.unload_model("add_sub")
        assert not client.is_model_ready("doubler") and not client.is_model_ready("outer")
        client.unload_model("outer")
        client.load_model("add_sub")
        assert _ready(client) == {"add_sub", "doubler"}
        with pytest.raises(InferenceServerException) as info:
            client.load_model("missing_member")
        assert "depends on model nowhere, which is not available" in info.value.message()
        shutil.rmtree(repo / "doubler")


def test_an_ensemble_of_ensembles_is_ready_after_start(tmp_path: Path) -> None:
    """Every model loaded at start (Triton's default mode): the outer ensemble loads the one it uses first instead of
    racing it (it stayed UNAVAILABLE, and the server unready, when it loaded first)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
    _ensemble(repo, "doubler", IO + f"ensemble_scheduling {{ step [ {SIMPLE_STEP} ] }}")
    _ensemble(repo, "outer", NESTED_DOUBLER)
    _ensemble(repo, "outermost", NESTED_DOUBLER.replace('model_name: "doubler"', 'model_name: "outer"'))
    with run_server([repo]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_server_ready()
        assert all(client.is_model_ready(name) for name in ("add_sub", "doubler", "outer", "outermost"))


def test_a_decoupled_step_streams_through_the_rest_of_the_graph(ensemble_server: Server) -> None:
    client = grpcclient.InferenceServerClient(ensemble_server.grpc_url)
    responses: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        responses.append(error if error is not None else result)
        if len(responses) == 3 or error is not None:
            done.set()

    client.start_stream(callback=callback)
    tensor = grpcclient.InferInput("IN", [3], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    client.async_stream_infer("fanout", [tensor], request_id="f1")
    assert done.wait(30)
    client.stop_stream()
    assert all(not isinstance(r, Exception) for r in responses), responses
    pairs = sorted((int(r.as_numpy("IDX")[0]), int(r.as_numpy("Y")[0])) for r in responses)
    assert pairs == [(0, 2), (1, 4), (2, 6)]
    # The ensemble is decoupled as its step is: the plain HTTP endpoint refuses it, as for any decoupled model.
    http = httpclient.InferenceServerClient(ensemble_server.http_url)
    assert http.get_model_config("fanout")["model_transaction_policy"]["decoupled"] is True
    with pytest.raises(InferenceServerException):
        http.infer("fanout", [_int_input()])


def _int_input() -> httpclient.InferInput:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    return tensor


def test_an_ensemble_of_an_ensemble(ensemble_server: Server) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    assert client.is_model_ready("nested")
    tensor = httpclient.InferInput("X", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.full((1, 16), 2, dtype=np.float32))
    result = client.infer("nested", [tensor])
    assert result.as_numpy("LABEL")[0, 0] == b"total 64"
    np.testing.assert_array_equal(result.as_numpy("SUM"), np.full((1, 16), 4, dtype=np.float32))


def _floats(name: str, values: list[float]) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return tensor


@pytest.mark.parametrize("ensemble", ["optional_one", "optional_two"])
def test_an_optional_input_not_given_runs_the_steps_without_it(ensemble_server: Server, ensemble: str) -> None:
    """As Triton: the absent tensor counts as there for the steps that read it, each runs without it, and the
    ensemble outputs nothing produced are left out of the response."""
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    result = client.infer(ensemble, [_floats("A", [1.0, 2.0])])
    np.testing.assert_array_equal(result.as_numpy("A_OUT"), [1.0, 2.0])
    assert result.as_numpy("B_OUT") is None
    assert [o["name"] for o in result.get_response()["outputs"]] == ["A_OUT", "PARAMS"]
    result = client.infer(ensemble, [_floats("A", [1.0]), _floats("B", [3.0, 4.0])])
    np.testing.assert_array_equal(result.as_numpy("B_OUT"), [3.0, 4.0])


def test_request_parameters_reach_every_step(ensemble_server: Server) -> None:
    client = grpcclient.InferenceServerClient(ensemble_server.grpc_url)
    tensor = grpcclient.InferInput("A", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    result = client.infer("optional_two", [tensor], parameters={"key1": "value1", "key2": 2, "key3": True})
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"key1": "value1", "key2": 2, "key3": True}


@pytest.mark.parametrize("values", [[], [1.0, 2.0, 3.0]], ids=["zero-elements", "three"])
def test_an_ensemble_that_does_not_batch_feeds_a_step_that_does(ensemble_server: Server, values: list[float]) -> None:
    """The step gets the tensor with a batch of 1 in front ([0] -> [1,0]) and the ensemble answers in its own
    shape, as Triton does (qa/L0_infer_zero's non-batching ensembles over batching steps)."""
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    result = client.infer("nobatch_over_batching", [_floats("X", values)])
    output = result.as_numpy("Y")
    assert output.shape == (len(values),)
    np.testing.assert_array_equal(output, values)


def test_too_few_inputs_for_a_model_with_an_optional_one(ensemble_server: Server) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("optional_echo", [])
    assert info.value.message() == (
        "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 0 inputs for model "
        "'optional_echo'. Got input(s) [], but missing required input(s) ['A']. Please provide all required input(s)."
    )
    # Within the count but without a required input: Triton 2.51 hands it to the model, edged refuses it alike.
    with pytest.raises(InferenceServerException) as info:
        client.infer("optional_echo", [_floats("B", [1.0])])
    assert info.value.message() == (
        "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 1 inputs for model "
        "'optional_echo'. Got input(s) ['B'], but missing required input(s) ['A']. Please provide all required "
        "input(s)."
    )


def test_headers_the_pattern_finds_reach_the_model_as_parameters(ensemble_server: Server) -> None:
    """--http-header-forward-pattern: each header it finds (any case) is a string parameter of the request, after
    the request's own (so it wins over one of the same name), and reaches the ensemble's steps as they do. A name
    edged reads as a field of the request (sequence_id) is never forwarded: as in Triton, the request is refused."""
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    headers = {"my_header_1": "from a header", "My_Header_2": "2", "other": "x"}
    result = client.infer("optional_two", [_floats("A", [1.0])], headers=headers, parameters={"my_header_1": 1})
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"my_header_1": "from a header", "my_header_2": "2"}
    with pytest.raises(InferenceServerException) as refused:
        client.infer("optional_two", [_floats("A", [1.0])], headers={**headers, "sequence_id": "7"})
    assert refused.value.status() == "400"
    assert refused.value.message() == "Header 'sequence_id' is reserved for Triton usage and cannot be forwarded."
    grpc = grpcclient.InferenceServerClient(ensemble_server.grpc_url)
    tensor = grpcclient.InferInput("A", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    headers = {"my_header_3": "3", "my_header_4": "4"}
    result = grpc.infer("optional_two", [tensor], headers=headers, parameters={"key": "value"})
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"key": "value", "my_header_3": "3"}
