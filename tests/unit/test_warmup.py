"""Building model_warmup samples from a config: the tensors each kind of data gives, and Triton's refusals."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from edged.core.config.model_config import parse_model_config
from edged.core.config.validation import validate_model_config
from edged.core.repository.warmup import build_samples
from edged.core.request.validation import ModelSignature
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.proto.model_config_pb2 import ModelConfig

HEAD = (
    'name: "m" backend: "python" max_batch_size: {mbs}\n'
    'input [ {{ name: "IN" data_type: {dtype} dims: [ {dims} ] }} ]\n'
    'output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]\n'
)


def _config(warmup: str, *, mbs: int = 4, dtype: str = "TYPE_FP32", dims: str = "2") -> ModelConfig:
    text = HEAD.format(mbs=mbs, dtype=dtype, dims=dims) + f"model_warmup [ {warmup} ]\n"
    return parse_model_config(text, "config.pbtxt")


def _build(config: ModelConfig, model_dir: Path) -> list:  # type: ignore[type-arg]
    return build_samples(config, model_dir, ModelSignature.from_config(config))


def _write(model_dir: Path, name: str, data: bytes) -> None:
    (model_dir / "warmup").mkdir(exist_ok=True)
    (model_dir / "warmup" / name).write_bytes(data)


def _input(data: str, dtype: str = "TYPE_FP32", dims: str = "2", key: str = "IN") -> str:
    return f'inputs {{ key: "{key}" value: {{ data_type: {dtype} dims: [ {dims} ] {data} }} }}'


def _file(name: str) -> str:
    return _input(f'input_data_file: "{name}"')


def test_batch_size_rows_of_one_and_count_at_least_one(tmp_path: Path) -> None:
    (sample,) = _build(_config(f'{{ name: "s" batch_size: 3 {_input("zero_data: true")} }}'), tmp_path)
    assert sample.count == 1 and sample.batch_size == 3 and len(sample.requests) == 3
    tensor = sample.requests[0].inputs[0]
    assert tensor.shape == (1, 2) and tensor.data.tolist() == [[0.0, 0.0]]
    assert len(sample.fresh_requests()) == 3 and sample.fresh_requests()[0] is not sample.requests[0]


def test_a_sample_of_batch_size_zero_is_skipped(tmp_path: Path) -> None:
    assert _build(_config(f'{{ name: "s" count: 2 {_input("zero_data: true")} }}', mbs=0), tmp_path) == []


def test_file_data_is_read_raw_and_a_longer_file_is_cut(tmp_path: Path) -> None:
    _write(tmp_path, "in.bin", struct.pack("<3f", 1.5, 2.5, 9.0))
    config = _config(f'{{ name: "s" batch_size: 1 count: 2 {_file("in.bin")} }}', mbs=0)
    (sample,) = _build(config, tmp_path)
    assert sample.count == 2
    assert sample.requests[0].inputs[0].shape == (2,) and sample.requests[0].inputs[0].data.tolist() == [1.5, 2.5]


def test_strings_zero_random_and_from_a_file(tmp_path: Path) -> None:
    _write(tmp_path, "s.bin", struct.pack("<I", 2) + b"ab" + struct.pack("<I", 3) + b"xyz")
    warmup = ", ".join(
        f'{{ name: "{kind}" batch_size: 1 {_input(data, "TYPE_STRING")} }}'
        for kind, data in (
            ("zero", "zero_data: true"),
            ("random", "random_data: true"),
            ("file", 'input_data_file: "s.bin"'),
        )
    )
    samples = _build(_config(warmup, mbs=0, dtype="TYPE_STRING"), tmp_path)
    assert [s.requests[0].inputs[0].data.tolist() for s in samples] == [[b"", b""], [b"", b""], [b"ab", b"xyz"]]


def test_an_input_the_config_does_not_name_is_passed_through(tmp_path: Path) -> None:
    warmup = f'{{ name: "s" batch_size: 1 {_input("zero_data: true")} {_input("random_data: true", key="START")} }}'
    (sample,) = _build(_config(warmup), tmp_path)
    names = {t.name: t.shape for t in sample.requests[0].inputs}
    assert names == {"IN": (1, 2), "START": (1, 2)}


@pytest.mark.parametrize(
    ("data", "code", "message"),
    [
        (
            "",
            ErrorCode.INVALID_ARG,
            "[request id: <id_unknown>] warmup setting expects input 'IN' to have input_data_type set",
        ),
        (
            'input_data_file: "short.bin"',
            ErrorCode.INVALID_ARG,
            "[request id: <id_unknown>] warmup setting expects "
            "8 bytes, but the data provided from short.binonly has 4 bytes",
        ),
        (
            'input_data_file: "none.bin"',
            ErrorCode.INTERNAL,
            "failed to open text file for read {dir}/warmup/none.bin: No such file or directory",
        ),
        (
            'input_data_file: "../config.pbtxt"',
            ErrorCode.INVALID_ARG,
            "warmup setting input_data_file "
            "'../config.pbtxt' for input 'IN' must name a file in the model's 'warmup' folder",
        ),
    ],
)
def test_tritons_refusals(tmp_path: Path, data: str, code: ErrorCode, message: str) -> None:
    _write(tmp_path, "short.bin", b"\0" * 4)
    with pytest.raises(EdgedError) as caught:
        _build(_config(f'{{ name: "s" batch_size: 1 {_input(data)} }}'), tmp_path)
    assert (caught.value.code, caught.value.message) == (code, message.format(dir=tmp_path))


def test_variable_dims_and_a_wrong_type_are_refused(tmp_path: Path) -> None:
    with pytest.raises(
        EdgedError, match="warmup setting expects all variable-size dimensions are specified for input 'IN'"
    ):
        _build(_config(f'{{ name: "s" batch_size: 1 {_input("zero_data: true", dims="-1")} }}', dims="-1"), tmp_path)
    with pytest.raises(EdgedError, match="inference input 'IN' data-type is 'INT32', but model 'm' expects 'FP32'"):
        _build(_config(f'{{ name: "s" batch_size: 1 {_input("zero_data: true", "TYPE_INT32")} }}'), tmp_path)


def test_config_checks_refuse_warmup_for_an_ensemble_and_files_outside_the_folder() -> None:
    ensemble = parse_model_config(
        'name: "e" platform: "ensemble" max_batch_size: 4\n'
        'ensemble_scheduling { step [ { model_name: "m" model_version: -1 input_map { key: "IN" value: "IN" } '
        'output_map { key: "OUT" value: "OUT" } } ] }\n'
        f'model_warmup [ {{ name: "s" batch_size: 1 {_input("zero_data: true")} }} ]\n',
        "config.pbtxt",
    )
    with pytest.raises(EdgedError, match="model_warmup can not be specified for ensemble 'e'"):
        validate_model_config(ensemble)
    escaping = _config(f'{{ name: "s" batch_size: 1 {_file("/etc/passwd")} }}')
    with pytest.raises(EdgedError, match="must name a file in the model's 'warmup' folder for m"):
        validate_model_config(escaping)
    validate_model_config(_config(f'{{ name: "s" batch_size: 1 {_file("a/b.bin")} }}'))
