from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

# scripts/ is not a package, and the generators are build tooling rather than part of edged, so
# the tests reach them through the path instead of an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]


def _session(model_dir: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])


def _config(model_dir: Path) -> Any:
    # Parsing with Triton's own schema proves the files are valid Triton configs, not just text
    # that looks like one.
    text = (model_dir / "config.pbtxt").read_text(encoding="utf-8")
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _dim_values(model_dir: Path, tensor: str) -> list[int | str]:
    model = onnx.load(str(model_dir / "1" / "model.onnx"))
    for value in [*model.graph.input, *model.graph.output]:
        if value.name == tensor:
            return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
    raise AssertionError(f"{tensor} not in graph")


def _sample(dtype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    rng = np.random.default_rng(7)
    size = int(np.prod(shape))
    if dtype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype == "BYTES":
        # onnxruntime strings are UTF-8 std::strings: embedded NULs and non-ASCII text survive.
        words = ["", "edge", "a\x00b", "héllo", "数字", "x" * 300]
        return np.array([words[i % len(words)] for i in range(size)], dtype=np.object_).reshape(shape)
    if dtype == "BF16":
        # bfloat16 is the top half of a float32; the uint16 bit patterns are what travels.
        floats = rng.standard_normal(size).astype(np.float32)
        return (floats.view(np.uint32) >> 16).astype(np.uint16).reshape(shape)
    np_type = modelgen.DATA_TYPES[dtype].numpy
    if np.issubdtype(np_type, np.floating):
        return (rng.standard_normal(size) * 100).astype(np_type).reshape(shape)
    info = np.iinfo(np_type.name)
    return rng.integers(info.min, info.max, size=shape, dtype=np_type, endpoint=True)


@pytest.mark.parametrize("dtype", ["FP32", "INT32", "INT64", "FP16", "FP64", "UINT8", "INT8"])
def test_add_sub_computes_sum_and_difference(tmp_path: Path, dtype: str) -> None:
    model_dir = tmp_path / "add_sub"
    modelgen.write_add_sub(model_dir, max_batch_size=8, dims=16, dtype=dtype)

    config = _config(model_dir)
    assert config.name == "add_sub"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]
    assert all(list(t.dims) == [16] for t in [*config.input, *config.output])
    expected_type = model_config_pb2.DataType.Value(f"TYPE_{dtype}")
    assert all(t.data_type == expected_type for t in [*config.input, *config.output])
    assert _dim_values(model_dir, "INPUT0") == ["batch", 16]

    np_type = modelgen.DATA_TYPES[dtype].numpy
    rng = np.random.default_rng(1)
    # Small values keep every dtype clear of overflow, so numpy's result is the exact reference.
    a = rng.integers(0, 50, size=(3, 16)).astype(np_type)
    b = rng.integers(0, 50, size=(3, 16)).astype(np_type)
    out0, out1 = _session(model_dir).run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert out0.dtype == np_type
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)


def test_add_sub_without_batching_has_fixed_shape(tmp_path: Path) -> None:
    model_dir = tmp_path / "add_sub_nobatch"
    modelgen.write_add_sub(model_dir, max_batch_size=0, dims=4)

    assert _config(model_dir).max_batch_size == 0
    assert _dim_values(model_dir, "INPUT0") == [4]
    a = np.arange(4, dtype=np.float32)
    out0, out1 = _session(model_dir).run(None, {"INPUT0": a, "INPUT1": np.ones(4, np.float32)})
    np.testing.assert_array_equal(out0, a + 1)
    np.testing.assert_array_equal(out1, a - 1)


def test_add_sub_rejects_types_without_arithmetic(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="BYTES"):
        modelgen.write_add_sub(tmp_path / "m", dtype="BYTES")


def test_digits_classifies_the_dataset(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    model_dir = tmp_path / "digits"
    held_out = modelgen.write_digits(model_dir)
    assert held_out > 0.9

    labels = (model_dir / "labels.txt").read_text(encoding="utf-8").splitlines()
    assert labels == ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

    config = _config(model_dir)
    assert config.max_batch_size == 32
    assert config.input[0].name == "image"
    assert list(config.input[0].dims) == [64]
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    assert config.output[0].name == "probabilities"
    assert list(config.output[0].dims) == [10]
    assert config.output[0].label_filename == "labels.txt"
    assert (model_dir / "config.pbtxt").read_text(encoding="utf-8").startswith("#")
    assert _dim_values(model_dir, "image") == ["batch", 64]

    x, y = load_digits(return_X_y=True)
    session = _session(model_dir)
    predictions = []
    for start in range(0, len(x), 32):
        (probs,) = session.run(["probabilities"], {"image": x[start : start + 32].astype(np.float32)})
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
        predictions.append(np.argmax(probs, axis=1))
    accuracy = float(np.mean(np.concatenate(predictions) == y))
    assert accuracy > 0.9


def _run_bf16_identity(session: ort.InferenceSession, bits: npt.NDArray[np.uint16]) -> npt.NDArray[np.uint16]:
    # numpy has no bfloat16, so onnxruntime's plain run() cannot take or return it; OrtValues
    # tagged with the ONNX element type carry the raw bits both ways.
    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx.TensorProto.BFLOAT16)
    (out,) = session.run_with_ort_values(["OUTPUT0"], {"INPUT0": value})
    assert out.data_type() == "tensor(bfloat16)"
    raw = (ctypes.c_uint8 * out.tensor_size_in_bytes()).from_address(out.data_ptr())
    return np.frombuffer(bytes(raw), dtype=np.uint16).reshape(out.shape())


@pytest.mark.parametrize("dtype", list(modelgen.IDENTITY_DTYPES))
def test_identity_roundtrips_every_dtype(tmp_path: Path, dtype: str) -> None:
    model_dir = tmp_path / f"identity_{dtype.lower()}"
    modelgen.write_identity(model_dir, dtype, max_batch_size=8, dims=[-1, 3])

    config = _config(model_dir)
    assert config.max_batch_size == 8
    expected_type = model_config_pb2.DataType.Value(modelgen.DATA_TYPES[dtype].config)
    assert config.input[0].data_type == expected_type
    assert config.output[0].data_type == expected_type
    assert list(config.input[0].dims) == [-1, 3]
    assert _dim_values(model_dir, "INPUT0") == ["batch", "dim0", 3]

    session = _session(model_dir)
    data = _sample(dtype, (2, 5, 3))
    if dtype == "BF16":
        np.testing.assert_array_equal(_run_bf16_identity(session, data), data)
        return
    (out,) = session.run(["OUTPUT0"], {"INPUT0": data})
    assert out.shape == data.shape
    assert out.dtype == data.dtype
    np.testing.assert_array_equal(out, data)


def test_identity_covers_every_triton_type() -> None:
    triton_types = {
        name.removeprefix("TYPE_")
        for name in (value.name for value in model_config_pb2.DataType.DESCRIPTOR.values)
        if name not in ("TYPE_INVALID", "TYPE_STRING")
    } | {"BYTES"}
    assert set(modelgen.IDENTITY_DTYPES) == triton_types


def test_identity_without_batching(tmp_path: Path) -> None:
    model_dir = tmp_path / "identity_fp32"
    modelgen.write_identity(model_dir, "FP32", max_batch_size=0, dims=[2, 2])
    assert _dim_values(model_dir, "INPUT0") == [2, 2]
    data = np.arange(4, dtype=np.float32).reshape(2, 2)
    (out,) = _session(model_dir).run(None, {"INPUT0": data})
    np.testing.assert_array_equal(out, data)


def test_data_type_accepts_config_spellings() -> None:
    assert modelgen.data_type("TYPE_FP32").onnx == onnx.TensorProto.FLOAT
    assert modelgen.data_type("TYPE_STRING").triton == "BYTES"
    assert modelgen.data_type("FP16").config == "TYPE_FP16"
    with pytest.raises(ValueError, match="unknown Triton data type"):
        modelgen.data_type("FP8")


def test_bundled_repository_is_reproducible(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    modelgen.write_bundled_repository(first)
    modelgen.write_bundled_repository(second)
    (first / "add_sub" / "2").mkdir()
    modelgen.write_bundled_repository(first)  # stale versions must not survive a rebuild

    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert [str(p) for p in files] == [
        "add_sub/1/model.onnx",
        "add_sub/config.pbtxt",
        "digits/1/model.onnx",
        "digits/config.pbtxt",
        "digits/labels.txt",
    ]
    assert not (first / "add_sub" / "2").exists()
    for rel in files:
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), rel
        # The bundled models are committed, so they have to stay small.
        assert (first / rel).stat().st_size < 16 * 1024
