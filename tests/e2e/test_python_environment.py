"""EXECUTION_ENV_PATH: a model's stubs run with the interpreter of its own Python environment, given as a
directory or as a packed .tar.gz (unpacked safely into the cache), with $$TRITON_MODEL_DIRECTORY expanded."""

from __future__ import annotations

import sys
import tarfile
import venv
from pathlib import Path
from typing import Final

import numpy as np
import pytest
import tritonclient.http as httpclient
from server import run_server

MODEL_PY: Final = """
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([1.0], dtype=np.float32))],
                parameters={"prefix": sys.prefix, "executable": sys.executable},
            )
            for _ in requests
        ]
"""


def _model(repo: Path, name: str, env_path: str) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL_PY, encoding="utf-8")
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'parameters: {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env_path}" }} }}\n',
        encoding="utf-8",
    )
    return folder


def _environment(path: Path) -> Path:
    """A venv with its own copy of the interpreter that sees this test run's packages (numpy) through a .pth."""
    venv.EnvBuilder(with_pip=False, symlinks=False).create(path)
    site = path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    ours = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "numpy").is_dir())
    (site / "edged-test.pth").write_text(ours + "\n", encoding="utf-8")
    return path


def _ask(client: httpclient.InferenceServerClient, model: str) -> dict[str, str]:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    parameters: dict[str, str] = client.infer(model, [tensor]).get_response()["parameters"]
    return parameters


def test_environment_directory_packed_archive_and_refusals(tmp_path: Path) -> None:
    environment = _environment(tmp_path / "env")
    repo = tmp_path / "repo"
    _model(repo, "env_dir", str(environment))
    packed = _model(repo, "env_packed", "$$TRITON_MODEL_DIRECTORY/python-env.tar.gz")
    with tarfile.open(packed / "python-env.tar.gz", "w:gz") as tar:
        tar.add(environment, arcname=".")
    _model(repo, "env_missing", "$$TRITON_MODEL_DIRECTORY/nowhere")
    evil = _model(repo, "env_evil", "$$TRITON_MODEL_DIRECTORY/evil.tar.gz")
    with tarfile.open(evil / "evil.tar.gz", "w:gz") as tar:
        tar.add(environment / "pyvenv.cfg", arcname="../escaped.cfg")
    cache = tmp_path / "cache"
    with run_server([repo], "--backend-config", f"python,env-cache-directory={cache}") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert _ask(client, "env_dir")["prefix"] == str(environment)
        packed_prefix = Path(_ask(client, "env_packed")["prefix"])
        assert packed_prefix.parent == cache
        assert Path(_ask(client, "env_packed")["executable"]).is_relative_to(packed_prefix)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["env_evil"]["state"] == "UNAVAILABLE"
        assert "'../escaped.cfg', which points outside the environment" in index["env_evil"]["reason"]
        assert index["env_missing"]["state"] == "UNAVAILABLE"
        assert index["env_missing"]["reason"] == (
            "Invalid argument: EXECUTION_ENV_PATH of model 'env_missing': 'nowhere' is neither a directory nor a "
            ".tar.gz archive"
        )
    assert not (tmp_path / "escaped.cfg").exists() and not (cache.parent / "escaped.cfg").exists()


@pytest.mark.parametrize("name", ["a/b", "..", "x..y", "semi;colon", "back`tick`", "dollar$(x)", "space name"])
def test_names_a_shell_would_read_are_refused(name: str) -> None:
    from edged.backends.python.backend import check_name
    from edged.errors import EdgedError

    with pytest.raises(EdgedError, match="refused by the python backend"):
        check_name("model name", name)
    check_name("model name", "resnet50-v1.5_int8")
