"""config.pbtxt parsing, and the JSON form served by HTTP ``/config`` and given to Python models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc.model_config_pb2 as triton_model_config
from google.protobuf import json_format

from edged.core.config.model_config import (
    model_config_from_json,
    model_config_to_dict,
    model_config_to_json,
    parse_model_config,
)
from edged.core.config.validation import validate_model_config
from edged.core.request.datatypes import (
    CONFIG_BY_WIRE_NAME,
    ELEMENT_SIZE_BY_WIRE_NAME,
    NUMPY_DTYPE_BY_WIRE_NAME,
    WIRE_NAME_BY_CONFIG,
    wire_name_for_numpy,
)
from edged.errors import EdgedError, ErrorCode
from edged.proto import model_config_pb2

CONFIG_PBTXT = """
# A two-input model, batched dynamically, with priorities.
name: "add_sub"
backend: "python"
max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }

input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ -1 ]
    optional: true
  }
]
output {
  name: "OUTPUT0"
  data_type: TYPE_FP32
  dims: [ 4 ]
}
output {
  name: "OUTPUT1"
  data_type: TYPE_STRING
  dims: [ 2, 2 ]
  reshape: { shape: [ 4 ] }  # flattened inside the model
}

instance_group [
  { kind: KIND_CPU, count: 2 },
  { name: "spare", kind: KIND_CPU, count: 1, passive: true }
]

dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { max_queue_size: 16 }
  priority_queue_policy {
    key: 1
    value: {
      timeout_action: DELAY
      default_timeout_microseconds: 5000000000
      allow_timeout_override: true
    }
  }
}

parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
parameters: { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
"""


def test_parse_realistic_config() -> None:
    config = parse_model_config(CONFIG_PBTXT, "add_sub/config.pbtxt")

    assert config.name == "add_sub"
    assert config.backend == "python"
    assert config.max_batch_size == 8
    assert list(config.version_policy.specific.versions) == [1, 3]
    assert [tensor.name for tensor in config.input] == ["INPUT0", "INPUT1"]
    assert list(config.input[1].dims) == [-1]
    assert config.input[1].optional
    assert config.output[1].data_type == model_config_pb2.TYPE_STRING
    assert list(config.output[1].reshape.shape) == [4]
    assert [group.count for group in config.instance_group] == [2, 1]
    assert config.instance_group[1].passive
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [4, 8]
    assert batching.default_queue_policy.max_queue_size == 16
    policy = batching.priority_queue_policy[1]
    assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.DELAY
    assert policy.default_timeout_microseconds == 5_000_000_000
    assert config.parameters["EXECUTION_ENV_PATH"].string_value == "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    assert config.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "no"


@pytest.mark.parametrize(
    ("text", "location", "detail"),
    [
        ('name: "m"\nmax_batch_size: 8\ninput { name: "a" dims: [ eight ] }', ":3:27: ", "integer: eight"),
        ('name: "m"\nmax_batch_sise: 8', ":2:1: ", 'no field named "max_batch_sise"'),
        ("input {\n  data_type: TYPE_FLOAT32\n}", ":2:14: ", "TYPE_FLOAT32"),
        ('name: "m"\ninstance_group [ { count: 1 }', ":2:30: ", "Expected"),
    ],
)
def test_parse_error_names_file_line_and_column(text: str, location: str, detail: str) -> None:
    with pytest.raises(EdgedError) as caught:
        parse_model_config(text, "add_sub/config.pbtxt")

    error = caught.value
    assert error.code is ErrorCode.INVALID_ARG
    assert error.message.startswith(f"add_sub/config.pbtxt{location}")
    assert detail in error.message
    # protobuf's own "line:column : " prefix and its quote of the line are not repeated.
    assert " : " not in error.message
    assert "'input" not in error.message
    assert "''" not in error.message


def test_dict_form_prints_defaults_enums_and_int64_as_numbers() -> None:
    data = model_config_to_dict(parse_model_config(CONFIG_PBTXT, "add_sub/config.pbtxt"))

    first, second = data["input"]
    assert first == {
        "name": "INPUT0",
        "data_type": "TYPE_FP32",
        "format": "FORMAT_NONE",
        "dims": [4],
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": False,
        "is_non_linear_format_io": False,
    }
    assert second["dims"] == [-1]
    assert second["optional"] is True
    assert data["output"][1]["data_type"] == "TYPE_STRING"
    assert data["output"][1]["dims"] == [2, 2]
    assert data["output"][1]["reshape"] == {"shape": [4]}
    assert data["output"][0]["label_filename"] == ""
    assert data["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert data["instance_group"][0]["kind"] == "KIND_CPU"
    assert data["instance_group"][0]["gpus"] == []

    batching = data["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 2
    assert batching["default_priority_level"] == 2
    assert batching["preserve_ordering"] is False
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 0
    # Map keys stay strings, as JSON requires; the values' 64-bit fields become numbers.
    assert batching["priority_queue_policy"] == {
        "1": {
            "timeout_action": "DELAY",
            "default_timeout_microseconds": 5_000_000_000,
            "allow_timeout_override": True,
            "max_queue_size": 0,
        }
    }
    assert data["parameters"]["EXECUTION_ENV_PATH"] == {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}
    assert data["platform"] == ""
    assert data["max_batch_size"] == 8
    assert data["cc_model_filenames"] == {}
    assert data["model_warmup"] == []
    # Messages with presence are not invented when absent.
    assert "sequence_batching" not in data
    assert "response_cache" not in data


def test_every_int64_field_becomes_a_number() -> None:
    config = model_config_pb2.ModelConfig(name="seq", max_batch_size=4)
    config.sequence_batching.max_sequence_idle_microseconds = 2**63 - 1
    config.sequence_batching.oldest.max_queue_delay_microseconds = 7
    state = config.sequence_batching.state.add(input_name="IN", output_name="OUT", dims=[-1, 2**40])
    state.initial_state.add(dims=[3], zero_data=True)
    config.instance_group.add().secondary_devices.add(device_id=2**62)
    graph = config.optimization.cuda.graph_spec.add(batch_size=1)
    graph.input["x"].dim.extend([-1, 5])
    config.model_warmup.add(name="w").inputs["IN"].dims.extend([1, 2])
    config.model_warmup[0].inputs["IN"].random_data = True

    text = model_config_to_json(config)
    data = json.loads(text)

    sequence = data["sequence_batching"]
    assert sequence["max_sequence_idle_microseconds"] == 2**63 - 1
    assert sequence["oldest"]["max_queue_delay_microseconds"] == 7
    assert sequence["state"][0]["dims"] == [-1, 2**40]
    assert sequence["state"][0]["initial_state"][0]["dims"] == [3]
    assert data["instance_group"][0]["secondary_devices"][0]["device_id"] == 2**62
    assert data["optimization"]["cuda"]["graph_spec"][0]["input"]["x"]["dim"] == [-1, 5]
    assert data["model_warmup"][0]["inputs"]["IN"]["dims"] == [1, 2]
    assert _quoted_integers(data) == []


def _quoted_integers(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value.lstrip("-").isdigit() else []
    if isinstance(value, dict):
        return [found for item in value.values() for found in _quoted_integers(item)]
    if isinstance(value, list):
        return [found for item in value for found in _quoted_integers(item)]
    return []


def test_json_is_compact_and_round_trips() -> None:
    config = parse_model_config(CONFIG_PBTXT, "add_sub/config.pbtxt")

    text = model_config_to_json(config)

    assert isinstance(text, bytes)
    assert b": " not in text
    assert b", " not in text
    assert json.loads(text) == model_config_to_dict(config)
    assert model_config_from_json(text) == config
    assert model_config_from_json(text.decode()) == config


def test_json_matches_what_tritonclient_decodes() -> None:
    config = parse_model_config(CONFIG_PBTXT, "add_sub/config.pbtxt")

    theirs = json_format.Parse(model_config_to_json(config), triton_model_config.ModelConfig())

    assert theirs.SerializeToString(deterministic=True) == config.SerializeToString(deterministic=True)


def test_from_json_accepts_int64_as_numbers_or_strings() -> None:
    config = model_config_from_json('{"name":"m","input":[{"name":"x","data_type":"TYPE_INT64","dims":[-1,"3"]}]}')

    assert list(config.input[0].dims) == [-1, 3]
    assert config.input[0].data_type == model_config_pb2.TYPE_INT64


@pytest.mark.parametrize(
    "text",
    [
        b'{"name": "m",',
        '{"name": "m", "max_batch_sise": 8}',
        '{"input": [{"data_type": "TYPE_FLOAT32"}]}',
        b"\xff\xfe",
    ],
)
def test_from_json_rejects_bad_input(text: str | bytes) -> None:
    with pytest.raises(EdgedError) as caught:
        model_config_from_json(text)

    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message.startswith("failed to parse model configuration JSON: ")
    assert "\n" not in caught.value.message


def test_datatype_tables_cover_every_config_type() -> None:
    config_types = {
        value.number for value in model_config_pb2.DataType.DESCRIPTOR.values if value.name != "TYPE_INVALID"
    }
    assert set(WIRE_NAME_BY_CONFIG) == config_types
    for number, wire in WIRE_NAME_BY_CONFIG.items():
        config_name = model_config_pb2.DataType.Name(number)
        assert wire == ("BYTES" if config_name == "TYPE_STRING" else config_name.removeprefix("TYPE_"))
        assert CONFIG_BY_WIRE_NAME[wire] == number
        assert wire in NUMPY_DTYPE_BY_WIRE_NAME
        assert wire in ELEMENT_SIZE_BY_WIRE_NAME
    assert NUMPY_DTYPE_BY_WIRE_NAME["BF16"] is None
    assert ELEMENT_SIZE_BY_WIRE_NAME["BYTES"] is None
    for wire, dtype in NUMPY_DTYPE_BY_WIRE_NAME.items():
        if dtype is not None and wire != "BYTES":
            assert dtype.itemsize == ELEMENT_SIZE_BY_WIRE_NAME[wire]
            assert wire_name_for_numpy(dtype) == wire


def test_wire_name_for_numpy() -> None:
    assert wire_name_for_numpy(np.float32) == "FP32"
    assert wire_name_for_numpy(np.dtype(">i8")) == "INT64"
    assert wire_name_for_numpy("bool") == "BOOL"
    assert wire_name_for_numpy(np.object_) == "BYTES"
    assert wire_name_for_numpy(np.dtype("S5")) == "BYTES"
    assert wire_name_for_numpy(np.dtype("U3")) == "BYTES"
    with pytest.raises(EdgedError) as caught:
        wire_name_for_numpy(np.complex64)
    assert caught.value.code is ErrorCode.INVALID_ARG


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ('input_name: "S_IN" output_name: "S_OUT" data_type: 32 dims: [ 1 ]', "unknown 'data_type' 32"),
        ('input_name: "S_IN" output_name: "S_OUT" dims: [ 1 ]', "unknown 'data_type' 0"),
        ('output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ]', "both 'input_name' and 'output_name'"),
        ('input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ -7 ]', "S_IN"),
    ],
)
def test_a_sequence_state_is_validated_as_a_tensor(state: str, problem: str) -> None:
    # The ONNX backend maps every state's data type when it loads: an unknown one was a KeyError in check-repo.
    text = (
        'name: "m" backend: "python" max_batch_size: 0 '
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        f"sequence_batching {{ state [ {{ {state} }} ] }}"
    )
    with pytest.raises(EdgedError) as raised:
        validate_model_config(parse_model_config(text, "m/config.pbtxt"))
    assert raised.value.code == ErrorCode.INVALID_ARG
    assert problem in raised.value.message
