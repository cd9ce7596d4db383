"""The fields of a model config that edged reads and does not act on: each one a config sets is logged as a warning
when the model loads and listed among the model's notes (the console's model page), so that no setting is dropped
without a word. A field edged acts on, or refuses, is not here; ``response_cache`` is, when the server has no
response cache to act on it with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from edged.proto.model_config_pb2 import ModelOptimizationPolicy

if TYPE_CHECKING:
    from edged.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

# The repository agent edged runs itself (edged.core.repository.checksum); any other is a library Triton loads.
CHECKSUM_AGENT = "checksum"


class Unacted(NamedTuple):
    field: str
    why: str

    def __str__(self) -> str:
        return f"{self.field}: {self.why}"


def unacted_fields(config: ModelConfig, *, cache: bool = True) -> list[Unacted]:
    """The fields ``config`` sets that edged does not act on, each with why, in the config's order; ``cache``:
    whether the server has a response cache (--cache-config)."""
    out: list[Unacted] = []
    if config.response_cache.enable and not cache:
        out.append(
            Unacted(
                "response_cache",
                "the server has no response cache (--cache-config local,size=BYTES): its requests are not cached",
            )
        )
    optimization = config.optimization
    if optimization.HasField("cuda") and optimization.cuda.ByteSize():
        out.append(
            Unacted(
                "optimization.cuda",
                "edged captures no CUDA graphs and sets none of Triton's CUDA stream options; the model runs "
                "without them",
            )
        )
    if optimization.priority != ModelOptimizationPolicy.PRIORITY_DEFAULT:
        out.append(Unacted("optimization.priority", "edged runs every model's instances at the same priority"))
    if optimization.gather_kernel_buffer_threshold:
        out.append(Unacted("optimization.gather_kernel_buffer_threshold", "edged gathers inputs without a CUDA kernel"))
    if optimization.eager_batching:
        out.append(Unacted("optimization.eager_batching", "edged's batchers do not start a batch early for it"))
    groups = config.instance_group
    for field, why in (
        ("host_policy", "edged has no host policies"),
        ("secondary_devices", "edged gives an instance only its one device"),
        ("passive", "edged schedules requests on passive instances as on any other"),
    ):
        named = [g.name or str(i) for i, g in enumerate(groups) if _sets(g, field)]
        if named:
            out.append(Unacted(f"instance_group.{field}", f"{why} (instance group {', '.join(named)})"))
    if config.cc_model_filenames:
        out.append(
            Unacted("cc_model_filenames", "edged loads default_model_filename, not a file chosen by compute capability")
        )
    if config.HasField("model_operations") and config.model_operations.op_library_filename:
        out.append(Unacted("model_operations", "edged loads no custom operation libraries"))
    others = [a.name for a in config.model_repository_agents.agents if a.name != CHECKSUM_AGENT]
    if others:
        out.append(
            Unacted(
                "model_repository_agents",
                f"edged runs only the checksum repository agent, not {', '.join(repr(n) for n in others)}",
            )
        )
    return out


def _sets(group: ModelInstanceGroup, field: str) -> bool:
    return bool(getattr(group, field))
