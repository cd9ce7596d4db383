"""Deleting a model, or one version of it, from the model repository, as an operator does from the console or the
API (``DELETE /v2/edged/models/{model}[/versions/{version}]``).

Only what does not serve is deleted: a version that serves (or is on its way in or out) is refused, and so is a model
with any such version: activate another version, or unload the model, first. A model of a synced (s3://, gs://, as://)
repository is refused too: its files are the bucket's, and the next sync would bring them back.

A folder goes in two steps: renamed to a hidden name beside it (one rename, so that a scan or a poll never sees half
of it), then removed. A crash between the two leaves a hidden folder, which no scan reads as a model or version and
the next deletion of that model clears. The history records each deletion, with who asked."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from edged.core.confined import remove_tree
from edged.core.names import model_name_problem, printable
from edged.core.repository.files import sync_directory
from edged.core.repository.manager import ModelState
from edged.core.repository.modes import Origin
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from pathlib import Path

    from edged.core.repository.control import ModelController
    from edged.core.repository.manager import ModelRepositoryManager

log = logging.getLogger(__name__)

# Versions in these states are serving, or about to, or still finishing requests: never deleted.
_IN_USE = (ModelState.READY, ModelState.LOADING, ModelState.UNLOADING)
# The hidden name a folder takes on its way out.
_GOING = ".deleting"


class ModelDeletion:
    def __init__(
        self,
        controller: ModelController,
        manager: ModelRepositoryManager,
        synced: frozenset[Path],
        locks: dict[str, asyncio.Lock],
    ) -> None:
        """``locks``: the per-model locks uploads hold, so that a deletion never meets an upload of the same model."""
        self._controller = controller
        self._manager = manager
        self._synced = synced
        self._locks = locks

    async def delete_version(self, name: str, version: int, origin: Origin = Origin.API) -> None:
        async with self._locks.setdefault(name, asyncio.Lock()):
            folder = await asyncio.to_thread(self._folder, name)
            path = folder / str(version)
            if not path.is_dir() or path.is_symlink():
                raise EdgedError(ErrorCode.NOT_FOUND, f"model '{name}' has no version {version} on disk")
            serving = self._in_use(name)
            if version in serving:
                raise _conflict(
                    f"version {version} of model '{name}' serves: activate another version or unload the model "
                    "before deleting it"
                )
            await asyncio.to_thread(_remove, folder, path)
            entry = self._manager.entry(name)
            if entry is not None:
                # A version loaded before (retired, unloaded) is listed no more, in the index or on the model page:
                # deleted on purpose, it is not "no longer on disk", and after a restart nothing would list it.
                entry.versions.pop(version, None)
            log.info("model '%s': version %d deleted", name, version)
            await self._controller.note(name, version, "DELETED", "version folder deleted", origin)

    async def delete_model(self, name: str, origin: Origin = Origin.API) -> None:
        async with self._locks.setdefault(name, asyncio.Lock()):
            folder = await asyncio.to_thread(self._folder, name)
            serving = self._in_use(name)
            if serving:
                listed = ", ".join(str(number) for number in serving)
                raise _conflict(
                    f"model '{name}' serves version{'s' if len(serving) > 1 else ''} {listed}: unload it before "
                    "deleting it"
                )
            await asyncio.to_thread(_remove, folder.parent, folder)
            self._manager.forget(name)
            self._controller.versions.forget(name)
            log.info("model '%s' deleted", name)
            await self._controller.note(name, None, "DELETED", "model folder deleted", origin)

    def _folder(self, name: str) -> Path:
        """The model's folder in the one local repository that has it."""
        problem = model_name_problem(name)
        if problem is not None:
            raise EdgedError(ErrorCode.INVALID_ARG, f"'{printable(name)}' cannot be a model name ({problem})")
        scan = self._manager.scan()
        if name in scan.duplicates:
            raise _conflict(f"model '{name}' appears in two or more repositories: delete its folder by hand")
        source = scan.models.get(name)
        if source is None:
            raise EdgedError(ErrorCode.NOT_FOUND, f"no model '{name}' in the model repository")
        if source.repository in self._synced:
            raise _conflict(
                f"model '{name}' comes from a synced repository (s3://, gs:// or as://): delete it in the bucket, or "
                "the next sync brings it back"
            )
        return source.path

    def _in_use(self, name: str) -> list[int]:
        entry = self._manager.entry(name)
        if entry is None:
            return []
        return sorted(number for number, version in entry.versions.items() if version.state in _IN_USE)


def _conflict(message: str) -> EdgedError:
    """HTTP 409, as an upload that cannot go where it asks."""
    return EdgedError(ErrorCode.ALREADY_EXISTS, message)


def _remove(parent: Path, path: Path) -> None:
    """``path`` renamed to a hidden name in ``parent`` (atomically out of every scan), then removed; and whatever an
    earlier deletion in ``parent`` left behind when it was cut short."""
    going = parent / f"{_GOING}-{path.name}-{time.time_ns()}"
    path.rename(going)
    sync_directory(parent)
    for leftover in parent.iterdir():
        if leftover.name.startswith(f"{_GOING}-") and not leftover.is_symlink():
            remove_tree(parent, leftover)
    sync_directory(parent)
