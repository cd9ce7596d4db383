"""The models measured: how each is generated (scripts/modelgen.py) and laid out in edged's and Triton's
repositories under bench-models/, and one request's inputs."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import modelgen
import numpy as np
import numpy.typing as npt

from .common import BENCH_DIR, EDGED_REPO, MODEL_STORE, TRITON_REPO, say

Array = npt.NDArray[Any]

# Triton's reference build has no ONNX Runtime backend, so it serves each model.onnx through this
# Python-backend model: one InferenceSession with the options edged gives a model without parameters
# (pool threads that do not spin), as the in-process loop uses too. Requests that Triton's dynamic batcher
# hands over together run as one batch, as edged's onnxruntime backend runs them.
TRITON_MODEL_PY: Final = '''\
"""Runs model.onnx with onnxruntime inside Triton's Python backend (written by scripts/bench)."""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]
        self.batching = config.get("max_batch_size", 0) > 0

    def execute(self, requests):
        feeds = [
            {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            for request in requests
        ]
        if len(requests) == 1 or not self.batching:
            return [self._response(self.session.run(self.outputs, request_feeds)) for request_feeds in feeds]
        # A batch from the dynamic batcher: one run over the requests' inputs concatenated along the batch
        # dimension (the batcher only groups requests of equal shapes), its outputs split back per request.
        batch = {name: np.concatenate([request_feeds[name] for request_feeds in feeds]) for name in self.inputs}
        results = self.session.run(self.outputs, batch)
        responses = []
        start = 0
        for request_feeds in feeds:
            end = start + len(request_feeds[self.inputs[0]])
            responses.append(self._response([array[start:end] for array in results]))
            start = end
        return responses

    def _response(self, results):
        tensors = [pb_utils.Tensor(name, array) for name, array in zip(self.outputs, results)]
        return pb_utils.InferenceResponse(output_tensors=tensors)
'''


@dataclass(frozen=True)
class BenchModel:
    name: str
    # Closed-loop duration of each in-process measurement and perf_analyzer's measurement window.
    in_process_s: float
    window_ms: int
    # The bytes of the largest output at batch 1: perf_analyzer's --output-shared-memory-size.
    output_bytes: int
    # One request's inputs, batch 1.
    make_inputs: Callable[[], dict[str, Array]]
    # Rows (batch size) of each request: perf_analyzer's -b, and the throughput counts rows.
    rows: int = 1


def add_sub_inputs() -> dict[str, Array]:
    rng = np.random.default_rng(0)
    return {name: rng.random((1, 16), dtype=np.float32) for name in ("INPUT0", "INPUT1")}


def resnet50_inputs() -> dict[str, Array]:
    return {"input": np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)}


def bench_models(quick: bool) -> list[BenchModel]:
    add_sub_bytes = 16 * 4  # OUTPUT0 and OUTPUT1: FP32 [16]
    resnet50_bytes = 1000 * 4  # output: FP32 [1000]
    if quick:
        return [BenchModel("add_sub", 2.0, 1000, add_sub_bytes, add_sub_inputs)]
    return [
        BenchModel("add_sub", 5.0, 1500, add_sub_bytes, add_sub_inputs),
        BenchModel("resnet50", 10.0, 3000, resnet50_bytes, resnet50_inputs),
    ]


def generate_models(models: Sequence[BenchModel]) -> None:
    """Generates the models once into bench-models/models/."""
    MODEL_STORE.mkdir(parents=True, exist_ok=True)
    for model in models:
        if model.name == "add_sub":  # cheap and deterministic: always rewritten
            modelgen.write_add_sub(MODEL_STORE / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
        elif not (MODEL_STORE / model.name / "1" / modelgen.MODEL_FILENAME).is_file():
            say(f"generating {model.name} (once; about 100 MB)")
            # Written beside the store and renamed in, so an interrupted run never leaves half a model.
            with tempfile.TemporaryDirectory(dir=BENCH_DIR) as tmp:
                staged = Path(tmp) / model.name
                modelgen.write_resnet50(staged, max_batch_size=16)
                shutil.rmtree(MODEL_STORE / model.name, ignore_errors=True)
                staged.rename(MODEL_STORE / model.name)


def prepare_models(models: Sequence[BenchModel]) -> None:
    """Generates the models once into bench-models/models/ and links this run's ones into edged's repository."""
    generate_models(models)
    # edged serves only this run's models, so a quick run does not wait for resnet50 to load.
    shutil.rmtree(EDGED_REPO, ignore_errors=True)
    EDGED_REPO.mkdir()
    for model in models:
        (EDGED_REPO / model.name).symlink_to(Path("..") / MODEL_STORE.name / model.name)


def prepare_triton_models(models: Sequence[BenchModel]) -> None:
    shutil.rmtree(TRITON_REPO, ignore_errors=True)
    for model in models:
        source = MODEL_STORE / model.name
        target = TRITON_REPO / model.name
        (target / "1").mkdir(parents=True)
        config = python_backend(source, (source / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8"))
        config += instance_group(1)
        (target / modelgen.CONFIG_FILENAME).write_text(config, encoding="utf-8")
        (target / "1" / "model.py").write_text(TRITON_MODEL_PY, encoding="utf-8")
        link_model_file(source, target)


def python_backend(source: Path, config: str) -> str:
    """An onnxruntime model's config.pbtxt turned into one for the Python-backend wrapper (TRITON_MODEL_PY)."""
    config, count = re.subn(r'(?m)^platform: "onnxruntime_onnx"$', 'backend: "python"', config)
    if count != 1:
        raise RuntimeError(f"unexpected config.pbtxt layout in {source}")
    return config


def instance_group(count: int) -> str:
    return f"instance_group [\n  {{\n    count: {count}\n    kind: KIND_CPU\n  }}\n]\n"


def link_model_file(source: Path, target: Path) -> None:
    """Links the generated model.onnx into version 1 of a model folder of a server's repository."""
    (target / "1" / modelgen.MODEL_FILENAME).symlink_to(
        os.path.relpath(source / "1" / modelgen.MODEL_FILENAME, target / "1")
    )
