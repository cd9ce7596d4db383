"""Python-based backends, as Triton has them: --backend-directory holds NAME/model.py, and every model whose config
says ``backend: "NAME"`` runs that file through the Python backend, with its own folder, name and version."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from server import run_server

# A backend that scales its input by a factor each model sets in its own config, and says which model it serves.
SCALER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.factor = float(config["parameters"]["factor"]["string_value"])
        self.who = json.dumps({"name": args["model_name"], "version": args["model_version"],
                               "folder": args["model_repository"]})

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * self.factor)],
                parameters={"who": self.who},
            )
            for r in requests
        ]
"""


def _model(repo: Path, name: str, factor: float) -> None:
    (repo / name / "1").mkdir(parents=True)  # a version folder with no model file: the backend has it
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "scaler"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        f'parameters {{ key: "factor" value: {{ string_value: "{factor}" }} }}\n',
        encoding="utf-8",
    )


def test_models_share_a_python_based_backend(tmp_path: Path) -> None:
    backends = tmp_path / "backends"
    (backends / "scaler").mkdir(parents=True)
    (backends / "scaler" / "model.py").write_text(SCALER, encoding="utf-8")
    repo = tmp_path / "repo"
    _model(repo, "double", 2.0)
    _model(repo, "triple", 3.0)
    with run_server([repo], f"--backend-directory={backends}") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.0, 2.5], dtype=np.float32))
        for name, factor in (("double", 2.0), ("triple", 3.0)):
            result = client.infer(name, [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUT"), np.array([1.0, 2.5], dtype=np.float32) * factor)
            who = json.loads(result.get_response()["parameters"]["who"])
            assert who == {"name": name, "version": "1", "folder": str(repo / name)}


def test_without_the_directory_the_backend_is_not_found(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _model(repo, "double", 2.0)
    with run_server([repo], "--strict-readiness=false") as server:
        index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    (entry,) = [e for e in index if e["name"] == "double"]
    assert entry["state"] == "UNAVAILABLE"
    assert "unable to find backend 'scaler'" in entry["reason"]
