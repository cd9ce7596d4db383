"""Triton's FIL backend (``backend: "fil"``) for tree models on the CPU: XGBoost (binary, JSON, UBJSON), LightGBM
text and Treelite checkpoints, loaded and run by Treelite (its frontends and its CPU predictor, GTIL).

As Triton's FIL backend: one input (``input__0``, FP32, the features of a row) and one output (``output__0``, FP32);
``model_type`` picks the format and its default file name (``xgboost.model``, ``xgboost.json``, ``xgboost.ubj``,
``model.txt``, ``checkpoint.tl``); ``output_class`` says the model is a classifier; ``predict_proba`` returns a
score per class (for a binary classifier, the positive class's, or both when the output has 2 columns), and without
it a classifier returns class ids (a binary one compares its score with ``threshold``, 0.5 unless set). A regressor
returns its prediction. The GPU tuning parameters of Triton's backend (``threads_per_tree``, ``storage_type``,
``algo``, ``blocks_per_sm``, ``transfer_threshold``, ``use_experimental_optimizations``) are accepted and have no
effect on the CPU; KIND_GPU instances are refused (GPU execution needs RAPIDS, which this backend does not use).

Treelite comes with the ``fil`` extra (``pip install edged[fil]``) and is imported with the first FIL model. It runs
in the daemon: a prediction is a call into Treelite's C++ library on the worker pool, which releases the GIL.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from edged.backends.batches import InstancesModel
from edged.core.devices import instance_placements
from edged.core.request.inference import InferOutput, InferResponse
from edged.errors import EdgedError, ErrorCode, invalid_arg

if TYPE_CHECKING:
    from edged.core.backend_api import LoadContext, ServerApi
    from edged.core.request.inference import InferRequest
    from edged.core.stats import ExecutionTiming
    from edged.proto.model_config_pb2 import ModelConfig

DEFAULT_FILES: Final = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
# Parameters of Triton's FIL backend that tune its GPU kernels: accepted, without effect here.
_GPU_TUNING: Final = frozenset(
    {
        "threads_per_tree",
        "storage_type",
        "algo",
        "blocks_per_sm",
        "transfer_threshold",
        "use_experimental_optimizations",
    }
)
_TREELITE_PREFIX: Final = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
_KNOWN: Final = _GPU_TUNING | {
    "model_type",
    "output_class",
    "predict_proba",
    "threshold",
    "xgboost_allow_unknown_field",
}


def _treelite() -> Any:
    try:
        import treelite
        import treelite.gtil
    except ImportError:
        raise EdgedError(
            ErrorCode.UNAVAILABLE, "the fil backend needs Treelite, which is not installed: install edged[fil]"
        ) from None
    return treelite


class FilBackend:
    def __init__(self, settings: dict[str, str], host: ServerApi | None = None) -> None:
        self._treelite = _treelite()

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        # Like Triton's FIL backend: the config names the tensors; there is nothing in a tree model to read them from.
        if len(config.input) != 1 or len(config.output) != 1:
            raise invalid_arg(f"model '{config.name}': a fil model has one input (input__0) and one output (output__0)")

    def load(self, config: ModelConfig, context: LoadContext) -> InstancesModel[FilInstance]:
        options = _Options(config)
        path = context.version_dir / (config.default_model_filename or DEFAULT_FILES[options.model_type])
        forest = _load_forest(self._treelite, options, path, config.name)
        features = int(forest.num_feature)
        dims = list(config.input[0].dims)
        if dims and dims[-1] not in (-1, features):
            raise invalid_arg(
                f"model '{config.name}': input '{config.input[0].name}' has {dims[-1]} features, the model {features}"
            )
        placements = instance_placements(config, context.devices)
        if any(placement.kind == "GPU" for placement in placements):
            raise EdgedError(
                ErrorCode.UNSUPPORTED,
                f"model '{config.name}': the fil backend runs on the CPU only (KIND_GPU needs RAPIDS): use KIND_CPU",
            )
        output = config.output[0]
        instances = [
            FilInstance(placement.name, self._treelite, forest, options, output.name, list(output.dims))
            for placement in placements
        ]
        return InstancesModel(instances)


class _Options:
    """The config's FIL parameters, checked."""

    def __init__(self, config: ModelConfig) -> None:
        values = {key: parameter.string_value.strip() for key, parameter in config.parameters.items()}
        unknown = sorted(set(values) - _KNOWN)
        if unknown:
            raise invalid_arg(f"model '{config.name}': unknown fil parameter(s) {', '.join(unknown)}")
        self.model_type = values.get("model_type", "xgboost")
        if self.model_type not in DEFAULT_FILES:
            raise invalid_arg(
                f"model '{config.name}': model_type '{self.model_type}' is not one of {', '.join(DEFAULT_FILES)}"
            )
        self.output_class = _flag(config.name, values, "output_class")
        self.predict_proba = _flag(config.name, values, "predict_proba")
        self.allow_unknown_field = _flag(config.name, values, "xgboost_allow_unknown_field")
        try:
            self.threshold = float(values.get("threshold", "0.5"))
        except ValueError:
            raise invalid_arg(f"model '{config.name}': threshold must be a number") from None


def _flag(model: str, values: dict[str, str], key: str) -> bool:
    value = values.get(key, "false").lower()
    if value not in ("true", "false"):
        raise invalid_arg(f"model '{model}': {key} must be 'true' or 'false', not '{value}'")
    return value == "true"


def _load_forest(treelite: Any, options: _Options, path: Path, model: str) -> Any:
    if not path.is_file():
        raise invalid_arg(f"model '{model}': no model file {path.name} in its version folder")
    frontend = treelite.frontend
    try:
        if options.model_type == "xgboost":
            return frontend.load_xgboost_model_legacy_binary(str(path))
        if options.model_type in ("xgboost_json", "xgboost_ubj"):
            choice = "json" if options.model_type == "xgboost_json" else "ubjson"
            return frontend.load_xgboost_model(
                str(path), format_choice=choice, allow_unknown_field=options.allow_unknown_field
            )
        if options.model_type == "lightgbm":
            return frontend.load_lightgbm_model(str(path))
        return treelite.Model.deserialize(str(path))
    except treelite.TreeliteError as exc:
        # Treelite's first line is "[time] source-file:line: complaint": the complaint is the useful part.
        lines = str(exc).strip().splitlines()
        reason = _TREELITE_PREFIX.sub("", lines[0]) if lines else type(exc).__name__
        raise invalid_arg(f"model '{model}': {path.name} is not a {options.model_type} model: {reason}") from None


class FilInstance:
    def __init__(
        self, name: str, treelite: Any, forest: Any, options: _Options, output: str, output_dims: list[int]
    ) -> None:
        self._name = name
        self._predict = treelite.gtil.predict
        self._forest = forest
        self._options = options
        self._output = output
        self._width = output_dims[-1] if output_dims and output_dims[-1] > 0 else 1

    @property
    def name(self) -> str:
        return self._name

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        started = time.perf_counter_ns()
        rows = [_rows(request.inputs[0].data) for request in requests]
        features = np.ascontiguousarray(np.concatenate(rows) if len(rows) > 1 else rows[0], dtype=np.float32)
        fed = time.perf_counter_ns()
        try:
            scores = np.asarray(self._predict(self._forest, features), dtype=np.float32)
        except Exception as exc:  # Treelite's own errors (a row of the wrong width would be caught by validation)
            error = EdgedError(ErrorCode.INTERNAL, f"fil prediction failed: {exc}")
            return [error] * len(requests)
        ran = time.perf_counter_ns()
        result = self._shape(scores.reshape(len(features), -1))
        responses: list[InferResponse | EdgedError] = []
        start = 0
        for request, part in zip(requests, rows, strict=True):
            end = start + len(part)
            block = result[start:end]
            responses.append(
                InferResponse(
                    request.model_name,
                    str(request.model_version),
                    request.id,
                    [InferOutput(self._output, "FP32", tuple(block.shape), block)],
                )
            )
            start = end
        timing.input_ns, timing.infer_ns, timing.output_ns = fed - started, ran - fed, time.perf_counter_ns() - ran
        return responses

    def _shape(self, scores: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Treelite's scores (one column, or one per class) as Triton's FIL backend answers."""
        options = self._options
        binary = scores.shape[1] == 1
        if not options.output_class:
            return scores
        if options.predict_proba:
            if binary and self._width == 2:
                return np.concatenate([1.0 - scores, scores], axis=1)
            return scores
        if binary:
            return (scores >= options.threshold).astype(np.float32)
        classes: np.ndarray[Any, Any] = np.argmax(scores, axis=1).astype(np.float32)
        return classes.reshape(-1, 1)


def _rows(data: Any) -> np.ndarray[Any, Any]:
    # A model without batching (max_batch_size 0) gets one row of features.
    array: np.ndarray[Any, Any] = data
    if array.ndim == 1:
        return array.reshape(1, -1)
    return array
