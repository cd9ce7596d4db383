"""The defaults Triton's core fills into a model config after auto-complete, so that `/config` shows what runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection

    from edged.proto.model_config_pb2 import ModelConfig

KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL = 0, 1, 2, 3
# Backends that Triton gives two CPU instances by default, to overlap one request's compute with the next.
_TWO_CPU_INSTANCES = frozenset({"onnxruntime", "tensorflow"})


def normalize_model_config(config: ModelConfig, gpus: Collection[int]) -> None:
    """``gpus``: the ids of the GPUs models may use (edged.core.devices)."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.platform != "ensemble":
        normalize_instance_groups(config, gpus)
    if config.WhichOneof("scheduling_choice") == "dynamic_batching":
        batching = config.dynamic_batching
        if not batching.preferred_batch_size and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)
    if config.platform != "ensemble":
        config.optimization.input_pinned_memory.enable = True
        config.optimization.output_pinned_memory.enable = True


def normalize_instance_groups(config: ModelConfig, gpus: Collection[int]) -> None:
    """Triton's: a name, a kind and a count for every group; KIND_GPU without ``gpus`` means every GPU."""
    if not config.instance_group:
        # The group Triton adds for a config without one is named after the model.
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == KIND_AUTO:
            # A listed GPU that is missing makes the group a CPU one (whose listed GPUs validation then refuses).
            usable = bool(gpus) and all(gpu in gpus for gpu in group.gpus)
            group.kind = KIND_GPU if usable else KIND_CPU
        if group.kind == KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(gpus))
        if group.count < 1:
            group.count = 2 if group.kind == KIND_CPU and config.backend in _TWO_CPU_INSTANCES else 1
