"""What Triton's own qa models (qa/L0_backend_python) do inside a Python model, as edged's stub must let them: an
in-model unittest suite, an execute that runs longer than the stub timeout, BLS requests with a timeout or to a
model that does not exist, a decoupled model that returns a response, the response sender of a model that is not
decoupled, and a cancelled decoupled BLS stream. Texts are Triton 2.51's (checked against it where it has them)."""

from __future__ import annotations

import queue
import shutil
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import gevent  # type: ignore[import-untyped, unused-ignore]
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import PYTHON_MODELS, PYTHON_STUB_TIMEOUT_S
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, add_sub_inputs, run_server
from tritonclient.utils import InferenceServerException


def _probe(client: httpclient.InferenceServerClient, mode: str) -> str:
    tensor = httpclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    return str(client.infer("qa_probe", [tensor]).as_numpy("OUT")[0].decode())


def _probe_error(client: httpclient.InferenceServerClient, mode: str) -> str:
    tensor = httpclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer("qa_probe", [tensor])
    return str(info.value.message())


def test_an_in_model_unittest_suite_sees_the_argv_of_tritons_stub(
    python_client: httpclient.InferenceServerClient,
) -> None:
    # unittest.main("model", exit=False) parses sys.argv: Triton's embedded interpreter has [""], and so must the
    # stub (its socket's fd there made unittest look for a test named "21").
    assert _probe(python_client, "unittest") == "True"


def test_execute_may_run_longer_than_the_stub_timeout(python_server: Server, tmp_path: Path) -> None:
    """The stub timeout bounds starting a stub and its messages, not how long execute runs (as in Triton)."""
    client = httpclient.InferenceServerClient(python_server.http_url, network_timeout=120.0)
    release = tmp_path / "release"
    held = client.async_infer("add_sub_python", add_sub_inputs(), parameters={"hold": str(release)})
    deadline = time.monotonic() + 60
    while f"add_sub_python holds its instance until {release} exists" not in python_server.log():
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)
    # Held well past the stub timeout: only an execute watchdog could end it, and there is none by default.
    time.sleep(2 * PYTHON_STUB_TIMEOUT_S + 1)
    release.touch()
    result = held.get_result()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    client.close()


def test_a_bls_request_carries_its_timeout_to_the_callee(python_client: httpclient.InferenceServerClient) -> None:
    assert _probe(python_client, "bls_timeout") == "123456"


def test_a_queued_bls_request_past_its_timeout_expires(python_client: httpclient.InferenceServerClient) -> None:
    # The callee's queue policy allows the override: 1 ms, while the one instance is held by an earlier request.
    assert _probe(python_client, "bls_timeout_expires") == "Request timeout expired"


def test_bls_refusals_carry_tritons_prefix(python_client: httpclient.InferenceServerClient) -> None:
    # Triton prefixes what the server refuses before the request runs (exec and exec(decoupled=True) alike).
    expected = (
        "Model no_such_model - Error when running inference: Request for unknown model: 'no_such_model' is not found"
    )
    assert _probe(python_client, "bls_unknown").split("\n") == [expected, expected]


def _stream_error(python_server: Server, model: str, text: str) -> str:
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
    try:
        tensor = grpcclient.InferInput("IN", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
        client.async_stream_infer(model, [tensor])
        item = results.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert isinstance(item, InferenceServerException)
    return str(item.message())


def test_a_decoupled_execute_that_returns_a_response_is_named_by_its_instance(python_server: Server) -> None:
    message = _stream_error(python_server, "qa_probe_decoupled", "return_response")
    assert (
        "Python model 'qa_probe_decoupled_0_0' is using the decoupled mode and the execute function must return None."
        in message
    )


def test_non_decoupled_sender_keeps_the_sent_response(python_client: httpclient.InferenceServerClient) -> None:
    assert _probe(python_client, "sender_sent") == "sent"
    # Sent, then returned as well: the sent one is the answer, as in Triton.
    assert _probe(python_client, "sender_sent_and_returned") == "sent"
    # A second send raises in execute; the first response was delivered already, and stays the answer.
    assert _probe(python_client, "sender_two") == "first"


def test_non_decoupled_sender_cannot_send_final_alone(python_client: httpclient.InferenceServerClient) -> None:
    message = _probe_error(python_client, "sender_final_only")
    assert "Non-decoupled model cannot send complete final before sending a response" in message


def test_cancelling_a_decoupled_bls_stream_only_tells_the_callee(
    python_client: httpclient.InferenceServerClient,
) -> None:
    # Triton flags the callee's request as cancelled and delivers whatever the callee still sends.
    assert _probe(python_client, "bls_cancel_stream") == "first,cancelled: True"


def test_an_execute_that_never_returns_does_not_keep_the_daemon_from_stopping(tmp_path: Path) -> None:
    # An execute runs as long as it needs while the daemon serves; on SIGTERM it gets --exit-timeout-secs, then the
    # model is unloaded without it (its process killed) and the daemon exits.
    repo = tmp_path / "repo"
    shutil.copytree(PYTHON_MODELS / "add_sub_python", repo / "add_sub_python")
    # Beside it, a model whose version folder holds no model.py: refused in Triton's words.
    shutil.copytree(PYTHON_MODELS / "add_sub_python", repo / "no_file")
    (repo / "no_file" / "1" / "model.py").unlink()
    config = repo / "no_file" / "config.pbtxt"
    config.write_text(config.read_text(encoding="utf-8").replace('"add_sub_python"', '"no_file"'), encoding="utf-8")
    never = tmp_path / "never-created"
    flags = ["--exit-timeout-secs=1", "--strict-readiness=false", "--backend-config", "python,stub-timeout-seconds=2"]
    with run_server([repo], *flags) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        (missing,) = [e for e in client.get_model_repository_index() if e["name"] == "no_file"]
        assert missing["reason"].endswith(
            "Failed to preinitialize Python stub: Python model file not found in 'no_file/1/model.py'"
        )
        held = client.async_infer("add_sub_python", add_sub_inputs(), parameters={"hold": str(never)})
        deadline = time.monotonic() + 60
        while f"add_sub_python holds its instance until {never} exists" not in server.log():
            assert time.monotonic() < deadline, "the request never began"
            gevent.sleep(0.05)  # the HTTP client's async requests are greenlets: they go while this one yields
        server.process.send_signal(signal.SIGTERM)
        # Far below the model's own two minutes: the daemon does not wait for it.
        assert server.process.wait(60) == 0
        assert "unloading the models without waiting for them" in server.log()
        del held


def _python_model(repo: Path, name: str, code: str, *, output: str = "OUT") -> None:
    """A Python model of one FP32 input IN and one output, without batching."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code, encoding="utf-8")
    (repo / name / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n',
        encoding="utf-8",
    )


BLS_IN_INITIALIZE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.InferenceRequest(model_name="add_sub_python", inputs=[], requested_output_names=[]).exec()

    def execute(self, requests):
        return None
"""


def test_bls_outside_execute_is_refused(tmp_path: Path) -> None:
    # Triton's rule: BLS only while execute runs, never from initialize (nor finalize).
    repo = tmp_path / "repo"
    shutil.copytree(PYTHON_MODELS / "add_sub_python", repo / "add_sub_python")
    _python_model(repo, "early", BLS_IN_INITIALIZE)
    with run_server([repo], "--strict-readiness=false") as server:
        index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    (early,) = [e for e in index if e["name"] == "early"]
    assert early["state"] == "UNAVAILABLE"
    assert "BLS is only supported during the 'execute' function." in early["reason"]


ASKS_IN_INITIALIZE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        ready = pb_utils.is_model_ready("add_sub_python")
        pb_utils.Logger.log_info(f"asks sees add_sub_python ready: {ready}")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")]) for r in requests]
"""


def test_model_management_from_initialize_is_answered(tmp_path: Path) -> None:
    # As Triton: initialize may ask about (and load or unload) other models; the load goes on once it is answered.
    repo = tmp_path / "repo"
    shutil.copytree(PYTHON_MODELS / "add_sub_python", repo / "add_sub_python")
    _python_model(repo, "asks", ASKS_IN_INITIALIZE, output="IN")
    with run_server([repo]) as server:
        assert httpclient.InferenceServerClient(server.http_url).is_model_ready("asks")
        assert "asks sees add_sub_python ready: " in server.log()


def test_a_model_imports_the_files_beside_it_relatively(tmp_path: Path) -> None:
    # As Triton imports it (the module 1.model of the package its version folder is): `from .helpers import ...`.
    repo = tmp_path / "repo"
    _python_model(
        repo,
        "relative",
        "import triton_python_backend_utils as pb_utils\n"
        "from .helpers import FACTOR\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', "
        "pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy() * FACTOR)]) for r in requests]\n",
    )
    (repo / "relative" / "1" / "helpers.py").write_text("FACTOR = 3.0\n", encoding="utf-8")
    with run_server([repo]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([2.0], dtype=np.float32))
        assert client.infer("relative", [tensor]).as_numpy("OUT").tolist() == [6.0]


BF16_THROUGH_TORCH = """
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            try:
                tensor.as_numpy()
            except pb_utils.TritonModelException as error:
                pb_utils.Logger.log_info(f"as_numpy refused: {error}")
            doubled = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()) * 2
            assert doubled.dtype == torch.bfloat16
            out = pb_utils.Tensor.from_dlpack("OUT", torch.utils.dlpack.to_dlpack(doubled))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def test_bf16_tensors_travel_through_dlpack(tmp_path: Path) -> None:
    # numpy has no bfloat16: as in Triton, a BF16 tensor goes to and from a framework through DLPack.
    repo = tmp_path / "repo"
    _python_model(repo, "bf16", BF16_THROUGH_TORCH)
    config = repo / "bf16" / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace("TYPE_FP32", "TYPE_BF16").replace("[ 1 ]", "[ 3 ]")
    config.write_text(text, encoding="utf-8")
    with run_server([repo]) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        values = np.array([1.5, -2.0, 0.25], dtype=ml_dtypes.bfloat16)
        tensor = grpcclient.InferInput("IN", [3], "BF16")
        tensor.set_data_from_numpy(values)
        result = client.infer("bf16", [tensor]).as_numpy("OUT")
        assert result.astype(np.float32).tolist() == [3.0, -4.0, 0.5]
        assert "as_numpy refused: Tensor dtype is BF16 and cannot be converted to numpy" in server.log()
