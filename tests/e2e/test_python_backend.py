"""The Python backend end to end: Triton model.py files served unchanged (the seeds' models among them), every
dtype through shared memory, Triton's initialize args, wrong answers and crashes of a model, and what the daemon
leaves behind. Everything through the real tritonclient against the real daemon."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import gevent  # type: ignore[import-untyped, unused-ignore]
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ALL_DTYPES, PYTHON_MODELS, PYTHON_STUB_TIMEOUT_S, SHELL_NAME
from prometheus_client.parser import text_string_to_metric_families
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, add_sub_inputs, request, run_server
from tritonclient.utils import InferenceServerException

READY_TIMEOUT_S: Final = 30.0


def _infer_mode(client: httpclient.InferenceServerClient, mode: str) -> httpclient.InferResult:
    tensor = httpclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    return client.infer("misbehave", [tensor])


def _failure(client: httpclient.InferenceServerClient, mode: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        _infer_mode(client, mode)
    return str(info.value.message())


def _wait_ready(client: httpclient.InferenceServerClient, model: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not client.is_model_ready(model):
        assert time.monotonic() < deadline, f"model '{model}' did not come back"
        time.sleep(0.05)


def _wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        # gevent's sleep: the HTTP client's async requests are greenlets, sent only while this one yields.
        gevent.sleep(0.02)


def _pending(server: Server, model: str) -> int:
    """Requests for the model that wait for an instance."""
    metrics = request(server.metrics_url, "GET", "/metrics").body.decode()
    for line in metrics.splitlines():
        if line.startswith(f'nv_inference_pending_request_count{{model="{model}"'):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"no pending request count for {model}")


@pytest.fixture(scope="module")
def patient_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A daemon with the default stub timeout (30 s, where the session's daemon has 2 s), for the tests that hold
    an execution until they let it go."""
    repo = tmp_path_factory.mktemp("patient-repository")
    for model in ("misbehave", "add_sub_python"):
        shutil.copytree(PYTHON_MODELS / model, repo / model)
    with run_server([repo]) as running:
        yield running


def _stub_pid(client: httpclient.InferenceServerClient) -> int:
    return int(_infer_mode(client, "ok").as_numpy("OUT")[0])


@pytest.fixture(autouse=True)
def _misbehave_serving_afterwards(python_client: httpclient.InferenceServerClient) -> Iterator[None]:
    """Whatever a test did to the misbehaving model, it is back afterwards, and add_sub_python still computes."""
    yield
    _wait_ready(python_client, "misbehave")
    _infer_mode(python_client, "ok")
    result = python_client.infer("add_sub_python", add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)


# --- models that work -------------------------------------------------------------------------------------------


def test_add_sub_python_matches_the_onnx_add_sub(python_client: httpclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(4)
    for batch in (1, 3, 8):
        input0 = rng.standard_normal((batch, 16)).astype(np.float32)
        input1 = rng.standard_normal((batch, 16)).astype(np.float32)
        python = python_client.infer("add_sub_python", add_sub_inputs(input0, input1))
        onnx = python_client.infer("add_sub", add_sub_inputs(input0, input1))
        for name in ("OUTPUT0", "OUTPUT1"):
            np.testing.assert_array_equal(python.as_numpy(name), onnx.as_numpy(name))
        np.testing.assert_array_equal(python.as_numpy("OUTPUT0"), input0 + input1)


def test_add_sub_python_over_grpc_with_requested_outputs(
    python_grpc_client: grpcclient.InferenceServerClient,
) -> None:
    inputs = []
    for name, array in (("INPUT0", ADD_SUB_INPUT0), ("INPUT1", ADD_SUB_INPUT1)):
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = python_grpc_client.infer(
        "add_sub_python", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")], request_id="r-7"
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)
    assert result.as_numpy("OUTPUT0") is None
    assert result.get_response().id == "r-7"


def test_initialize_gets_every_args_key_triton_passes(patient_server: Server, tmp_path: Path) -> None:
    # Two instances: while one holds a request (until the test lets it go), the next request reaches the other.
    client = httpclient.InferenceServerClient(patient_server.http_url, concurrency=2)
    release = tmp_path / "release"
    held = client.async_infer("add_sub_python", add_sub_inputs(), parameters={"echo_args": True, "hold": str(release)})
    try:
        _wait_until(
            "one instance holds a request",
            lambda: f"add_sub_python holds its instance until {release} exists" in patient_server.log(),
        )
        other = client.infer("add_sub_python", add_sub_inputs(), parameters={"echo_args": True})
    finally:
        release.touch()
    seen: dict[str, dict[str, str]] = {}
    for result in (held.get_result(), other):
        parameters = result.get_response()["parameters"]
        seen[parameters["model_instance_name"]] = parameters
    assert sorted(seen) == ["add_sub_python_0_0", "add_sub_python_0_1"]
    args = seen["add_sub_python_0_1"]
    assert args["model_name"] == "add_sub_python"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert Path(args["model_repository"]).name == "add_sub_python"


def test_seed_add_model_reads_its_model_path_parameter(python_server: Server) -> None:
    client = httpclient.InferenceServerClient(python_server.http_url)
    input0 = np.array([1, 2, 3, 4], dtype=np.float32)
    input1 = np.array([10, 20, 30, 40], dtype=np.float32)
    inputs = []
    for name, array in (("INPUT0", input0), ("INPUT1", input1)):
        tensor = httpclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer("seed_add", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
    # Its Logger lines reach the daemon's log, model_path among them.
    log = python_server.log()
    assert "seed_add_0: Model mount path: /mnt/models/seed_add" in log
    assert "Processing request: INPUT0 shape (4,), INPUT1 shape (4,)" in log


def test_seed_auto_complete_model_fills_its_config(python_client: httpclient.InferenceServerClient) -> None:
    config = python_client.get_model_config("seed_auto_complete")
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 0
    inputs = {i["name"]: i for i in config["input"]}
    assert inputs["INPUT0"]["optional"] is True and inputs["INPUT1"]["optional"] is False
    assert [o["name"] for o in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert all(t["data_type"] == "TYPE_FP32" and t["dims"] == [4] for t in [*config["input"], *config["output"]])
    # INPUT0 is optional: the filled-in loop body uses zeros for it.
    input1 = np.array([1, 2, 3, 4], dtype=np.float32)
    tensor = httpclient.InferInput("INPUT1", [4], "FP32")
    tensor.set_data_from_numpy(input1)
    result = python_client.infer("seed_auto_complete", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), -input1)


def _expected_logits(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    means = batch.reshape(batch.shape[0], -1).mean(axis=1, keepdims=True)
    logits: np.ndarray[Any, Any] = (means * np.arange(1, 1001, dtype=np.float32)).astype(np.float32)
    return logits


@pytest.mark.parametrize("model", ["resnet50", "resnet50_multi"])
def test_npu_tutorial_models_with_a_stand_in_runtime(
    python_client: httpclient.InferenceServerClient, model: str
) -> None:
    image = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT__0", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    for _ in range(3):  # a 600 kB image each time: the rings grow past their first size and are reused
        result = python_client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT__0")])
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), _expected_logits(image), rtol=1e-5)


def test_npu_dynamic_batching_model_splits_its_batch(python_client: httpclient.InferenceServerClient) -> None:
    # Without a dynamic batcher each execute gets a list of one request, carrying batches of 1 to 4 images.
    rng = np.random.default_rng(2)
    for batch in (1, 2, 4):
        images = rng.random((batch, 3, 224, 224), dtype=np.float32)
        tensor = httpclient.InferInput("INPUT__0", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        result = python_client.infer("resnet50_batching", [tensor])
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), _expected_logits(images), rtol=1e-5)


def _sample(dtype: str) -> np.ndarray[Any, Any]:
    if dtype == "BYTES":
        return np.array([[b"a", b"", b"\x00\xffbinary"], [b"longer text", b"x" * 300, b"z"]], dtype=np.object_)
    if dtype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if dtype == "BF16":
        return np.array([[1.0, 2.0, -3.0], [0.0, 1.5, -0.0]], dtype=ml_dtypes.bfloat16)
    numpy_type = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dtype)
    if numpy_type is not None:
        return np.array([[1.5, -2.25, 3e3], [0.0, -0.0, 7.125]], dtype=numpy_type)
    return np.array([[0, 1, 2], [3, 100, 127]], dtype=dtype.lower())


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_identity_over_every_dtype(python_grpc_client: grpcclient.InferenceServerClient, dtype: str) -> None:
    array = _sample(dtype)
    tensor = grpcclient.InferInput(f"INPUT_{dtype}", list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    result = python_grpc_client.infer(
        "identity_python", [tensor], outputs=[grpcclient.InferRequestedOutput(f"OUTPUT_{dtype}")]
    )
    output = result.as_numpy(f"OUTPUT_{dtype}")
    assert output.shape == array.shape
    assert output.dtype == array.dtype
    np.testing.assert_array_equal(output, array)


def test_identity_of_all_dtypes_in_one_request(python_client: httpclient.InferenceServerClient) -> None:
    inputs, outputs = [], []
    for dtype in ALL_DTYPES:
        array = _sample(dtype)
        tensor = httpclient.InferInput(f"INPUT_{dtype}", list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
        outputs.append(httpclient.InferRequestedOutput(f"OUTPUT_{dtype}"))
    result = python_client.infer("identity_python", inputs, outputs=outputs)
    for dtype in ALL_DTYPES:
        np.testing.assert_array_equal(result.as_numpy(f"OUTPUT_{dtype}"), _sample(dtype))


def test_large_bytes_tensor(python_client: httpclient.InferenceServerClient) -> None:
    array = np.array([[os.urandom(4096) for _ in range(600)]], dtype=np.object_)
    tensor = httpclient.InferInput("INPUT_BYTES", list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    result = python_client.infer("identity_python", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT_BYTES")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT_BYTES"), array)


def test_an_empty_tensor_after_another_reaches_the_model_and_back(
    python_client: httpclient.InferenceServerClient,
) -> None:
    """The last tensor of a message empty: it has no bytes to lie past the payload's end (the stub once died so)."""
    full = httpclient.InferInput("INPUT_FP32", [1, 1], "FP32")
    full.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    empty = httpclient.InferInput("INPUT_UINT32", [1, 0], "UINT32")
    empty.set_data_from_numpy(np.zeros((1, 0), dtype=np.uint32))
    outputs = [httpclient.InferRequestedOutput("OUTPUT_FP32"), httpclient.InferRequestedOutput("OUTPUT_UINT32")]
    for _ in range(3):  # through the message itself and, once the stub has a ring, the same way again
        result = python_client.infer("identity_python", [full, empty], outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT_FP32"), np.ones((1, 1)))
        assert result.as_numpy("OUTPUT_UINT32").shape == (1, 0)


def test_bytes_that_are_not_utf8_are_never_altered(
    python_client: httpclient.InferenceServerClient, python_grpc_client: grpcclient.InferenceServerClient
) -> None:
    """JSON has no form for bytes that are not UTF-8: asked for as JSON, such an output fails the request (as under
    Triton) instead of reaching the client with its bytes replaced; in binary and over gRPC it arrives unchanged."""
    array = np.array([[b"\xff\xfe raw", b"text"]], dtype=np.object_)
    tensor = httpclient.InferInput("INPUT_BYTES", [1, 2], "BYTES")
    tensor.set_data_from_numpy(array, binary_data=True)
    as_json = [httpclient.InferRequestedOutput("OUTPUT_BYTES", binary_data=False)]
    with pytest.raises(InferenceServerException) as info:
        python_client.infer("identity_python", [tensor], outputs=as_json)
    assert info.value.status() == "400"
    assert info.value.message() == (
        "output 'OUTPUT_BYTES' element 0 is not UTF-8 (invalid start byte at byte 0), which JSON cannot carry: "
        "request the output with binary_data=true to receive its bytes"
    )
    as_binary = [httpclient.InferRequestedOutput("OUTPUT_BYTES", binary_data=True)]
    result = python_client.infer("identity_python", [tensor], outputs=as_binary)
    assert result.as_numpy("OUTPUT_BYTES").tolist() == array.tolist()
    grpc_tensor = grpcclient.InferInput("INPUT_BYTES", [1, 2], "BYTES")
    grpc_tensor.set_data_from_numpy(array)
    grpc_result = python_grpc_client.infer(
        "identity_python", [grpc_tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT_BYTES")]
    )
    assert grpc_result.as_numpy("OUTPUT_BYTES").tolist() == array.tolist()


def test_logger_lines_reach_the_daemon_log(python_server: Server) -> None:
    client = httpclient.InferenceServerClient(python_server.http_url)
    _infer_mode(client, "log")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while "misbehave_0: misbehave says: careful" not in python_server.log():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert re.search(
        r"^W\d{4} .* edged\.backends\.python\] misbehave_0: misbehave says: careful$", python_server.log(), re.MULTILINE
    )


def test_model_management_and_metrics_api(
    python_server: Server, python_client: httpclient.InferenceServerClient
) -> None:
    parameters = _infer_mode(python_client, "api").get_response()["parameters"]
    assert parameters["add_sub_ready"] is True and parameters["add_sub_v1_ready"] is True
    assert parameters["unknown_ready"] is False
    # The folder of the model file, as Triton's stub gives it: <model>/<version>.
    assert Path(parameters["model_dir"]).parts[-2:] == ("misbehave", "1")
    assert parameters["load_error"] == "explicit model load / unload is not allowed if polling is enabled"
    assert parameters["counter"] == 2
    # The metrics endpoint exports the model's family under its own name and labels, summed over every call.
    calls = _api_calls(python_server)
    _infer_mode(python_client, "api")
    assert _api_calls(python_server) == calls + 2
    metrics = request(python_server.metrics_url, "GET", "/metrics").body.decode()
    assert "# HELP misbehave_calls calls of the api mode\n# TYPE misbehave_calls counter\n" in metrics


def _api_calls(server: Server) -> float:
    metrics = request(server.metrics_url, "GET", "/metrics").body.decode()
    (family,) = (f for f in text_string_to_metric_families(metrics) if f.name == "misbehave_calls")
    (sample,) = family.samples
    assert sample.labels == {"mode": "api"}
    return float(sample.value)


# --- models that fail -------------------------------------------------------------------------------------------


def test_initialize_failure_makes_the_model_unavailable_with_its_reason(
    python_client: httpclient.InferenceServerClient,
) -> None:
    assert not python_client.is_model_ready("init_fails")
    index = {m["name"]: m for m in python_client.get_model_repository_index()}
    assert index["init_fails"]["state"] == "UNAVAILABLE"
    assert index["init_fails"]["reason"].endswith("RuntimeError: weights file is missing")
    assert "model.py" not in index["init_fails"]["reason"]


def test_a_model_name_with_shell_metacharacters_is_refused(python_client: httpclient.InferenceServerClient) -> None:
    index = {m["name"]: m for m in python_client.get_model_repository_index()}
    assert index[SHELL_NAME]["state"] == "UNAVAILABLE"
    assert "shell metacharacters" in index[SHELL_NAME]["reason"]
    assert not Path("pwned").exists()


def test_an_exception_in_execute_fails_the_request(python_client: httpclient.InferenceServerClient) -> None:
    message = _failure(python_client, "raise")
    assert message == (
        "Failed to process the request(s) for model instance 'misbehave_0', message: "
        "ValueError: the model refused this request"
    )


def test_an_error_response_keeps_its_message_and_code(python_server: Server) -> None:
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    tensor = grpcclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"error_response"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer("misbehave", [tensor])
    assert info.value.message() == "no such thing"
    assert info.value.status() == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("wrong_count", "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:2"),
        ("none", "Expected an 'InferenceResponse' object in the execute function return list, found type"),
        ("not_list", "Expected a list in the execute return, found type"),
    ],
)
def test_wrong_answers_are_clear_errors(
    python_client: httpclient.InferenceServerClient, mode: str, expected: str
) -> None:
    pid = _stub_pid(python_client)
    message = _failure(python_client, mode)
    assert message.startswith("Failed to process the request(s) for model instance 'misbehave_0', message: ")
    assert expected in message
    assert _stub_pid(python_client) == pid  # a wrong answer is not a crash


def test_outputs_unlike_the_configuration_go_as_triton_sends_them(
    python_server: Server, python_client: httpclient.InferenceServerClient
) -> None:
    # Triton 2.51 (checked) sends an output of another data type as it is and drops an output the configuration
    # does not declare; python_backend's bls_decoupled example relies on the first. edged does the same, and says
    # so in its log once per output.
    result = _infer_mode(python_client, "bad_dtype")
    assert result.get_output("OUT")["datatype"] == "INT64"
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.zeros(1, dtype=np.int64))
    result = _infer_mode(python_client, "bad_name")
    assert result.get_response()["outputs"] == []
    for _ in range(2):
        _infer_mode(python_client, "bad_dtype")
    log = python_server.log()
    dtype_line = "output 'OUT' of model 'misbehave' is INT64, but the model configuration declares TYPE_FP32"
    assert log.count(dtype_line) == 1
    assert log.count("model 'misbehave' answered with output 'NOT_AN_OUTPUT', which its configuration does not") == 1


@pytest.mark.parametrize(
    ("mode", "how"),
    [
        ("sys_exit", "it exited with status 3"),
        ("os_exit", "it exited with status 7"),
        ("segfault", "it was killed by signal 11 (SIGSEGV)"),
    ],
)
def test_a_crashed_stub_fails_its_request_and_comes_back(
    python_server: Server, python_client: httpclient.InferenceServerClient, mode: str, how: str
) -> None:
    pid = _stub_pid(python_client)
    message = _failure(python_client, mode)
    assert message == (
        "Failed to process the request(s) for model instance 'misbehave_0', message: "
        f"Stub process 'misbehave_0' is not healthy: {how}."
    )
    _wait_ready(python_client, "misbehave")
    assert _stub_pid(python_client) != pid
    # The daemon kept serving everything else meanwhile.
    result = python_client.infer("add_sub", add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    assert "misbehave_0' is serving again" in python_server.log()


def test_the_opt_in_execute_timeout_kills_a_hanging_stub(tmp_path: Path) -> None:
    """execute-timeout-seconds (edged's own, off by default as Triton has none): an execute that runs past it has
    its stub killed and restarted, and its request fails."""
    repo = tmp_path / "repository"
    shutil.copytree(PYTHON_MODELS / "misbehave", repo / "misbehave")
    with run_server([repo], "--backend-config", f"python,execute-timeout-seconds={PYTHON_STUB_TIMEOUT_S}") as running:
        client = httpclient.InferenceServerClient(running.http_url, network_timeout=60.0)
        pid = _stub_pid(client)
        assert _failure(client, "hang") == (
            "Failed to process the request(s) for model instance 'misbehave_0', message: Stub process 'misbehave_0' "
            f"is not healthy: it did not return from execute within {PYTHON_STUB_TIMEOUT_S} s and was killed."
        )
        _wait_ready(client, "misbehave")
        assert _stub_pid(client) != pid
        client.close()


def test_requests_behind_a_crash_are_not_lost(patient_server: Server, tmp_path: Path) -> None:
    """Requests queued while the stub runs one that kills it: only the request it was running fails; the rest run
    on the restarted stub, every one answered."""
    client = httpclient.InferenceServerClient(patient_server.http_url, concurrency=16)
    pid = _stub_pid(client)
    release = tmp_path / "release"
    mode = httpclient.InferInput("MODE", [1], "BYTES")
    mode.set_data_from_numpy(np.array([f"os_exit_when:{release}".encode()], dtype=np.object_))
    crash = client.async_infer("misbehave", [mode])
    try:
        # It runs, and exits only once the requests that follow are queued behind it: the stub's pipeline full (the
        # requests the daemon sends on to a busy stub) and more waiting for the instance.
        _wait_until(
            "the stub runs the request that kills it",
            lambda: f"stub {pid} exits with status 7 once {release} exists" in patient_server.log(),
        )
        followers = []
        for _ in range(12):
            tensor = httpclient.InferInput("MODE", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([b"ok"], dtype=np.object_))
            followers.append(client.async_infer("misbehave", [tensor]))
        _wait_until("requests queue behind the stub", lambda: _pending(patient_server, "misbehave") > 0)
    finally:
        release.touch()
    with pytest.raises(InferenceServerException, match="it exited with status 7"):
        crash.get_result()
    pids = {int(call.get_result().as_numpy("OUT")[0]) for call in followers}
    # Every one ran on the restarted stub.
    assert len(pids) == 1 and pid not in pids
    assert all(pid > 0 for pid in pids)


def test_many_requests_in_flight_each_get_their_own_answer(python_server: Server) -> None:
    """With requests queued on the stubs at once, every answer still belongs to its request."""
    client = httpclient.InferenceServerClient(python_server.http_url, concurrency=16)
    rng = np.random.default_rng(11)
    pending = []
    for _ in range(200):
        input0 = rng.standard_normal((1, 16)).astype(np.float32)
        input1 = rng.standard_normal((1, 16)).astype(np.float32)
        pending.append((input0, input1, client.async_infer("add_sub_python", add_sub_inputs(input0, input1))))
    for input0, input1, call in pending:
        result = call.get_result()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), input0 - input1)


def test_the_model_is_not_ready_while_its_stub_restarts(
    python_server: Server, python_client: httpclient.InferenceServerClient, python_repository: Path
) -> None:
    pid = _stub_pid(python_client)
    # The restarted stub's initialize waits until the test removes this file: the restart lasts as long as the test
    # needs, on any machine.
    hold = python_repository / "misbehave" / "hold_initialize"
    hold.touch()
    try:
        before = len(python_server.log())
        os.kill(pid, signal.SIGKILL)
        _wait_until(
            "the restarted stub initializes",
            lambda: f"waits until {hold} is gone" in python_server.log()[before:],
        )
        assert not python_client.is_model_ready("misbehave"), "the model stayed ready with its stub killed"
    finally:
        hold.unlink()
    _wait_ready(python_client, "misbehave")
    assert _stub_pid(python_client) != pid


def test_is_ready_of_the_model_is_consulted(python_client: httpclient.InferenceServerClient) -> None:
    _infer_mode(python_client, "unready")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while python_client.is_model_ready("misbehave"):
        assert time.monotonic() < deadline, "the model's is_ready() was not consulted"
        time.sleep(0.1)
    _infer_mode(python_client, "ready")
    _wait_ready(python_client, "misbehave")


def test_no_shared_memory_is_left_in_dev_shm(python_client: httpclient.InferenceServerClient) -> None:
    before = set(os.listdir("/dev/shm"))
    image = np.ones((1, 3, 224, 224), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT__0", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    python_client.infer("resnet50", [tensor])
    _failure(python_client, "segfault")
    _wait_ready(python_client, "misbehave")
    assert set(os.listdir("/dev/shm")) == before


def test_statistics_count_python_requests(python_client: httpclient.InferenceServerClient) -> None:
    before = python_client.get_inference_statistics("seed_add")["model_stats"][0]["inference_stats"]["success"]
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.zeros(4, dtype=np.float32))
    other = httpclient.InferInput("INPUT1", [4], "FP32")
    other.set_data_from_numpy(np.zeros(4, dtype=np.float32))
    python_client.infer("seed_add", [tensor, other])
    after = python_client.get_inference_statistics("seed_add")["model_stats"][0]["inference_stats"]["success"]
    assert after["count"] == before["count"] + 1


# --- the daemon's own end -----------------------------------------------------------------------------------------


def test_stubs_finalize_on_stop_and_exit_when_the_daemon_is_killed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(PYTHON_MODELS / "misbehave", repo / "misbehave")
    shutil.copytree(PYTHON_MODELS / "add_sub_python", repo / "add_sub_python")
    with run_server([repo]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        pid = _stub_pid(client)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(10) == 0
        assert "add_sub_python_0_0: add_sub_python finalized" in server.log()
        assert "add_sub_python_0_1: add_sub_python finalized" in server.log()
    assert not _alive(pid)
    # kill -9 of the daemon: its stubs see their socket close and exit at once.
    with run_server([repo]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        pid = _stub_pid(client)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, "a stub outlived its daemon"
            time.sleep(0.05)
        server.process.returncode = 0  # killed on purpose: run_server must not report it as a crash


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
