"""What a (re)load does with each version of a model, decided without loading anything: keep the version serving
as it is, change its instance counts in place, or load a new one beside it. Model control (control.py) carries the
plan out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edged.core.repository.manager import ModelState
from edged.proto.model_config_pb2 import ModelConfig

if TYPE_CHECKING:
    from edged.core.repository.files import FolderPrint
    from edged.core.repository.manager import ModelEntry
    from edged.core.repository.scan import ModelSource


@dataclass(frozen=True, slots=True)
class VersionPlan:
    """What a load does with each version its config selects: ``keep`` the version serving as it is (same config,
    same files), ``resize`` it in place (only instance counts changed), or ``load`` a new one beside it."""

    keep: frozenset[int]
    resize: frozenset[int]
    load: tuple[int, ...]


def plan_versions(
    old: ModelEntry | None,
    source: ModelSource,
    folder: FolderPrint | None,
    config: ModelConfig,
    numbers: list[int],
    *,
    movable: bool = False,
) -> VersionPlan:
    """The plan for loading ``numbers`` of a model from ``source`` (``folder`` its fingerprint, ``config`` its new
    config) over ``old``, what the manager has of it now. ``movable``: versions of ``old`` may go on running from
    its folder when the model now loads from another one with the same files (a config override's private copy,
    whose files are links to the repository's). Pure: it reads, loads and changes nothing."""
    keep: set[int] = set()
    resize: set[int] = set()
    same_place = old is not None and (old.source.path == source.path or movable)
    same_files = same_place and old is not None and old.folder is not None and folder is not None
    if same_files:
        assert old is not None and old.folder is not None and folder is not None
        for number in numbers:
            current = old.versions.get(number)
            if current is None or current.state is not ModelState.READY:
                continue
            if old.folder.versions.get(number) != folder.versions.get(number):
                continue  # the version's own files changed
            model_files_same = _without_config(old.folder.model) == _without_config(folder.model)
            if model_files_same and _serving_part(current.config) == _serving_part(config):
                # The config may differ in which versions it selects: this one is selected still, and kept as it is.
                keep.add(number)
            elif (
                current.config is not None
                and hasattr(current.backend_model, "resize")
                # A scheduler whose slots belong to its instances (the sequence batcher's) cannot take new ones.
                and hasattr(current.scheduler, "add_instances")
                and _without_counts(current.config) == _without_counts(config)
                and model_files_same
            ):
                resize.add(number)
    load = tuple(number for number in numbers if number not in keep and number not in resize)
    return VersionPlan(frozenset(keep), frozenset(resize), load)


def _serving_part(config: ModelConfig | None) -> bytes | None:
    """The config less its version policy (which versions serve, not how one serves): equal for configs that serve
    a version alike."""
    if config is None:
        return None
    copy = ModelConfig()
    copy.CopyFrom(config)
    copy.ClearField("version_policy")
    data: bytes = copy.SerializeToString(deterministic=True)
    return data


def _without_counts(config: ModelConfig) -> bytes:
    """The config with every instance group's count and the version policy cleared: equal for configs that differ
    only in counts (and in which versions they select)."""
    copy = ModelConfig()
    copy.CopyFrom(config)
    copy.ClearField("version_policy")
    for group in copy.instance_group:
        group.count = 0
    data: bytes = copy.SerializeToString(deterministic=True)
    return data


def _without_config(files: Any) -> Any:
    return tuple(item for item in files if item[0] != "config.pbtxt")
