"""plan_versions, in-process: what a (re)load does with each version, decided from the model as loaded and the
folder and config as they are now, without loading anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edged.core.repository.files import FolderPrint
from edged.core.repository.manager import ModelEntry, ModelState, ModelVersion
from edged.core.repository.plan import VersionPlan, plan_versions
from edged.core.repository.scan import ModelSource
from edged.proto.model_config_pb2 import ModelConfig

SOURCE = ModelSource("m", Path("/repo/m"), Path("/repo"))
MODEL_FILES = (("config.pbtxt", 100, 1), ("labels.txt", 10, 1))
VERSION_FILES = (("model.onnx", 1000, 1),)


def _config(count: int = 1, batch: int = 8) -> ModelConfig:
    config = ModelConfig(name="m", max_batch_size=batch)
    config.instance_group.add(count=count)
    return config


def _folder(model: Any = MODEL_FILES, versions: dict[int, Any] | None = None) -> FolderPrint:
    return FolderPrint(model, versions if versions is not None else {1: VERSION_FILES, 2: VERSION_FILES}, 1)


class _Scheduler:
    """A scheduler that takes new instances while it runs (the dynamic batcher's kind; only the attribute is looked
    at)."""

    def add_instances(self) -> None: ...


class _Resizable:
    """A backend model that can change its instance counts in place (only the attribute is looked at)."""

    instances: tuple[Any, ...] = ()

    def resize(self) -> None: ...

    def unload(self) -> None: ...


def _loaded(
    state: ModelState = ModelState.READY,
    config: ModelConfig | None = None,
    resizable: bool = True,
    scheduler: object | None = None,
) -> ModelEntry:
    entry = ModelEntry(SOURCE, ModelState.READY, config=config or _config(), folder=_folder())
    for number in (1, 2):
        version = ModelVersion("m", number, state, config=config or _config())
        version.backend_model = _Resizable() if resizable else None
        version.scheduler = scheduler if scheduler is not None else _Scheduler()  # type: ignore[assignment]
        entry.versions[number] = version
    return entry


def test_a_new_model_loads_every_version() -> None:
    assert plan_versions(None, SOURCE, _folder(), _config(), [1, 2]) == VersionPlan(frozenset(), frozenset(), (1, 2))


def test_nothing_changed_keeps_what_serves() -> None:
    assert plan_versions(_loaded(), SOURCE, _folder(), _config(), [1, 2]) == VersionPlan(
        frozenset({1, 2}), frozenset(), ()
    )


def test_only_instance_counts_changed_resizes_in_place() -> None:
    # The config file changed (its size and time), its content only in the counts.
    folder = _folder((("config.pbtxt", 101, 2), ("labels.txt", 10, 1)))
    plan = plan_versions(_loaded(), SOURCE, folder, _config(count=3), [1, 2])
    assert plan == VersionPlan(frozenset(), frozenset({1, 2}), ())
    # ... unless the backend cannot resize: then the versions load again.
    plan = plan_versions(_loaded(resizable=False), SOURCE, folder, _config(count=3), [1, 2])
    assert plan == VersionPlan(frozenset(), frozenset(), (1, 2))
    # ... or its scheduler cannot take new instances (a sequence batcher's slots belong to its instances).
    plan = plan_versions(_loaded(scheduler=object()), SOURCE, folder, _config(count=3), [1, 2])
    assert plan == VersionPlan(frozenset(), frozenset(), (1, 2))


def test_a_changed_version_folder_or_config_loads_that_version() -> None:
    folder = _folder(versions={1: VERSION_FILES, 2: (("model.onnx", 2000, 5),)})
    assert plan_versions(_loaded(), SOURCE, folder, _config(), [1, 2]) == VersionPlan(frozenset({1}), frozenset(), (2,))
    assert plan_versions(_loaded(), SOURCE, _folder(), _config(batch=4), [1, 2]).load == (1, 2)
    # Other files of the model folder (labels) changed: every version loads again.
    labels = _folder((("config.pbtxt", 100, 1), ("labels.txt", 11, 2)))
    assert plan_versions(_loaded(), SOURCE, labels, _config(count=3), [1, 2]).load == (1, 2)


def test_versions_not_serving_or_from_elsewhere_load() -> None:
    assert plan_versions(_loaded(ModelState.UNAVAILABLE), SOURCE, _folder(), _config(), [1, 2]).load == (1, 2)
    private = ModelSource("m", Path("/state/models/m/1"), Path("/state/models/m"))
    assert plan_versions(_loaded(), private, _folder(), _config(), [1, 2]).load == (1, 2)
    assert plan_versions(_loaded(), SOURCE, _folder(), _config(), [3]) == VersionPlan(frozenset(), frozenset(), (3,))


def test_versions_that_may_stay_where_they_run_are_planned_across_folders() -> None:
    # A config override's private copy links the repository's files: a count-only change resizes, an identical
    # config keeps, where the versions are allowed to go on running from the repository's folder.
    private = ModelSource("m", Path("/state/overrides/m/1"), Path("/state/overrides/m"))
    plan = plan_versions(_loaded(), private, _folder(), _config(count=2), [1, 2], movable=True)
    assert plan == VersionPlan(frozenset(), frozenset({1, 2}), ())
    plan = plan_versions(_loaded(), private, _folder(), _config(), [1, 2], movable=True)
    assert plan == VersionPlan(frozenset({1, 2}), frozenset(), ())
    # Files that differ still load, wherever they are.
    folder = _folder(versions={1: VERSION_FILES, 2: (("model.onnx", 2000, 5),)})
    assert plan_versions(_loaded(), private, folder, _config(), [1, 2], movable=True).load == (2,)


def test_a_changed_version_policy_keeps_the_versions_it_still_selects() -> None:
    # The config file changed (its size and time), its content only in which versions it selects.
    folder = _folder((("config.pbtxt", 140, 3), ("labels.txt", 10, 1)))
    config = _config()
    config.version_policy.specific.versions.extend([1, 2])
    assert plan_versions(_loaded(), SOURCE, folder, config, [1, 2]) == VersionPlan(frozenset({1, 2}), frozenset(), ())
    # ... and resizes them in place when their counts changed too.
    config = _config(count=3)
    config.version_policy.latest.num_versions = 2
    assert plan_versions(_loaded(), SOURCE, folder, config, [1, 2]) == VersionPlan(frozenset(), frozenset({1, 2}), ())
