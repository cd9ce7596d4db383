"""Shared fixtures: a model repository with good and broken models, and the real daemon serving it.

One daemon serves the test repository for the whole session, so the suite stays fast; the tests that need other
flags start their own with ``run_server``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from server import REPO_ROOT, TRACEBACK_MARKER, Server, run_server

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

BUNDLED_REPOSITORY: Final = REPO_ROOT / "model_repository"

# Every Triton data type, as the wire names the protocol uses.
ALL_DTYPES: Final[tuple[str, ...]] = tuple(modelgen.IDENTITY_DTYPES)

# Line 3, column 17 is where the value "eight" starts; the daemon must point there.
BROKEN_SYNTAX_CONFIG: Final = """name: "broken_syntax"
platform: "onnxruntime_onnx"
max_batch_size: eight
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""
BROKEN_SYNTAX_POSITION: Final = "3:17"


def identity_model_name(dtype: str) -> str:
    return f"identity_{dtype.lower()}"


def _replace_in_config(model_dir: Path, old: str, new: str, count: int = -1) -> None:
    path = model_dir / "config.pbtxt"
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count), encoding="utf-8")


def _write_scaled_identity(path: Path, factor: float) -> None:
    """OUTPUT0 = INPUT0 * factor, FP32 with a batch dim and one variable dim, matching write_identity's I/O."""
    shape: list[int | str] = ["batch", "dim0"]
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "factor"], ["OUTPUT0"], name="scale")],
        "scaled_identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
        initializer=[helper.make_tensor("factor", TensorProto.FLOAT, [], [factor])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def build_test_repository(repo: Path) -> None:
    """Writes every model the HTTP tests use; the broken ones are broken in exactly one way each."""
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_add_sub(repo / "add_sub_nobatch", max_batch_size=0, dims=4, dtype="FP32")
    modelgen.write_add_sub(repo / "add_sub_int32", max_batch_size=8, dims=16, dtype="INT32")
    modelgen.write_digits(repo / "digits")
    for dtype in ALL_DTYPES:
        modelgen.write_identity(repo / identity_model_name(dtype), dtype, max_batch_size=8, dims=[-1])
    modelgen.write_identity(repo / "identity_nobatch", "FP32", max_batch_size=0, dims=[-1])

    # No config.pbtxt at all: everything must come from the ONNX graph (auto-complete).
    modelgen.write_add_sub(repo / "auto_complete", max_batch_size=8, dims=16, dtype="FP32")
    (repo / "auto_complete" / "config.pbtxt").unlink()

    # A config that protobuf's text format cannot parse.
    modelgen.write_add_sub(repo / "broken_syntax", max_batch_size=8, dims=16, dtype="FP32")
    (repo / "broken_syntax" / "config.pbtxt").write_text(BROKEN_SYNTAX_CONFIG, encoding="utf-8")

    # Parses, but a dimension of 0 is invalid.
    modelgen.write_identity(repo / "broken_dims", "FP32", max_batch_size=8, dims=[-1])
    _replace_in_config(repo / "broken_dims", "dims: [ -1 ]", "dims: [ 0 ]", 1)

    # Valid config, but it disagrees with the ONNX graph about the input type.
    modelgen.write_add_sub(repo / "broken_dtype", max_batch_size=8, dims=16, dtype="FP32")
    _replace_in_config(repo / "broken_dtype", "TYPE_FP32", "TYPE_INT32", 1)

    # A valid config beside a model file that is not ONNX at all.
    modelgen.write_add_sub(repo / "broken_onnx", max_batch_size=8, dims=16, dtype="FP32")
    (repo / "broken_onnx" / "1" / "model.onnx").write_bytes(b"this is not a protobuf")

    # A model folder without any version folder.
    modelgen.write_add_sub(repo / "no_version", max_batch_size=8, dims=16, dtype="FP32")
    for child in (repo / "no_version" / "1").iterdir():
        child.unlink()
    (repo / "no_version" / "1").rmdir()

    # Only "1" is a version: "abc" is not a number and "0" is not a valid version; both hold junk.
    modelgen.write_add_sub(repo / "odd_versions", max_batch_size=8, dims=16, dtype="FP32")
    for folder in ("abc", "0"):
        (repo / "odd_versions" / folder).mkdir()
        (repo / "odd_versions" / folder / "model.onnx").write_bytes(b"not an onnx model")

    # Two versions that compute different things; policy "all" serves both, the default only the latest.
    for name, policy in (("two_versions_all", "version_policy: { all: {} }\n"), ("two_versions_latest", "")):
        modelgen.write_identity(repo / name, "FP32", max_batch_size=8, dims=[-1])
        _write_scaled_identity(repo / name / "2" / "model.onnx", 2.0)
        if policy:
            config = repo / name / "config.pbtxt"
            config.write_text(config.read_text(encoding="utf-8") + policy, encoding="utf-8")


GOOD_MODELS: Final[tuple[str, ...]] = (
    "add_sub",
    "add_sub_nobatch",
    "add_sub_int32",
    "digits",
    *(identity_model_name(dtype) for dtype in ALL_DTYPES),
    "identity_nobatch",
    "auto_complete",
    "odd_versions",
    "two_versions_all",
    "two_versions_latest",
)
BROKEN_MODELS: Final[tuple[str, ...]] = (
    "broken_syntax",
    "broken_dims",
    "broken_dtype",
    "broken_onnx",
    "no_version",
)


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repository")
    build_test_repository(repo)
    return repo


@pytest.fixture(scope="session")
def small_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quick-loading repository for daemons started with other flags: one good, one auto-completed and one
    broken model."""
    repo = tmp_path_factory.mktemp("small-repository")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_add_sub(repo / "auto_complete", max_batch_size=8, dims=16, dtype="FP32")
    (repo / "auto_complete" / "config.pbtxt").unlink()
    modelgen.write_add_sub(repo / "broken_syntax", max_batch_size=8, dims=16, dtype="FP32")
    (repo / "broken_syntax" / "config.pbtxt").write_text(BROKEN_SYNTAX_CONFIG, encoding="utf-8")
    return repo


@pytest.fixture(scope="session")
def server(test_repository: Path) -> Iterator[Server]:
    with run_server([test_repository]) as running:
        yield running


@pytest.fixture(scope="session")
def client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(server.http_url, network_timeout=60.0)
    yield triton
    triton.close()


@pytest.fixture(autouse=True)
def _session_server_survives(request: pytest.FixtureRequest) -> Iterator[None]:
    """Pins a crash of the shared daemon on the test that caused it, not on the end of the session."""
    if "server" not in request.fixturenames:
        yield
        return
    running: Server = request.getfixturevalue("server")
    before = len(running.log())
    yield
    during = running.log()[before:]
    if running.process.poll() is not None:
        pytest.fail(f"edged exited with status {running.process.returncode} during this test:\n{during}")
    if TRACEBACK_MARKER in during:
        pytest.fail(f"edged logged a Python traceback during this test:\n{during}")


@pytest.fixture(scope="session")
def bundled_repository() -> Path:
    return BUNDLED_REPOSITORY


# Small enough that a modest request goes over it, large enough for every ordinary request to add_sub.
SMALL_MAX_INPUT_SIZE: Final = 4096


@pytest.fixture(scope="session")
def bundled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shipped repository plus a second one, every model loadable, with a small request size limit."""
    extra = tmp_path_factory.mktemp("second-repository")
    modelgen.write_identity(extra / "identity_fp32", "FP32", max_batch_size=8, dims=[-1])
    with run_server([BUNDLED_REPOSITORY, extra], "--http-max-input-size", str(SMALL_MAX_INPUT_SIZE)) as running:
        yield running


@pytest.fixture(scope="session")
def grpc_client(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(server.grpc_url)
    yield triton
    triton.close()


# ------------------------------------------------------------------------------------------------------------
# the Python backend

PYTHON_MODELS: Final = REPO_ROOT / "tests" / "testdata" / "python_models"
# Short, so that the hanging model is caught quickly; every other Python test model answers in milliseconds.
PYTHON_STUB_TIMEOUT_S: Final = 2
# A model folder whose name a shell would read as two commands: it must be refused, never started.
SHELL_NAME: Final = "evil;touch pwned"


def build_python_repository(repo: Path) -> None:
    """The Python-backend test models (tests/testdata/python_models), the ONNX add_sub they are compared with
    and call, and what they need around them (the stand-in NPU runtime, its compiled-model files)."""
    import shutil

    for model in PYTHON_MODELS.iterdir():
        if model.is_dir():
            shutil.copytree(model, repo / model.name)
    for name in ("resnet50", "resnet50_multi", "resnet50_batching"):
        shutil.copy(PYTHON_MODELS / "rebel.py", repo / name / "1" / "rebel.py")
        (repo / name / "1" / f"{name}.rbln").write_text('{"classes": 1000}', encoding="utf-8")
    inputs = ",\n".join(
        f'  {{ name: "INPUT_{dt}" data_type: {modelgen.DATA_TYPES[dt].config} dims: [ -1 ] optional: true }}'
        for dt in ALL_DTYPES
    )
    outputs = ",\n".join(
        f'  {{ name: "OUTPUT_{dt}" data_type: {modelgen.DATA_TYPES[dt].config} dims: [ -1 ] }}' for dt in ALL_DTYPES
    )
    header = 'name: "identity_python"\nbackend: "python"\nmax_batch_size: 8\n'
    (repo / "identity_python" / "config.pbtxt").write_text(
        f"{header}input [\n{inputs}\n]\noutput [\n{outputs}\n]\n", encoding="utf-8"
    )
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    shutil.copytree(PYTHON_MODELS / "init_fails", repo / SHELL_NAME)
    config = repo / SHELL_NAME / "config.pbtxt"
    config.write_text(config.read_text(encoding="utf-8").replace("init_fails", SHELL_NAME), encoding="utf-8")


@pytest.fixture(scope="session")
def python_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("python-repository")
    build_python_repository(repo)
    return repo


@pytest.fixture(scope="session")
def python_server(python_repository: Path) -> Iterator[Server]:
    with run_server(
        [python_repository], "--backend-config", f"python,stub-timeout-seconds={PYTHON_STUB_TIMEOUT_S}"
    ) as running:
        yield running


@pytest.fixture(scope="session")
def python_client(python_server: Server) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(python_server.http_url, network_timeout=60.0)
    yield triton
    triton.close()


@pytest.fixture(scope="session")
def python_grpc_client(python_server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(python_server.grpc_url)
    yield triton
    triton.close()
