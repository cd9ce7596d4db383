"""Model-config checks that follow Triton 2.51's own (its qa, L0_model_config, greps its log for the texts).

Each refused row is a config.pbtxt and the whole message edged gives for it, which is Triton's message; the texts
were checked against a Triton 2.51 server given the same configs on the Python backend. Each accepted row is a config
that must keep loading. The configs shipped in the repository and in the tests' data are completed as the manager
completes them (backend fields, then defaults) and must pass as well.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.core.config.defaults import normalize_model_config
from edged.core.config.model_config import parse_model_config
from edged.core.config.validation import PLATFORMS_BY_BACKEND, validate_model_config
from edged.core.repository.scan import BACKEND_BY_PLATFORM, ModelSource, fill_backend_fields
from edged.errors import EdgedError, ErrorCode

ROOT = Path(__file__).resolve().parents[2]

# A batching model on the Python backend with one variable-size input and output.
PY = 'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
MODEL = PY + IO
STEP = (
    'step [ { model_name: "a" model_version: -1 input_map { key: "x" value: "INPUT" } '
    'output_map { key: "y" value: "OUTPUT" } } ]'
)
ENSEMBLE = 'name: "m"\nplatform: "ensemble"\nmax_batch_size: 8\n' + IO
ENSEMBLE_OK = ENSEMBLE + f"ensemble_scheduling {{ {STEP} }}\n"

BATCH_INPUT_KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)


def batch_input(kind: str, sources: str = 'source_input: "INPUT"', data_type: str = "TYPE_FP32") -> str:
    return MODEL + f'batch_input [ {{ kind: {kind} target_name: "B" data_type: {data_type} {sources} }} ]\n'


def batch_output(targets: str = 'target_name: "OUTPUT"', sources: str = 'source_input: "INPUT"', kind: str = "") -> str:
    kind = kind or "BATCH_SCATTER_WITH_INPUT_SHAPE"
    return MODEL + f"batch_output [ {{ {targets} kind: {kind} {sources} }} ]\n"


def controls(*entries: str, strategy: str = "") -> str:
    """A sequence model whose control_input are ``entries``, each 'NAME KIND values'."""
    written = []
    for entry in entries:
        tensor, kind, values = [*entry.split(" ", 2), ""][:3]
        written.append(f'{{ name: "{tensor}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {values} }} ] }}')
    return MODEL + f"sequence_batching {{ {strategy} control_input [ {', '.join(written)} ] }}\n"


def reshaped(kind: str, dims: str, shape: str, max_batch_size: int = 8) -> str:
    """A Python model whose input (``kind`` "input") or output ("output") has ``dims`` and the reshape ``shape``."""
    tensors = {
        "input": 'input [ { name: "input" data_type: TYPE_FP32 dims: [ 1 ] } ]',
        "output": 'output [ { name: "output" data_type: TYPE_FP32 dims: [ 1 ] } ]',
    }
    tensors[kind] = (
        f'{kind} [ {{ name: "{kind}" data_type: TYPE_FP32 dims: [ {dims} ] reshape {{ shape: [ {shape} ] }} }} ]'
    )
    return f'name: "m"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n{tensors["input"]}\n{tensors["output"]}\n'


def runtime(value: str, backend: str = "python") -> str:
    return f'name: "m"\nbackend: "{backend}"\nmax_batch_size: 8\nruntime: "{value}"\n' + IO


def paired(platform: str, backend: str) -> str:
    lines = [f'platform: "{platform}"' if platform else "", f'backend: "{backend}"' if backend else ""]
    return 'name: "m"\nmax_batch_size: 8\n' + "\n".join(lines) + IO


CHOICES = "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"
RESHAPE_DIMS = "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension for m"

REFUSED = [
    # Batch inputs: one source input for every kind, an INT32 or FP32 tensor, sources that are model inputs.
    *(
        pytest.param(
            batch_input(kind, ""), f"batch input kind '{kind}' expects 1 source input, got 0 for m", id=f"{kind}-0"
        )
        for kind in BATCH_INPUT_KINDS
    ),
    *(
        pytest.param(
            batch_input(kind, 'source_input: [ "INPUT", "INPUT" ]'),
            f"batch input kind '{kind}' expects 1 source input, got 2 for m",
            id=f"{kind}-2",
        )
        for kind in BATCH_INPUT_KINDS
    ),
    pytest.param(batch_input("9"), "unknown batch input kind '' for m", id="batch-input-kind-unnamed"),
    pytest.param(
        batch_input("BATCH_ITEM_SHAPE", data_type="TYPE_INT64"),
        "batch input data type must be TYPE_INT32 or TYPE_FP32 for m",
        id="batch-input-int64",
    ),
    pytest.param(
        batch_input("BATCH_ELEMENT_COUNT", 'source_input: "UNKNOWN_INPUT"'),
        "unknown source input name 'UNKNOWN_INPUT' for m",
        id="batch-input-unknown-source",
    ),
    # Batch outputs: one source input, a model input; targets that are model outputs, each named once.
    pytest.param(
        batch_output(sources=""),
        "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0 for m",
        id="batch-output-no-source",
    ),
    pytest.param(
        batch_output(sources='source_input: [ "INPUT", "INPUT" ]'),
        "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 2 for m",
        id="batch-output-two-sources",
    ),
    pytest.param(batch_output(kind="4"), "unknown batch output kind '' for m", id="batch-output-kind-unnamed"),
    pytest.param(
        batch_output(sources='source_input: "UNKNOWN_INPUT"'),
        "unknown source input name 'UNKNOWN_INPUT' for m",
        id="batch-output-unknown-source",
    ),
    pytest.param(
        batch_output('target_name: "UNKNOWN_OUTPUT"'),
        "unknown target output name 'UNKNOWN_OUTPUT' for m",
        id="batch-output-unknown-target",
    ),
    pytest.param(
        batch_output('target_name: [ "OUTPUT", "OUTPUT" ]'),
        "target output name 'OUTPUT' can only be specified once for m",
        id="batch-output-target-twice",
    ),
    # Sequence batching controls.
    *(
        pytest.param(
            controls(f"A {kind} int32_false_true: [ 0, 1 ]", f"B {kind} int32_false_true: [ 0, 1 ]"),
            f"sequence batching specifies multiple CONTROL_SEQUENCE_{kind} tensors for m",
            id=f"control-{kind.lower()}-twice",
        )
        for kind in ("START", "END", "READY")
    ),
    pytest.param(
        controls("A CORRID data_type: TYPE_UINT64", "B CORRID data_type: TYPE_UINT64"),
        "sequence batching specifies multiple CONTROL_SEQUENCE_CORRID tensors for m",
        id="control-corrid-twice",
    ),
    pytest.param(
        controls("START START int32_false_true: [ 0, 1 ]", "START READY int32_false_true: [ 0, 1 ]"),
        "sequence batching control tensor 'START' is specified for multiple control kinds for m",
        id="control-tensor-twice",
    ),
    pytest.param(
        MODEL + "sequence_batching { control_input [ { control [ { kind: CONTROL_SEQUENCE_START "
        "int32_false_true: [ 0, 1 ] } ] } ] }\n",
        "sequence batching control tensor must have a name for m",
        id="control-no-name",
    ),
    pytest.param(
        controls("START START int32_false_true: [ 0, 1 ]", "READY READY"),
        f"sequence batching must specify either {CHOICES} for CONTROL_SEQUENCE_READY for m",
        id="control-no-values",
    ),
    pytest.param(
        controls("START START int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ]"),
        "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
        "'bool_false_true' for CONTROL_SEQUENCE_START for m",
        id="control-two-value-kinds",
    ),
    pytest.param(
        controls("START START int32_false_true: [ 0, 1, 1 ]"),
        "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m",
        id="control-three-int32",
    ),
    pytest.param(
        controls("END END fp32_false_true: [ 1 ]"),
        "sequence batching control 'fp32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_END for m",
        id="control-one-fp32",
    ),
    pytest.param(
        controls("END END bool_false_true: [ true ]"),
        "sequence batching control 'bool_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_END for m",
        id="control-one-bool",
    ),
    pytest.param(
        # START is checked before READY, whatever their order in the list.
        controls("READY READY", "START START int32_false_true: [ 0 ]"),
        "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m",
        id="control-start-checked-first",
    ),
    pytest.param(
        controls("CORRID CORRID data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ]"),
        f"sequence batching must not specify either {CHOICES} for CONTROL_SEQUENCE_CORRID for m",
        id="control-corrid-values",
    ),
    pytest.param(
        controls("CORRID CORRID data_type: TYPE_FP32"),
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are TYPE_UINT64, "
        "TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        id="control-corrid-fp32",
    ),
    pytest.param(
        MODEL + "sequence_batching { oldest { preferred_batch_size: [ 16 ] } }\n",
        "sequence batching preferred batch size must be <= max batch size for m",
        id="sequence-oldest-too-big",
    ),
    pytest.param(
        MODEL + "sequence_batching { oldest { preferred_batch_size: [ 0 ] } }\n",
        "sequence batching preferred batch size must be positive for m",
        id="sequence-oldest-zero",
    ),
    pytest.param(
        MODEL + "sequence_batching { direct { minimum_slot_utilization: 1.5 } }\n",
        "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
        id="sequence-direct-utilization",
    ),
    pytest.param(
        MODEL + "response_cache { enable: true }\nsequence_batching { }\n",
        "Response Cache does not currently support model m with sequence batching scheduler. Please disable the "
        "response cache.",
        id="sequence-response-cache",
    ),
    pytest.param(
        MODEL + "response_cache { enable: true }\nmodel_transaction_policy { decoupled: true }\n",
        "Response Cache does not currently support model m with 'decoupled' transaction policy. Please disable the "
        "response cache.",
        id="decoupled-response-cache",
    ),
    # Ensembles.
    pytest.param(
        MODEL + f"ensemble_scheduling {{ {STEP} }}\n",
        "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
        id="ensemble-scheduling-elsewhere",
    ),
    pytest.param(
        ENSEMBLE,
        "ensemble scheduling must be set for ensemble m whose platform is ensemble",
        id="ensemble-no-scheduling",
    ),
    pytest.param(
        ENSEMBLE_OK + 'backend: "python"\n',
        "Ensemble model 'm' must have platform type 'ensemble' and empty backend type",
        id="ensemble-backend",
    ),
    pytest.param(
        ENSEMBLE_OK + "instance_group [ { kind: KIND_CPU } ]\n",
        "instance group should not be specified for ensemble 'm'",
        id="ensemble-instance-group",
    ),
    pytest.param(
        ENSEMBLE_OK + "optimization { priority: PRIORITY_MAX }\n",
        "optimization should not be specified for ensemble 'm'",
        id="ensemble-optimization",
    ),
    pytest.param(
        ENSEMBLE_OK + 'model_warmup [ { name: "w" batch_size: 1 } ]\n',
        "model_warmup can not be specified for ensemble 'm'",
        id="ensemble-warmup",
    ),
    pytest.param(ENSEMBLE + "ensemble_scheduling { }\n", "must specify 'step' for ensemble 'm'", id="ensemble-no-step"),
    pytest.param(
        ENSEMBLE + "ensemble_scheduling { " + STEP.replace('model_name: "a" ', "") + " }\n",
        "must specify 'model_name' in step 0 of ensemble 'm'",
        id="ensemble-step-no-model",
    ),
    pytest.param(
        ENSEMBLE + "ensemble_scheduling { " + STEP.replace('input_map { key: "x" value: "INPUT" } ', "") + " }\n",
        "must specify 'input_map' in step 0 of ensemble 'm'",
        id="ensemble-step-no-input-map",
    ),
    pytest.param(
        ENSEMBLE + "ensemble_scheduling { " + STEP.replace('output_map { key: "y" value: "OUTPUT" } ', "") + " }\n",
        "must specify 'output_map' in step 0 of ensemble 'm'",
        id="ensemble-step-no-output-map",
    ),
    pytest.param(
        ENSEMBLE
        + 'ensemble_scheduling { step [ { model_name: "a" model_version: -1 input_map { key: "x" value: "INPUT" } '
        'output_map [ { key: "y" value: "OUTPUT" }, { key: "z" value: "OUTPUT" } ] } ] }\n',
        "ensemble tensor 'OUTPUT' can appear in an output map only once for ensemble 'm' step 0",
        id="ensemble-output-written-twice",
    ),
    # Reshape.
    pytest.param(
        reshaped("input", "1", "", max_batch_size=0),
        "model input 'input' cannot have empty reshape for non-batching model as scalar tensors are not supported "
        "for m",
        id="reshape-empty-not-batching",
    ),
    pytest.param(
        reshaped("output", "1", "", max_batch_size=0),
        "model output 'output' cannot have empty reshape for non-batching model as scalar tensors are not supported "
        "for m",
        id="reshape-empty-not-batching-output",
    ),
    pytest.param(reshaped("input", "2, 2", "0, 4"), f"model input 'input' {RESHAPE_DIMS}", id="reshape-zero"),
    pytest.param(reshaped("output", "4", "2, -2"), f"model output 'output' {RESHAPE_DIMS}", id="reshape-negative"),
    pytest.param(
        reshaped("input", "2, 3", "5"),
        "model input 'input' has different size for dims and reshape for m",
        id="reshape-element-count",
    ),
    pytest.param(
        reshaped("input", "2, -1", "2, 2"),
        "model input 'input' has different size for dims and reshape for m",
        id="reshape-variable-to-fixed",
    ),
    pytest.param(
        reshaped("output", "4", "2, -1"),
        "model output 'output' has different size for dims and reshape for m",
        id="reshape-fixed-to-variable",
    ),
    pytest.param(
        reshaped("input", "2, -1", "2, -1, 2"),
        "model input 'input' has different size for dims and reshape for m",
        id="reshape-variable-run-sizes",
    ),
    pytest.param(
        reshaped("input", "2, -1, 3", "3, -1, 2"),
        "model input 'input' has different size for dims and reshape for m",
        id="reshape-runs-swapped",
    ),
    pytest.param(
        reshaped("input", "2, -1", "2, -1, -1", max_batch_size=0),
        "model input 'input' has different number of variable-size dimensions for dims and reshape for m",
        id="reshape-variable-count",
    ),
    pytest.param(
        reshaped("output", "-1", ""),
        "model output 'output' has different size for dims and reshape for m",
        id="reshape-variable-to-empty",
    ),
    pytest.param(
        reshaped("input", "2", ""),
        "model input 'input' has different size for dims and reshape for m",
        id="reshape-two-to-empty",
    ),
    # Tensor layouts.
    pytest.param(
        PY
        + 'input [ { name: "I" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 2, 2 ] } ]\n'
        + 'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
        "model input NHWC/NCHW require 3 dims for m",
        id="image-format-dims",
    ),
    pytest.param(
        PY
        + 'input [ { name: "I" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]\n'
        + 'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
        "shape tensors are only supported for TensorRT platform for m",
        id="shape-tensor-not-tensorrt",
    ),
    pytest.param(
        PY
        + 'input [ { name: "I" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        + 'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] is_non_linear_format_io: true } ]\n',
        "Non-linear IO format is only supported for the TensorRT platform for m",
        id="non-linear-not-tensorrt",
    ),
    pytest.param(
        paired("tensorrt_plan", "tensorrt")
        + 'input [ { name: "NL" data_type: TYPE_FP32 dims: [ 2, 2 ] is_non_linear_format_io: true } ]\n',
        "Non-linear IO format input requires 3 dims for m",
        id="non-linear-dims",
    ),
    # Platform and backend.
    pytest.param(
        paired("onnxruntim", "onnxruntime"),
        "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime",
        id="platform-misspelt",
    ),
    pytest.param(
        paired("tensorrt_plan", "onnxruntime"),
        "unexpected 'platform' and 'backend' pair, got:tensorrt_plan, onnxruntime",
        id="platform-of-another-backend",
    ),
    pytest.param(paired("foo", ""), "unexpected platform type 'foo' for m", id="platform-without-backend"),
    pytest.param(
        # The pair is checked before the tensors.
        paired("onnxruntim", "onnxruntime") + 'input [ { name: "" } ]\n',
        "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime",
        id="platform-before-tensors",
    ),
    # Runtime: edged has the libraries of no backend but its own.
    pytest.param(
        runtime("__invalid_runtime__"),
        "unable to find backend library '__invalid_runtime__' for model 'm'",
        id="runtime-unknown",
    ),
    pytest.param(
        runtime("../dummy_runtime/libtriton_identity.so", backend="identity"),
        "backend library name '../dummy_runtime/libtriton_identity.so' escapes backend directory, for model 'm', "
        "check model config runtime field",
        id="runtime-escapes",
    ),
    pytest.param(
        runtime("sub/../../libtriton_python.so"),
        "backend library name 'sub/../../libtriton_python.so' escapes backend directory, for model 'm', "
        "check model config runtime field",
        id="runtime-escapes-after-a-folder",
    ),
    pytest.param(
        runtime("sub/libtriton_python.so"),
        "unable to find backend library 'sub/libtriton_python.so' for model 'm'",
        id="runtime-in-a-folder",
    ),
    pytest.param(
        runtime("/opt/libtriton_python.so"),
        "unable to find backend library '/opt/libtriton_python.so' for model 'm'",
        id="runtime-absolute",
    ),
    pytest.param(
        runtime("libtriton_onnxruntime.so"),
        "unable to find backend library 'libtriton_onnxruntime.so' for model 'm'",
        id="runtime-of-another-backend",
    ),
    pytest.param(
        runtime("model.py"),
        "unable to find Python backend based backend library 'model.py' for model 'm'",
        id="runtime-python-based",
    ),
]

ACCEPTED = [
    pytest.param(MODEL, id="plain"),
    *(pytest.param(batch_input(kind), id=f"batch-input-{kind}") for kind in BATCH_INPUT_KINDS),
    pytest.param(batch_input("BATCH_ELEMENT_COUNT", data_type="TYPE_INT32"), id="batch-input-int32"),
    pytest.param(
        batch_input("BATCH_ELEMENT_COUNT").replace("max_batch_size: 8", "max_batch_size: 0"),
        id="batch-input-not-batching",
    ),
    pytest.param(batch_output(), id="batch-output"),
    pytest.param(
        controls(
            "START START int32_false_true: [ 0, 1 ]",
            "END END fp32_false_true: [ 0, 1 ]",
            "READY READY bool_false_true: [ false, true ]",
            "CORRID CORRID data_type: TYPE_STRING",
            strategy="oldest { preferred_batch_size: [ 8 ] }",
        ),
        id="controls",
    ),
    pytest.param(controls("CORRID CORRID data_type: TYPE_UINT32"), id="control-corrid-uint32"),
    pytest.param(MODEL + "sequence_batching { direct { minimum_slot_utilization: 1.0 } }\n", id="sequence-direct"),
    pytest.param(ENSEMBLE_OK, id="ensemble"),
    pytest.param(reshaped("input", "1", ""), id="reshape-empty-batching"),
    pytest.param(reshaped("input", "2, 4, -1, 6", "8, -1, 1, 6", max_batch_size=0), id="reshape-variable-runs"),
    pytest.param(reshaped("output", "6, -1", "2, 3, -1"), id="reshape-variable-runs-output"),
    pytest.param(reshaped("input", "2, 3", "3, 2"), id="reshape-same-count"),
    *(
        pytest.param(paired(platform, backend), id=f"pair-{platform or 'none'}-{backend or 'none'}")
        for platform, backend in (
            ("onnxruntime_onnx", "onnxruntime"),
            ("tensorrt_plan", "tensorrt"),
            ("pytorch_libtorch", "pytorch"),
            ("libtorch", "pytorch"),
            ("torch_aoti", "pytorch"),
            ("tensorflow_savedmodel", "tensorflow"),
            ("tensorflow_graphdef", "tensorflow"),
            ("", "tensorrt"),
            ("", "pytorch"),
            ("", "python"),
            ("", "openvino"),
            ("onnxruntim", "python"),  # a backend Triton does not know by type takes any platform
        )
    ),
    pytest.param(
        paired("tensorrt_plan", "tensorrt")
        + 'input [ { name: "NL" data_type: TYPE_FP32 dims: [ 2, 2, 3 ] is_non_linear_format_io: true } ]\n'
        + 'input [ { name: "S" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]\n',
        id="tensorrt-layouts",
    ),
    pytest.param(runtime("libtriton_python.so"), id="runtime-python-library"),
    pytest.param(runtime("libtriton_onnxruntime.so", backend="onnxruntime"), id="runtime-onnxruntime-library"),
    pytest.param(runtime(""), id="runtime-empty"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_refused_with_tritons_message(text: str, message: str) -> None:
    config = parse_model_config(text, "m/config.pbtxt")
    with pytest.raises(EdgedError) as caught:
        validate_model_config(config)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == message


@pytest.mark.parametrize("text", ACCEPTED)
def test_accepted(text: str) -> None:
    validate_model_config(parse_model_config(text, "m/config.pbtxt"))


SHIPPED = sorted([*ROOT.glob("model_repository/*/config.pbtxt"), *ROOT.glob("tests/testdata/**/config.pbtxt")])


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT)) for p in SHIPPED])
def test_shipped_configs_pass(path: Path) -> None:
    folder = path.parent
    config = parse_model_config(path.read_text(encoding="utf-8"), "config.pbtxt")
    config.name = config.name or folder.name
    versions = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    fill_backend_fields(config, ModelSource(folder.name, folder, folder.parent), versions)
    normalize_model_config(config, [])
    validate_model_config(config)


def test_shipped_configs_found() -> None:
    assert len(SHIPPED) >= 3


def test_platform_table_agrees_with_the_backend_fill() -> None:
    """A platform the repository scan fills a backend from is one the check takes for that backend, and back."""
    checked = {platform: backend for backend, platforms in PLATFORMS_BY_BACKEND.items() for platform in platforms}
    assert checked == BACKEND_BY_PLATFORM
