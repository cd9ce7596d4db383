"""An example edged backend: each output of a model is the input of the same position times a factor.

It shows the whole backend interface (edged.core.backend_api) in a few lines: a ``Backend`` that edged builds once
with its ``--backend-config`` settings, ``load`` for each model version, the model's instances, and ``execute``,
which answers one batch of requests. edged does everything else: the repository, versions, validation of every
request against the config, batching, sequences, statistics, metrics and the protocols.

A model for it (``model.json`` in the version folder holds the factor; a ``scale`` parameter in config.pbtxt
overrides it)::

    backend: "example_scale"
    default_model_filename: "model.json"
    max_batch_size: 8
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.core.request.inference import InferOutput, InferRequest, InferResponse
from edged.errors import EdgedError, ErrorCode, invalid_arg

if TYPE_CHECKING:
    from edged.core.backend_api import LoadContext, ServerApi
    from edged.core.stats import ExecutionTiming
    from edged.proto.model_config_pb2 import ModelConfig


class ScaleBackend:
    """Built once, on the first model that names it."""

    def __init__(self, settings: dict[str, str], host: ServerApi | None) -> None:
        # --backend-config=example_scale,default-scale=3 sets the factor of models that give none.
        self._default = float(settings.get("default-scale", "1"))

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        # A config must name its inputs and outputs: there is no model file to read them from.
        if not config.input or len(config.input) != len(config.output):
            raise invalid_arg(f"model '{config.name}': the example_scale backend needs one output per input")

    def load(self, config: ModelConfig, context: LoadContext) -> ScaleModel:
        scale = self._default
        if context.model_file.is_file():
            try:
                scale = float(json.loads(context.model_file.read_text(encoding="utf-8"))["scale"])
            except (ValueError, KeyError, TypeError) as exc:
                raise invalid_arg(
                    f"model '{config.name}': {context.model_file.name} has no number 'scale': {exc}"
                ) from None
        if "scale" in config.parameters:
            scale = float(config.parameters["scale"].string_value)
        count = sum(group.count for group in config.instance_group) or 1
        pairs = [(i.name, o.name) for i, o in zip(config.input, config.output, strict=True)]
        return ScaleModel([ScaleInstance(f"{config.name}_{n}", scale, pairs) for n in range(count)])


class ScaleModel:
    def __init__(self, instances: list[ScaleInstance]) -> None:
        self._instances = instances

    @property
    def instances(self) -> Sequence[ScaleInstance]:
        return self._instances

    def unload(self) -> None:
        self._instances = []


class ScaleInstance:
    def __init__(self, name: str, scale: float, pairs: list[tuple[str, str]]) -> None:
        self._name = name
        self._scale = scale
        self._pairs = pairs

    @property
    def name(self) -> str:
        return self._name

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        """One response per request, in order. The requests were validated against the config already, so each
        input is there, with the config's datatype and a shape it allows."""
        started = time.perf_counter_ns()
        responses: list[InferResponse | EdgedError] = []
        for request in requests:
            tensors = {tensor.name: tensor for tensor in request.inputs}
            outputs = []
            for input_name, output_name in self._pairs:
                tensor = tensors[input_name]
                data: Any = tensor.data
                if data.dtype == np.object_:
                    responses.append(EdgedError(ErrorCode.INVALID_ARG, "example_scale cannot scale BYTES"))
                    break
                scaled = (data * self._scale).astype(data.dtype)
                outputs.append(InferOutput(output_name, tensor.datatype, tuple(scaled.shape), scaled))
            else:
                responses.append(InferResponse(request.model_name, str(request.model_version), request.id, outputs))
        timing.infer_ns = time.perf_counter_ns() - started
        return responses
