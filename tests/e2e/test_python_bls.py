"""Business logic scripting: a Python model calling other models of the daemon through the core, the ONNX add_sub
and the Python add_sub_python, synchronously and with ``async def execute``, a decoupled model through
``exec(decoupled=True)``, and failures that come back as responses with errors, not as crashes."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server
from tritonclient.utils import InferenceServerException


def _inputs(model_name: str) -> list[httpclient.InferInput]:
    name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([model_name.encode()], dtype=np.object_))
    inputs = [name]
    for tensor_name, array in (("INPUT0", ADD_SUB_INPUT0), ("INPUT1", ADD_SUB_INPUT1)):
        tensor = httpclient.InferInput(tensor_name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("callee", ["add_sub", "add_sub_python"])
def test_sync_bls_calls_an_onnx_and_a_python_model(
    python_client: httpclient.InferenceServerClient, callee: str
) -> None:
    result = python_client.infer("bls_sync", _inputs(callee))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)


def test_async_bls_calls_both_at_once(python_client: httpclient.InferenceServerClient) -> None:
    result = python_client.infer("bls_async", _inputs(""))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * (ADD_SUB_INPUT0 + ADD_SUB_INPUT1))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 2 * (ADD_SUB_INPUT0 - ADD_SUB_INPUT1))


def test_decoupled_bls_iterates_every_response(python_client: httpclient.InferenceServerClient) -> None:
    result = python_client.infer("bls_sync", _inputs("repeat_decoupled"))
    # repeat_decoupled answers once per element of INPUT0 (0..15), then with an empty final response.
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), ADD_SUB_INPUT0.sum()))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full((1, 16), 16.0))


def test_bls_to_an_unknown_model_is_an_error_response(python_client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        python_client.infer("bls_sync", _inputs("no_such_model"))
    assert info.value.message() == (
        "Failed to process the request(s) for model instance 'bls_sync_0', message: "
        "TritonModelException: Model no_such_model - Error when running inference: Request for unknown model: "
        "'no_such_model' is not found"
    )
    # The error response of an async BLS call is passed on unchanged by the model.
    with pytest.raises(InferenceServerException) as info:
        python_client.infer("bls_async", _inputs("no_such_model"))
    assert info.value.message() == (
        "Model no_such_model - Error when running inference: Request for unknown model: 'no_such_model' is not found"
    )
    assert info.value.status() == "404"


def test_bls_takes_bytes_wherever_tritons_binding_takes_a_string(
    python_server: Server, python_client: httpclient.InferenceServerClient
) -> None:
    """A model that hands on ``as_numpy()[0]`` (bytes) as a model name, and bytes for output names, the request id,
    a log line and an error message, works as under Triton, whose binding converts bytes to its strings."""
    result = python_client.infer("bls_sync", _inputs("bytes:add_sub"))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)
    assert "bls_sync_0: bls_sync calls add_sub with bytes" in python_server.log()
    with pytest.raises(InferenceServerException) as info:
        python_client.infer("bls_sync", _inputs("bytes:no_such_model"))
    assert info.value.message() == (
        "in bytes: Model no_such_model - Error when running inference: Request for unknown model: 'no_such_model' is "
        "not found"
    )


def test_bls_with_bad_inputs_reports_the_callees_validation(python_client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        python_client.infer("bls_sync", _inputs("identity_python"))
    assert info.value.message().endswith("unexpected inference output 'OUTPUT0' for model 'identity_python'")
