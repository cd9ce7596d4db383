"""Builds the ONNX models and Triton ``config.pbtxt`` files that edged ships and tests with.

Every model is generated from code and from data that ships inside installed packages, so the
repository can be rebuilt offline and the output is byte-for-byte reproducible.

Usable as a module (``import modelgen``) or as a command::

    python scripts/modelgen.py bundled model_repository
    python scripts/modelgen.py resnet50 bench-models/resnet50
    python scripts/modelgen.py identity /tmp/models --dtype FP16 --max-batch-size 8 --dims 4
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

# ONNX opset 17 with IR version 8 is the pairing the ONNX release notes list for opset 17; newer IR
# versions are not needed for any operator used here and older runtimes on devices still load it.
OPSET: Final = 17
IR_VERSION: Final = 8
PRODUCER: Final = "edged-modelgen"
ONNX_PLATFORM: Final = "onnxruntime_onnx"
MODEL_FILENAME: Final = "model.onnx"
CONFIG_FILENAME: Final = "config.pbtxt"


@dataclass(frozen=True)
class DataType:
    """How one Triton data type is spelled in config.pbtxt, in ONNX and in numpy."""

    triton: str
    config: str
    onnx: int
    # BF16 has no numpy dtype, so its values travel as their uint16 bit patterns; BYTES travel as
    # object arrays because that is the only string layout onnxruntime reads correctly.
    numpy: np.dtype[np.generic]


def _dt(triton: str, config: str, onnx_type: int, numpy_type: npt.DTypeLike) -> DataType:
    return DataType(triton, config, onnx_type, np.dtype(numpy_type))


DATA_TYPES: Final[dict[str, DataType]] = {
    dt.triton: dt
    for dt in (
        _dt("BOOL", "TYPE_BOOL", TensorProto.BOOL, np.bool_),
        _dt("UINT8", "TYPE_UINT8", TensorProto.UINT8, np.uint8),
        _dt("UINT16", "TYPE_UINT16", TensorProto.UINT16, np.uint16),
        _dt("UINT32", "TYPE_UINT32", TensorProto.UINT32, np.uint32),
        _dt("UINT64", "TYPE_UINT64", TensorProto.UINT64, np.uint64),
        _dt("INT8", "TYPE_INT8", TensorProto.INT8, np.int8),
        _dt("INT16", "TYPE_INT16", TensorProto.INT16, np.int16),
        _dt("INT32", "TYPE_INT32", TensorProto.INT32, np.int32),
        _dt("INT64", "TYPE_INT64", TensorProto.INT64, np.int64),
        _dt("FP16", "TYPE_FP16", TensorProto.FLOAT16, np.float16),
        _dt("FP32", "TYPE_FP32", TensorProto.FLOAT, np.float32),
        _dt("FP64", "TYPE_FP64", TensorProto.DOUBLE, np.float64),
        _dt("BF16", "TYPE_BF16", TensorProto.BFLOAT16, np.uint16),
        _dt("BYTES", "TYPE_STRING", TensorProto.STRING, np.object_),
    )
}

# onnxruntime's CPU Identity kernel accepts every type above (BF16 included, verified by
# tests/unit/test_modelgen.py), so identity models exist for all of them.
IDENTITY_DTYPES: Final[tuple[str, ...]] = tuple(DATA_TYPES)

# Add and Sub are not defined for bool or string tensors.
ADD_SUB_DTYPES: Final[tuple[str, ...]] = tuple(t for t in DATA_TYPES if t not in ("BOOL", "BYTES", "BF16"))

DIGIT_LABELS: Final[tuple[str, ...]] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
)


def data_type(name: str) -> DataType:
    """Looks up a Triton data type by its short name ("FP32") or config name ("TYPE_FP32")."""
    key = name.removeprefix("TYPE_")
    if key == "STRING":
        key = "BYTES"
    try:
        return DATA_TYPES[key]
    except KeyError:
        raise ValueError(f"unknown Triton data type {name!r}; expected one of {', '.join(DATA_TYPES)}") from None


# --------------------------------------------------------------------------------------------
# config.pbtxt


@dataclass(frozen=True)
class TensorConfig:
    name: str
    dtype: str
    dims: tuple[int, ...]
    label_filename: str | None = None


@dataclass(frozen=True)
class ModelConfig:
    name: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    platform: str = ONNX_PLATFORM
    comment: tuple[str, ...] = ()


def _tensor_block(tensor: TensorConfig, last: bool) -> list[str]:
    dims = ", ".join(str(d) for d in tensor.dims)
    lines = [
        "  {",
        f'    name: "{tensor.name}"',
        f"    data_type: {data_type(tensor.dtype).config}",
        f"    dims: [ {dims} ]",
    ]
    if tensor.label_filename is not None:
        lines.append(f'    label_filename: "{tensor.label_filename}"')
    lines.append("  }" if last else "  },")
    return lines


def render_config(config: ModelConfig) -> str:
    """Renders a config in the layout Triton's own examples use, so it reads well when hand-edited."""
    lines = [f"# {line}".rstrip() for line in config.comment]
    if lines:
        lines.append("")
    lines += [
        f'name: "{config.name}"',
        f'platform: "{config.platform}"',
        f"max_batch_size: {config.max_batch_size}",
    ]
    for section, tensors in (("input", config.inputs), ("output", config.outputs)):
        lines.append(f"{section} [")
        for i, tensor in enumerate(tensors):
            lines += _tensor_block(tensor, last=i == len(tensors) - 1)
        lines.append("]")
    return "\n".join(lines) + "\n"


def _write_config(model_dir: Path, config: ModelConfig) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / CONFIG_FILENAME).write_text(render_config(config), encoding="utf-8")


# --------------------------------------------------------------------------------------------
# ONNX helpers


def _onnx_shape(max_batch_size: int, dims: list[int] | tuple[int, ...]) -> list[int | str]:
    """Translates Triton dims to an ONNX shape: the implicit batch and every -1 become named dims."""
    shape: list[int | str] = ["batch"] if max_batch_size > 0 else []
    for i, d in enumerate(dims):
        if d == -1:
            shape.append(f"dim{i}")
        elif d >= 0:
            shape.append(d)
        else:
            raise ValueError(f"invalid dimension {d} in {list(dims)}")
    return shape


def _value_info(name: str, dtype: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, data_type(dtype).onnx, shape)


def _make_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        ir_version=IR_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _write_onnx(model_dir: Path, model: onnx.ModelProto, version: int = 1) -> Path:
    path = model_dir / str(version) / MODEL_FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    # SerializeToString on a message without map fields is deterministic, which keeps rebuilt
    # models byte-identical to the committed ones.
    path.write_bytes(model.SerializeToString())
    return path


def _check_batching(max_batch_size: int) -> None:
    if max_batch_size < 0:
        raise ValueError(f"max_batch_size must be >= 0, got {max_batch_size}")


# --------------------------------------------------------------------------------------------
# add_sub


def write_add_sub(model_dir: Path, *, max_batch_size: int = 8, dims: int = 16, dtype: str = "FP32") -> None:
    """Writes Triton's classic example model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    _check_batching(max_batch_size)
    dt = data_type(dtype).triton
    if dt not in ADD_SUB_DTYPES:
        raise ValueError(f"add_sub does not support {dtype}; supported: {', '.join(ADD_SUB_DTYPES)}")
    shape = _onnx_shape(max_batch_size, [dims])
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "add_sub",
        [_value_info("INPUT0", dt, shape), _value_info("INPUT1", dt, shape)],
        [_value_info("OUTPUT0", dt, shape), _value_info("OUTPUT1", dt, shape)],
    )
    _write_onnx(model_dir, _make_model(graph))
    tensor_dims = (dims,)
    _write_config(
        model_dir,
        ModelConfig(
            name=model_dir.name,
            max_batch_size=max_batch_size,
            inputs=(TensorConfig("INPUT0", dt, tensor_dims), TensorConfig("INPUT1", dt, tensor_dims)),
            outputs=(TensorConfig("OUTPUT0", dt, tensor_dims), TensorConfig("OUTPUT1", dt, tensor_dims)),
            comment=(
                "Element-wise sum and difference of two tensors, the same contract as the add_sub",
                "example in Triton's documentation. Generated by scripts/modelgen.py.",
            ),
        ),
    )


# --------------------------------------------------------------------------------------------
# digits


@dataclass(frozen=True)
class DigitsClassifier:
    """A linear classifier over raw 8x8 pixel values (0..16): probabilities = softmax(x @ W + b)."""

    weights: npt.NDArray[np.float32]
    bias: npt.NDArray[np.float32]
    x_test: npt.NDArray[np.float32]
    y_test: npt.NDArray[np.int64]


DIGITS_MAX_BATCH_SIZE: Final = 32
DIGITS_RANDOM_STATE: Final = 0


def train_digits() -> DigitsClassifier:
    """Fits a multinomial logistic regression on scikit-learn's bundled copy of the UCI digits."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=DIGITS_RANDOM_STATE, stratify=y
    )
    # Pixels are scaled to 0..1 for a well-conditioned fit; the scale is folded back into the
    # weights below so the served model takes the dataset's raw 0..16 values.
    clf = LogisticRegression(C=1.0, max_iter=5000, random_state=DIGITS_RANDOM_STATE)
    clf.fit(x_train / 16.0, y_train)
    # Rounding absorbs last-bit differences between BLAS builds, so rebuilding on another machine
    # reproduces the committed model file exactly; 1e-6 is far below what affects any prediction.
    weights = np.round(np.asarray(clf.coef_, dtype=np.float64).T / 16.0, 6).astype(np.float32)
    bias = np.round(np.asarray(clf.intercept_, dtype=np.float64), 6).astype(np.float32)
    return DigitsClassifier(
        weights=np.ascontiguousarray(weights),
        bias=bias,
        x_test=np.asarray(x_test, dtype=np.float32),
        y_test=np.asarray(y_test, dtype=np.int64),
    )


def _digits_graph(clf: DigitsClassifier) -> onnx.GraphProto:
    return helper.make_graph(
        [
            helper.make_node("MatMul", ["image", "W"], ["logits_unbiased"], name="matmul"),
            helper.make_node("Add", ["logits_unbiased", "b"], ["logits"], name="bias"),
            helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
        ],
        "digits",
        [_value_info("image", "FP32", _onnx_shape(DIGITS_MAX_BATCH_SIZE, [64]))],
        [_value_info("probabilities", "FP32", _onnx_shape(DIGITS_MAX_BATCH_SIZE, [10]))],
        initializer=[numpy_helper.from_array(clf.weights, "W"), numpy_helper.from_array(clf.bias, "b")],
    )


def write_digits(model_dir: Path) -> float:
    """Writes the digits classifier and returns its accuracy on the held-out quarter of the data.

    The accuracy is measured by running the written model.onnx in onnxruntime, so it describes
    the shipped file rather than the scikit-learn estimator it came from.
    """
    clf = train_digits()
    path = _write_onnx(model_dir, _make_model(_digits_graph(clf)))
    (model_dir / "labels.txt").write_text("".join(f"{label}\n" for label in DIGIT_LABELS), encoding="utf-8")
    accuracy = _onnx_accuracy(path, clf.x_test, clf.y_test)
    _write_config(
        model_dir,
        ModelConfig(
            name=model_dir.name,
            max_batch_size=DIGITS_MAX_BATCH_SIZE,
            inputs=(TensorConfig("image", "FP32", (64,)),),
            outputs=(TensorConfig("probabilities", "FP32", (10,), label_filename="labels.txt"),),
            comment=(
                "Handwritten digit classifier.",
                "",
                "Input: one 8x8 grayscale image flattened row by row to 64 values in 0..16, the",
                "format of the UCI optical recognition of handwritten digits data set.",
                "Output: the probability of each digit 0..9; labels.txt names them, so the",
                "classification extension can report labels.",
                "",
                "Built by scripts/modelgen.py (run scripts/build-models): a multinomial logistic",
                "regression fitted with scikit-learn on sklearn.datasets.load_digits, trained on",
                f"75% of the 1797 images (random_state={DIGITS_RANDOM_STATE}) and exported as",
                "MatMul + Add + Softmax.",
                f"Accuracy on the 25% held out: {accuracy:.4f}.",
            ),
        ),
    )
    return accuracy


def _onnx_accuracy(path: Path, x: npt.NDArray[np.float32], y: npt.NDArray[np.int64]) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    correct = 0
    # Feeding max_batch_size rows at a time exercises the dynamic batch dim the server relies on.
    for start in range(0, len(x), DIGITS_MAX_BATCH_SIZE):
        (probs,) = session.run(["probabilities"], {"image": x[start : start + DIGITS_MAX_BATCH_SIZE]})
        correct += int(np.sum(np.argmax(probs, axis=1) == y[start : start + DIGITS_MAX_BATCH_SIZE]))
    return correct / len(x)


# --------------------------------------------------------------------------------------------
# identity


def write_identity(model_dir: Path, dtype: str, *, max_batch_size: int, dims: list[int]) -> None:
    """Writes OUTPUT0 = INPUT0 for any Triton data type; dims may contain -1 for variable sizes."""
    _check_batching(max_batch_size)
    dt = data_type(dtype).triton
    if dt not in IDENTITY_DTYPES:
        raise ValueError(f"identity does not support {dtype}")
    shape = _onnx_shape(max_batch_size, dims)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        "identity",
        [_value_info("INPUT0", dt, shape)],
        [_value_info("OUTPUT0", dt, shape)],
    )
    _write_onnx(model_dir, _make_model(graph))
    _write_config(
        model_dir,
        ModelConfig(
            name=model_dir.name,
            max_batch_size=max_batch_size,
            inputs=(TensorConfig("INPUT0", dt, tuple(dims)),),
            outputs=(TensorConfig("OUTPUT0", dt, tuple(dims)),),
            comment=(f"Returns INPUT0 unchanged as OUTPUT0 ({dt}). Generated by scripts/modelgen.py.",),
        ),
    )


# --------------------------------------------------------------------------------------------
# resnet50

RESNET50_STAGES: Final[tuple[tuple[int, int, int], ...]] = (
    # (bottleneck width, blocks, stride of the first block)
    (64, 3, 1),
    (128, 4, 2),
    (256, 6, 2),
    (512, 3, 2),
)
RESNET50_EXPANSION: Final = 4
RESNET50_CLASSES: Final = 1000
RESNET50_SEED: Final = 50


class _ResNetBuilder:
    """Accumulates nodes and initializers; BatchNormalization is folded into each conv's bias,
    which is what exporters and onnxruntime's optimizer do to trained ResNets anyway."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.parameters = 0
        self._count = 0

    def _name(self, kind: str) -> str:
        self._count += 1
        return f"{kind}_{self._count}"

    def _weight(self, name: str, array: npt.NDArray[np.float32]) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        self.parameters += array.size
        return name

    def conv(self, x: str, in_ch: int, out_ch: int, kernel: int, stride: int, *, relu: bool, gain: float = 1.0) -> str:
        name = self._name("conv")
        fan_in = in_ch * kernel * kernel
        # He initialisation keeps activations at a stable scale through 50 layers, so the random
        # network yields finite, non-degenerate outputs like a trained one would.
        std = gain * math.sqrt(2.0 / fan_in)
        w = self.rng.standard_normal((out_ch, in_ch, kernel, kernel), dtype=np.float32) * np.float32(std)
        b = self.rng.standard_normal(out_ch, dtype=np.float32) * np.float32(0.01)
        pad = kernel // 2
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, self._weight(f"{name}.weight", w), self._weight(f"{name}.bias", b)],
                [name],
                name=name,
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[pad, pad, pad, pad],
            )
        )
        return self.relu(name) if relu else name

    def relu(self, x: str) -> str:
        out = self._name("relu")
        self.nodes.append(helper.make_node("Relu", [x], [out], name=out))
        return out

    def bottleneck(self, x: str, in_ch: int, width: int, stride: int) -> str:
        out_ch = width * RESNET50_EXPANSION
        y = self.conv(x, in_ch, width, 1, 1, relu=True)
        # Stride sits on the 3x3 conv (the "v1.5" variant torchvision and most deployed models use).
        y = self.conv(y, width, width, 3, stride, relu=True)
        # A small gain on the residual branch's last conv stands in for trained BatchNorm scales,
        # which keep the sum from growing with every block.
        y = self.conv(y, width, out_ch, 1, 1, relu=False, gain=0.2)
        shortcut = x
        if stride != 1 or in_ch != out_ch:
            shortcut = self.conv(x, in_ch, out_ch, 1, stride, relu=False)
        total = self._name("add")
        self.nodes.append(helper.make_node("Add", [y, shortcut], [total], name=total))
        return self.relu(total)

    def build(self, max_batch_size: int) -> onnx.GraphProto:
        x = self.conv("input", 3, 64, 7, 2, relu=True)
        self.nodes.append(
            helper.make_node(
                "MaxPool",
                [x],
                ["pool"],
                name="maxpool",
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
            )
        )
        x, channels = "pool", 64
        for width, blocks, stride in RESNET50_STAGES:
            for i in range(blocks):
                x = self.bottleneck(x, channels, width, stride if i == 0 else 1)
                channels = width * RESNET50_EXPANSION
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
        self.nodes.append(helper.make_node("Flatten", ["gap"], ["features"], name="flatten", axis=1))
        fc_w = self.rng.standard_normal((RESNET50_CLASSES, channels), dtype=np.float32)
        fc_w *= np.float32(1.0 / math.sqrt(channels))
        fc_b = np.zeros(RESNET50_CLASSES, dtype=np.float32)
        self.nodes.append(
            helper.make_node(
                "Gemm",
                ["features", self._weight("fc.weight", fc_w), self._weight("fc.bias", fc_b)],
                ["logits"],
                name="fc",
                transB=1,
            )
        )
        self.nodes.append(helper.make_node("Softmax", ["logits"], ["output"], name="softmax", axis=-1))
        return helper.make_graph(
            self.nodes,
            "resnet50",
            [_value_info("input", "FP32", _onnx_shape(max_batch_size, [3, 224, 224]))],
            [_value_info("output", "FP32", _onnx_shape(max_batch_size, [RESNET50_CLASSES]))],
            initializer=self.initializers,
        )


def write_resnet50(model_dir: Path, *, max_batch_size: int = 16) -> None:
    """Writes a ResNet-50 (v1.5) with random weights from a fixed seed, about 100 MB.

    It only gives the benchmark a realistic amount of compute and memory traffic; its predictions
    are meaningless.
    """
    _check_batching(max_batch_size)
    builder = _ResNetBuilder(RESNET50_SEED)
    graph = builder.build(max_batch_size)
    _write_onnx(model_dir, _make_model(graph))
    _write_config(
        model_dir,
        ModelConfig(
            name=model_dir.name,
            max_batch_size=max_batch_size,
            inputs=(TensorConfig("input", "FP32", (3, 224, 224)),),
            outputs=(TensorConfig("output", "FP32", (RESNET50_CLASSES,)),),
            comment=(
                "ResNet-50 v1.5 architecture with BatchNorm folded into the convolutions and",
                f"random weights (seed {RESNET50_SEED}, {builder.parameters:,} parameters).",
                "For benchmarking only: its outputs mean nothing. Generated by scripts/modelgen.py.",
            ),
        ),
    )


def time_resnet50(model_dir: Path, *, runs: int = 5) -> float:
    """Returns the best batch-1 latency in seconds of a model written by write_resnet50."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_dir / "1" / MODEL_FILENAME), providers=["CPUExecutionProvider"])
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    (probs,) = session.run(["output"], {"input": image})
    if probs.shape != (1, RESNET50_CLASSES) or not np.all(np.isfinite(probs)):
        raise RuntimeError(f"resnet50 produced unusable output of shape {probs.shape}")
    best = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        session.run(["output"], {"input": image})
        best = min(best, time.perf_counter() - start)
    return best


# --------------------------------------------------------------------------------------------
# the repository shipped with edged

BUNDLED_MODELS: Final[tuple[str, ...]] = ("add_sub", "digits")


def write_bundled_repository(repo: Path) -> None:
    """Writes the models committed under model_repository/, replacing any previous copies.

    Only the bundled model folders are replaced, so other entries in the repository survive.
    """
    repo.mkdir(parents=True, exist_ok=True)
    for name in BUNDLED_MODELS:
        # Removing first guarantees no stale version folders or files linger from older layouts.
        shutil.rmtree(repo / name, ignore_errors=True)
    write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    accuracy = write_digits(repo / "digits")
    print(f"digits: held-out accuracy {accuracy:.4f}")


# --------------------------------------------------------------------------------------------
# command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    bundled = sub.add_parser("bundled", help="write the repository that ships with edged")
    bundled.add_argument("repo", type=Path)
    resnet = sub.add_parser("resnet50", help="write the random-weight ResNet-50 used by the benchmark")
    resnet.add_argument("model_dir", type=Path)
    resnet.add_argument("--max-batch-size", type=int, default=16)
    resnet.add_argument("--no-timing", action="store_true", help="skip the onnxruntime check and timing")
    identity = sub.add_parser("identity", help="write an identity model")
    identity.add_argument("model_dir", type=Path)
    identity.add_argument("--dtype", required=True, choices=IDENTITY_DTYPES)
    identity.add_argument("--max-batch-size", type=int, default=8)
    identity.add_argument("--dims", type=int, nargs="+", default=[-1])
    args = parser.parse_args(argv)

    if args.command == "bundled":
        write_bundled_repository(args.repo)
    elif args.command == "resnet50":
        write_resnet50(args.model_dir, max_batch_size=args.max_batch_size)
        size = (args.model_dir / "1" / MODEL_FILENAME).stat().st_size
        print(f"resnet50: {size / 1e6:.1f} MB")
        if not args.no_timing:
            print(f"resnet50: batch-1 latency {time_resnet50(args.model_dir) * 1e3:.1f} ms (onnxruntime CPU)")
    else:
        write_identity(args.model_dir, args.dtype, max_batch_size=args.max_batch_size, dims=args.dims)
    return 0


if __name__ == "__main__":
    sys.exit(main())
