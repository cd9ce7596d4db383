"""Triton's TensorFlow backend (``tensorflow_savedmodel``) on the real daemon: SavedModels written by the tests with
TensorFlow, served and checked with tritonclient against TensorFlow's own output; the config filled from the
signature; another signature chosen by ``TF_SIGNATURE_DEF``; batching; and the models that cannot load, each
UNAVAILABLE with its reason."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, run_server


class Scorer(tf.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.weights = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])  # type: ignore[untyped-decorator]
    def score(self, features: Any) -> dict[str, Any]:
        logits = tf.matmul(features, self.weights)
        return {"logits": logits, "best": tf.argmax(logits, axis=1, output_type=tf.int32)}

    @tf.function(  # type: ignore[untyped-decorator]
        input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x"), tf.TensorSpec([None, 4], tf.float32, name="y")]
    )
    def add(self, x: Any, y: Any) -> dict[str, Any]:
        return {"total": x + y}


def _savedmodel(repository: Path, name: str, config: str, module: Scorer | None) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config, encoding="utf-8")
    if module is not None:
        signatures = {"serving_default": module.score, "add": module.add}
        tf.saved_model.save(module, str(version / "model.savedmodel"), signatures=signatures)


@pytest.fixture(scope="module")
def scorer() -> Scorer:
    return Scorer()


@pytest.fixture(scope="module")
def tf_server(tmp_path_factory: pytest.TempPathFactory, scorer: Scorer) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("tensorflow") / "repository"
    _savedmodel(repository, "scorer", 'platform: "tensorflow_savedmodel"\n', scorer)
    _savedmodel(
        repository,
        "adder",
        'platform: "tensorflow_savedmodel"\nmax_batch_size: 8\ndynamic_batching {}\n'
        'parameters [{ key: "TF_SIGNATURE_DEF", value: { string_value: "add" } }]\n',
        scorer,
    )
    _savedmodel(
        repository,
        "no_signature",
        'platform: "tensorflow_savedmodel"\n'
        'parameters [{ key: "TF_SIGNATURE_DEF", value: { string_value: "predict" } }]\n',
        scorer,
    )
    _savedmodel(repository, "not_saved", 'platform: "tensorflow_savedmodel"\n', None)
    (repository / "not_saved" / "1" / "model.savedmodel").mkdir()
    with run_server([repository]) as running:
        yield running


def test_the_default_signature_with_its_config_filled(tf_server: Server, scorer: Scorer) -> None:
    features = np.random.default_rng(2).random((3, 4), dtype=np.float32)
    client = httpclient.InferenceServerClient(tf_server.http_url)
    config = client.get_model_config("scorer")
    assert [t["name"] for t in config["input"]] == ["features"]
    assert sorted(t["name"] for t in config["output"]) == ["best", "logits"]
    tensor = httpclient.InferInput("features", [3, 4], "FP32")
    tensor.set_data_from_numpy(features)
    result = client.infer("scorer", [tensor])
    client.close()
    expected = scorer.score(tf.constant(features))
    np.testing.assert_allclose(result.as_numpy("logits"), expected["logits"].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("best"), expected["best"].numpy())


def test_another_signature_over_grpc(tf_server: Server) -> None:
    x = np.ones((2, 4), dtype=np.float32)
    client = grpcclient.InferenceServerClient(tf_server.grpc_url)
    inputs = [grpcclient.InferInput("x", [2, 4], "FP32"), grpcclient.InferInput("y", [2, 4], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(3 * x)
    np.testing.assert_array_equal(client.infer("adder", inputs).as_numpy("total"), 4 * x)
    client.close()


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("no_signature", "no signature 'predict' in model.savedmodel (serving_default, add)"),
        ("not_saved", "model.savedmodel is not a SavedModel"),
    ],
)
def test_a_model_that_cannot_load_says_why(tf_server: Server, model: str, reason: str) -> None:
    client = httpclient.InferenceServerClient(tf_server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    client.close()
    assert index[model]["state"] == "UNAVAILABLE"
    assert reason in index[model]["reason"], index[model]["reason"]
    assert index["scorer"]["state"] == "READY"


def test_without_tensorflow_the_model_says_what_to_install(tmp_path: Path, scorer: Scorer) -> None:
    shadow = tmp_path / "shadow" / "tensorflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('tensorflow is not installed here')\n", encoding="utf-8")
    repository = tmp_path / "repository"
    _savedmodel(repository, "scorer", 'platform: "tensorflow_savedmodel"\n', scorer)
    with run_server([repository], environment={"PYTHONPATH": str(shadow.parent)}) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        (entry,) = client.get_model_repository_index()
        client.close()
    assert entry["state"] == "UNAVAILABLE"
    assert (
        "the tensorflow backend needs TensorFlow, which is not installed: install edged[tensorflow]" in entry["reason"]
    )
