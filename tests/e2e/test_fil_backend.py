"""Triton's FIL backend (``backend: "fil"``) on the real daemon: tree models trained by the tests with XGBoost and
LightGBM (and a Treelite checkpoint of one), served through Treelite and checked with tritonclient against the
framework's own predictions; the FIL parameters (model_type, output_class, predict_proba, threshold); and the models
that cannot load, each UNAVAILABLE with its reason while the others serve."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import lightgbm
import numpy as np
import pytest
import treelite
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import xgboost
from server import REPO_ROOT, Server, run_server

FEATURES: Final = 6
ROWS: Final = np.random.default_rng(7).random((64, FEATURES), dtype=np.float32)
# XGBoost's legacy binary format (model_type "xgboost", xgboost.model), which XGBoost 3 neither writes nor reads: a
# 10-tree classifier on 4 features saved by XGBoost 1.7.6 twice, as xgboost.model and as the same booster in JSON,
# which XGBoost 3 predicts from.
LEGACY: Final = REPO_ROOT / "tests" / "testdata" / "xgboost_legacy"


def _config(model_type: str, output_dims: int, **parameters: str) -> str:
    entries = {"model_type": model_type, **parameters}
    listed = ",\n".join(f'  {{ key: "{key}", value: {{ string_value: "{value}" }} }}' for key, value in entries.items())
    return f"""
backend: "fil"
max_batch_size: 64
input [{{ name: "input__0", data_type: TYPE_FP32, dims: [ {FEATURES} ] }}]
output [{{ name: "output__0", data_type: TYPE_FP32, dims: [ {output_dims} ] }}]
instance_group [{{ kind: KIND_CPU }}]
dynamic_batching {{}}
parameters [
{listed}
]
"""


def _model(repository: Path, name: str, config: str, file_name: str, write: Any) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config, encoding="utf-8")
    write(version / file_name)


class Trained:
    def __init__(self) -> None:
        labels = (ROWS[:, 0] + ROWS[:, 1] > 1.0).astype(np.int32)
        self.binary = xgboost.train(
            {"objective": "binary:logistic", "max_depth": 3}, xgboost.DMatrix(ROWS, label=labels), 8
        )
        target = ROWS @ np.arange(1, FEATURES + 1, dtype=np.float32)
        self.regressor = xgboost.train(
            {"objective": "reg:squarederror", "max_depth": 3}, xgboost.DMatrix(ROWS, label=target), 8
        )
        classes = np.minimum((ROWS[:, 2] * 3).astype(np.int32), 2)
        self.multiclass = lightgbm.train(
            {"objective": "multiclass", "num_class": 3, "num_leaves": 4, "min_data_in_leaf": 2, "verbose": -1},
            lightgbm.Dataset(ROWS, label=classes),
            6,
        )


@pytest.fixture(scope="module")
def trained() -> Trained:
    return Trained()


@pytest.fixture(scope="module")
def fil_server(tmp_path_factory: pytest.TempPathFactory, trained: Trained) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("fil") / "repository"

    def checkpoint(path: Path) -> None:
        json_path = path.with_suffix(".json")
        trained.binary.save_model(json_path)
        treelite.frontend.load_xgboost_model(str(json_path), format_choice="json").serialize(str(path))
        json_path.unlink()

    _model(repository, "binary_class", _config("xgboost_json", 1, output_class="true"), "xgboost.json",
           trained.binary.save_model)  # fmt: skip
    _model(repository, "binary_proba", _config("xgboost_json", 1, output_class="true", predict_proba="true"),
           "xgboost.json", trained.binary.save_model)  # fmt: skip
    _model(repository, "binary_proba2", _config("xgboost_json", 2, output_class="true", predict_proba="true"),
           "xgboost.json", trained.binary.save_model)  # fmt: skip
    _model(repository, "binary_threshold", _config("xgboost_json", 1, output_class="true", threshold="0.2"),
           "xgboost.json", trained.binary.save_model)  # fmt: skip
    _model(repository, "regressor", _config("xgboost_ubj", 1, output_class="false", threads_per_tree="4"),
           "xgboost.ubj", trained.regressor.save_model)  # fmt: skip
    _model(repository, "lightgbm_proba", _config("lightgbm", 3, output_class="true", predict_proba="true"),
           "model.txt", lambda p: trained.multiclass.save_model(str(p)))  # fmt: skip
    _model(repository, "lightgbm_class", _config("lightgbm", 1, output_class="true"), "model.txt",
           lambda p: trained.multiclass.save_model(str(p)))  # fmt: skip
    _model(repository, "checkpoint", _config("treelite_checkpoint", 1, output_class="true", predict_proba="true"),
           "checkpoint.tl", checkpoint)  # fmt: skip
    legacy = _config("xgboost", 1, output_class="true", predict_proba="true").replace(
        f"dims: [ {FEATURES} ]", "dims: [ 4 ]"
    )
    _model(repository, "legacy_binary", legacy, "xgboost.model", lambda p: shutil.copy(LEGACY / "xgboost.model", p))
    # Models that cannot load.
    _model(repository, "not_a_model", _config("xgboost_json", 1), "xgboost.json",
           lambda p: p.write_text("not json", encoding="utf-8"))  # fmt: skip
    _model(repository, "unknown_parameter", _config("xgboost_json", 1, fast="yes"), "xgboost.json",
           trained.binary.save_model)  # fmt: skip
    _model(repository, "too_few_features", _config("xgboost_json", 1).replace(f"dims: [ {FEATURES} ]", "dims: [ 3 ]"),
           "xgboost.json", trained.binary.save_model)  # fmt: skip
    with run_server([repository]) as running:
        yield running


def _predict(server: Server, model: str, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("input__0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    result: np.ndarray[Any, Any] | None = client.infer(model, [tensor]).as_numpy("output__0")
    client.close()
    assert result is not None
    return result


def test_xgboost_classifier_probabilities_classes_and_threshold(fil_server: Server, trained: Trained) -> None:
    expected = trained.binary.predict(xgboost.DMatrix(ROWS)).reshape(-1, 1)
    np.testing.assert_allclose(_predict(fil_server, "binary_proba", ROWS), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        _predict(fil_server, "binary_proba2", ROWS), np.hstack([1 - expected, expected]), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(_predict(fil_server, "binary_class", ROWS), (expected >= 0.5).astype(np.float32))
    classes = _predict(fil_server, "binary_threshold", ROWS)
    np.testing.assert_array_equal(classes, (expected >= 0.2).astype(np.float32))
    assert classes.sum() > (expected >= 0.5).sum()  # the threshold did change some decisions


def test_xgboost_regressor_from_ubjson(fil_server: Server, trained: Trained) -> None:
    expected = trained.regressor.predict(xgboost.DMatrix(ROWS)).reshape(-1, 1)
    np.testing.assert_allclose(_predict(fil_server, "regressor", ROWS), expected, rtol=1e-5, atol=1e-4)


def test_lightgbm_multiclass_and_a_treelite_checkpoint(fil_server: Server, trained: Trained) -> None:
    expected = trained.multiclass.predict(ROWS)
    np.testing.assert_allclose(_predict(fil_server, "lightgbm_proba", ROWS), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(
        _predict(fil_server, "lightgbm_class", ROWS).ravel(), np.argmax(expected, axis=1).astype(np.float32)
    )
    binary = trained.binary.predict(xgboost.DMatrix(ROWS)).reshape(-1, 1)
    np.testing.assert_allclose(_predict(fil_server, "checkpoint", ROWS), binary, rtol=1e-5, atol=1e-6)


def test_one_row_over_grpc_and_the_statistics(fil_server: Server, trained: Trained) -> None:
    client = grpcclient.InferenceServerClient(fil_server.grpc_url)
    tensor = grpcclient.InferInput("input__0", [1, FEATURES], "FP32")
    tensor.set_data_from_numpy(ROWS[:1])
    result = client.infer("regressor", [tensor]).as_numpy("output__0")
    np.testing.assert_allclose(result, trained.regressor.predict(xgboost.DMatrix(ROWS[:1])).reshape(1, 1), rtol=1e-5)
    stats = client.get_inference_statistics("regressor", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 1 and int(stats["execution_count"]) >= 1
    client.close()


def test_a_row_of_the_wrong_width_is_refused(fil_server: Server) -> None:
    client = httpclient.InferenceServerClient(fil_server.http_url)
    tensor = httpclient.InferInput("input__0", [1, FEATURES + 1], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, FEATURES + 1), dtype=np.float32))
    with pytest.raises(Exception, match="unexpected shape"):
        client.infer("regressor", [tensor])
    client.close()


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("not_a_model", "xgboost.json is not a xgboost_json model: Provided JSON could not be parsed"),
        ("unknown_parameter", "unknown fil parameter(s) fast"),
        ("too_few_features", "has 3 features, the model 6"),
    ],
)
def test_a_model_that_cannot_load_says_why_and_the_rest_serve(fil_server: Server, model: str, reason: str) -> None:
    client = httpclient.InferenceServerClient(fil_server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    client.close()
    assert index[model]["state"] == "UNAVAILABLE"
    assert reason in index[model]["reason"], index[model]["reason"]
    assert index["regressor"]["state"] == "READY"


def test_without_treelite_the_model_says_what_to_install(tmp_path: Path, trained: Trained) -> None:
    # An import path where `import treelite` fails, as on a device installed without the fil extra.
    shadow = tmp_path / "shadow" / "treelite"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('treelite is not installed here')\n", encoding="utf-8")
    repository = tmp_path / "repository"
    _model(repository, "trees", _config("xgboost_json", 1), "xgboost.json", trained.binary.save_model)
    with run_server([repository], environment={"PYTHONPATH": str(shadow.parent)}) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        (entry,) = client.get_model_repository_index()
        client.close()
    assert entry["state"] == "UNAVAILABLE"
    assert "the fil backend needs Treelite, which is not installed: install edged[fil]" in entry["reason"]


def test_xgboost_legacy_binary_model(fil_server: Server) -> None:
    rows = ROWS[:, :4].copy()
    expected = xgboost.Booster(model_file=str(LEGACY / "xgboost.json")).predict(xgboost.DMatrix(rows)).reshape(-1, 1)
    np.testing.assert_allclose(_predict(fil_server, "legacy_binary", rows), expected, rtol=1e-5, atol=1e-6)
