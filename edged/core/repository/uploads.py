"""Uploaded models and versions: an archive on disk becomes a model folder, or the next version of a model, in the
model repository, checked first and installed in one rename.

What an archive may hold (a ``.zip`` or a ``.tar[.gz]``; one top folder around everything is allowed and dropped,
as ``zip -r add_sub.zip add_sub`` makes it, unless that folder is itself a version folder or the model's files):

- **a model folder**: ``config.pbtxt``, numbered version folders (``1/model.onnx``, ...) and any other model-level
  files (labels). For a model that does not exist yet it is installed as it is. For an existing model it may hold
  exactly one version folder and, if it holds a config.pbtxt, the same one the model has: the version is installed
  as the model's next version (its number in the archive is not kept);
- **a version folder**: the files of one version (``model.onnx``, ``model.py``, ...), nothing numbered at the top
  and no config.pbtxt: installed as the next version of an existing model.

The steps: every member inspected (edged.core.repository.archives) before anything is written; the archive
extracted into ``<state dir>/uploads/<id>/`` with the model's config beside it; the config read and checked as
``edged check-repo`` reads it (errors carry ``<model>/config.pbtxt:line:column``), and, unless the upload is to be
activated, each new version loaded and unloaded again as check-repo does; the folder moved into the
repository with one rename (a copy into a hidden folder beside it first when the state directory is on another
file system); the upload recorded in the model history (origin ``upload``, the console's ``console``); then, when
asked, the model loaded through model control, and the new version removed again if it fails to load: the device
is then as it was before the upload (the version serving before keeps serving, a new model is not listed,
readiness is unchanged). New models go to the first local repository; a model of a synced (s3://, gs://, as://)
repository is refused, since its files come from the bucket.

An activated upload is then on probation (probation.py), as edged's own task: no request's actor or door. One that
fails it is removed again, and only what it added: its version folders, and the model's folder only when it made
the folder and no other version has been put in it since. A deliberate change to the model during the window (an
operator's unload or load, an activation, a rollback, another upload) ends the probation unjudged, and the upload
stays: the operator decided what serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from edged.core.confined import inside, make_dirs, remove_tree
from edged.core.names import escape_controls, model_name_problem, printable
from edged.core.repository.archives import ArchiveKind, ArchiveLimits, Member, extract, inspect
from edged.core.repository.deletion import ModelDeletion
from edged.core.repository.files import sync_directory
from edged.core.repository.manager import ModelState, VersionsUnavailable
from edged.core.repository.modes import ControlMode, Origin
from edged.core.repository.probation import watch
from edged.core.repository.scan import CONFIG_FILENAME, ModelSource, is_version_name
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from edged.core.repository.control import ModelController
    from edged.core.repository.manager import ModelEntry, ModelHealth, ModelRepositoryManager
    from edged.core.repository.probation import ProbationLimits

log = logging.getLogger(__name__)

# Where uploads are received and staged, under the state directory.
UPLOADS = "uploads"


@dataclass(frozen=True, slots=True)
class UploadOptions:
    state_dir: Path | None
    limits: ArchiveLimits = field(default_factory=ArchiveLimits)
    # The local mirrors of synced repositories: their models are the bucket's, never uploaded to.
    synced: frozenset[Path] = frozenset()
    # Uploads received at once; one more is refused (each may hold an archive and its extraction on disk).
    max_in_progress: int = 2
    # An activated upload's probation, as a synced update's (None or a zero window: none).
    probation: ProbationLimits | None = None


@dataclass(frozen=True, slots=True)
class UploadResult:
    model: str
    version: int  # the newest version installed
    created: bool  # a new model (not a version of an existing one)
    loaded: bool  # the version installed serves
    problems: list[str] = field(default_factory=list)
    # Seconds of probation the loaded version is under (removed again if it fails them); None: none.
    probation_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "created": self.created,
            "loaded": self.loaded,
            "problems": self.problems,
            "probation_s": self.probation_s,
        }


class UploadInvalid(EdgedError):
    """The upload is refused for what it holds; ``problems`` lists each (the first is the message)."""

    def __init__(self, model: str, problems: list[str], version: int | None = None) -> None:
        super().__init__(ErrorCode.INVALID_ARG, problems[0])
        self.model = model
        self.problems = problems
        self.version = version


def conflict(message: str) -> EdgedError:
    """An upload that cannot go where it asks (a synced model, a name in two repositories): HTTP 409."""
    return EdgedError(ErrorCode.ALREADY_EXISTS, message)


@dataclass(frozen=True, slots=True)
class _Installed:
    """An upload in the repository, and what it added: undoing it removes that and nothing more."""

    model: str
    version: int  # the newest version it installed
    added: tuple[int, ...]  # the version folders it added
    folder: Path  # the model's folder
    created: bool  # it made the model's folder (a new model)


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where each archive member goes, relative to the staged model folder."""

    files: dict[PurePosixPath, PurePosixPath]
    folders: list[PurePosixPath]
    versions: list[int]
    has_config: bool


class ModelUploads:
    def __init__(self, controller: ModelController, manager: ModelRepositoryManager, options: UploadOptions) -> None:
        self._controller = controller
        self._manager = manager
        self._options = options
        self._locks: dict[str, asyncio.Lock] = {}
        # Deleting what is in the repository, under the same per-model locks as uploads.
        self.deletion = ModelDeletion(controller, manager, options.synced, self._locks)
        self._in_progress = 0
        self._probations: set[asyncio.Task[None]] = set()
        if options.state_dir is not None:
            # What an upload cut short by a crash or a power cut left behind.
            remove_tree(options.state_dir, options.state_dir / UPLOADS)

    @property
    def limits(self) -> ArchiveLimits:
        return self._options.limits

    @contextlib.asynccontextmanager
    async def receiving(self) -> AsyncIterator[Path]:
        """A new file for an upload's body (its folder made, the file not), removed afterwards."""
        if self._options.state_dir is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, "uploads need a state directory (--state-dir)")
        if self._in_progress >= self._options.max_in_progress:
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                f"{self._in_progress} uploads are in progress, the most this server takes at once: try again later",
            )
        self._in_progress += 1
        root = self._options.state_dir / UPLOADS
        folder = inside(root, root / f"{time.time_ns()}-{id(self)}-{self._in_progress}")
        try:
            await asyncio.to_thread(make_dirs, root, folder)
            yield folder / "archive"
        finally:
            self._in_progress -= 1
            await asyncio.to_thread(remove_tree, root, folder)

    async def precheck(self, name: str, *, activate: bool) -> None:
        """What refuses an upload before its archive is received: the name, the control mode, where it would go."""
        self._check_request(name, activate)
        await asyncio.to_thread(self._where, name)

    async def install(self, name: str, archive: Path, kind: ArchiveKind, *, activate: bool) -> UploadResult:
        """Check the archive at ``archive`` and install it as model ``name`` or as its next version (see the module's
        docstring). UploadInvalid for what the archive holds, ALREADY_EXISTS for where it cannot go."""
        self._check_request(name, activate)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            try:
                return await self._install(name, archive, kind, activate)
            except EdgedError as error:
                # The uploader sees the reasons; the log keeps them for whoever looks at the device later.
                reasons = "; ".join(error.problems) if isinstance(error, UploadInvalid) else error.message
                log.warning("upload of model '%s' refused: %s", printable(name), escape_controls(reasons))
                raise

    def _check_request(self, name: str, activate: bool) -> None:
        problem = model_name_problem(name)
        if problem is not None:
            raise EdgedError(ErrorCode.INVALID_ARG, f"'{printable(name)}' cannot be a model name ({problem})")
        if activate and self._controller.mode is ControlMode.NONE:
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                "an upload cannot be activated when models are not controlled (--model-control-mode none): upload "
                "without activating, and restart the server to serve it",
            )

    async def _install(self, name: str, archive: Path, kind: ArchiveKind, activate: bool) -> UploadResult:
        existing, repository = await asyncio.to_thread(self._where, name)
        members = await asyncio.to_thread(inspect, archive, kind, self.limits)
        plan = _plan(name, members, existing)
        staging = archive.parent / "staged"
        staged_model = staging / name
        await asyncio.to_thread(make_dirs, archive.parent, staged_model)
        await asyncio.to_thread(extract, archive, kind, plan.files, plan.folders, staged_model, self.limits)
        if existing is None:
            version = max(plan.versions)
            source = ModelSource(name, staged_model, staging)
        else:
            version = await asyncio.to_thread(_next_version, existing.path)
            if plan.has_config:
                if (staged_model / CONFIG_FILENAME).read_bytes() != _read(existing.path / CONFIG_FILENAME):
                    raise UploadInvalid(
                        name,
                        [
                            f"model '{name}' exists and the archive's config.pbtxt differs from its own: a new version "
                            "keeps the model's config (upload the version folder alone, or a model under a new name)"
                        ],
                    )
            elif (existing.path / CONFIG_FILENAME).is_file():
                config = existing.path / CONFIG_FILENAME
                await asyncio.to_thread(shutil.copyfile, config, staged_model / CONFIG_FILENAME)
            await asyncio.to_thread(os.rename, staged_model / "_version", staged_model / str(version))
            source = ModelSource(name, staged_model, staging)
        await self._check(name, source, version if existing is not None else None, trial=not activate)
        destination = await asyncio.to_thread(self._move, name, staged_model, existing, repository, version)
        installed = f"version {version}" if existing is not None else f"new model, versions {plan.versions}"
        log.info("model '%s' uploaded: %s", name, installed)
        await self._controller.note(name, version, "UPLOADED", f"uploaded ({installed})", Origin.UPLOAD)
        result = UploadResult(name, version, existing is None, loaded=False)
        if not activate:
            return result
        upload = (
            _Installed(name, version, tuple(plan.versions), destination, created=True)
            if existing is None
            else _Installed(name, version, (version,), destination.parent, created=False)
        )
        # Read before the load: what the new version does from its first moment counts, a crash included; and what
        # the manager had of the model, to put back if the load fails.
        baseline = self._manager.health(name)
        before = self._manager.entry(name)
        try:
            await self._controller.load(name, origin=Origin.UPLOAD)
        except EdgedError as error:
            reason = f"the upload was removed again: it failed to load: {error.message.strip()}"
            await self._remove(upload, reason, Origin.UPLOAD)
            await self._controller.restore(name, before, Origin.UPLOAD)
            raise UploadInvalid(name, [reason], version) from None
        entry = self._manager.entry(name)
        loaded = entry is not None and any(
            number == version and state.state is ModelState.READY for number, state in entry.versions.items()
        )
        limits = self._options.probation
        if entry is None or not loaded or limits is None or limits.window_s <= 0:
            return UploadResult(name, version, existing is None, loaded)
        # In a context of its own: what the probation does is edged's, not the uploader's (edged.core.access).
        task = asyncio.create_task(self._probation(upload, baseline, entry), context=contextvars.Context())
        self._probations.add(task)
        task.add_done_callback(self._probations.discard)
        return UploadResult(name, version, existing is None, loaded, probation_s=limits.window_s)

    async def _probation(self, upload: _Installed, baseline: ModelHealth, watched: ModelEntry) -> None:
        """The activated upload's probation over ``watched``, the entry its load made: one that fails it is removed,
        and what served before serves again (a new model is unloaded). Any other entry, or an unload, is someone's
        change to the model, which ends the probation unjudged."""
        assert self._options.probation is not None
        name = upload.model
        endings: list[str] = []

        def ended(_: str) -> str | None:
            why = _changed(self._manager.entry(name), watched)
            if why is not None:
                endings.append(why)
            return why

        failed = await watch(self._manager, [name], self._options.probation, {name: baseline}, ended)
        if endings:
            reason = f"the probation of the upload ended unjudged: {endings[0]}; the upload stays installed"
            await self._controller.note(name, upload.version, "PROBATION_ENDED", reason, Origin.PROBATION)
            return
        if name not in failed:
            return
        reason = f"the upload was removed again: it failed its probation: {failed[name]}"
        # Under the upload lock: an upload to the same model meanwhile waits, so what is removed is what was judged.
        async with self._locks.setdefault(name, asyncio.Lock()):
            try:
                if upload.created:
                    await self._controller.unload(name, origin=Origin.PROBATION)
                if await self._remove(upload, reason, Origin.PROBATION):
                    await self._controller.restore(name, None, Origin.PROBATION)  # the model is gone: not listed
                elif not upload.created:
                    await self._controller.load(name, origin=Origin.PROBATION)
            except EdgedError as error:
                log.error("model '%s': after the upload that failed its probation: %s", name, error.message)

    async def _remove(self, upload: _Installed, reason: str, origin: Origin) -> bool:
        """What the upload added out of the repository again, and why in the history: its version folders, and the
        model's folder when the upload made it and no other version is in it now (one uploaded or put there since
        stays). True when the model's folder is gone."""
        log.error("model '%s': %s", upload.model, reason)
        others = await asyncio.to_thread(_other_versions, upload.folder, upload.added)
        whole = upload.created and not others
        root = upload.folder.parent if whole else upload.folder
        paths = [upload.folder] if whole else [upload.folder / str(number) for number in upload.added]
        for path in paths:
            await asyncio.to_thread(remove_tree, root, path)
        await asyncio.to_thread(sync_directory, root)
        await self._controller.note(upload.model, upload.version, "UPLOAD_REMOVED", reason, origin)
        return whole

    async def close(self) -> None:
        """Ends the probations in progress (at the daemon's stop): the uploads they watch stay installed."""
        for task in list(self._probations):
            task.cancel()
        await asyncio.gather(*self._probations, return_exceptions=True)

    def _where(self, name: str) -> tuple[ModelSource | None, Path]:
        """The model's folder if it exists, and the repository it is (or a new model goes) in."""
        scan = self._manager.scan()
        if name in scan.duplicates:
            raise conflict(f"model '{name}' cannot be uploaded to: the model appears in two or more repositories")
        existing = scan.models.get(name)
        if existing is not None:
            if existing.repository in self._options.synced:
                raise conflict(
                    f"model '{name}' comes from a synced repository (s3://, gs:// or as://): its files come from the "
                    "bucket, so publish the new version there"
                )
            return existing, existing.repository
        local = [path for path in self._manager.repositories if path not in self._options.synced]
        if not local:
            raise conflict(
                "every model repository of this server is synced (s3://, gs:// or as://): upload to the bucket"
            )
        return None, local[0]

    async def _check(self, name: str, source: ModelSource, version: int | None, *, trial: bool) -> None:
        """Read and complete the staged config as ``edged check-repo`` does, and with ``trial`` load each staged
        version and unload it again, as check-repo does too (an activation loads it for real instead, and undoes
        the upload if that fails); UploadInvalid with the problems."""
        try:
            config, versions = await asyncio.to_thread(self._manager.read_config, source)
        except VersionsUnavailable as exc:
            raise UploadInvalid(name, [exc.error.message]) from None
        except EdgedError as exc:
            message = exc.message
            if version is not None and "version policy" in message:
                message = f"version {version} would not be served: {message} (see its version_policy)"
            raise UploadInvalid(name, [message]) from None
        if version is not None and version not in versions:
            raise UploadInvalid(
                name, [f"version {version} would not be served under the version_policy of model '{name}'"]
            )
        if not trial or config.platform == "ensemble":
            return  # an ensemble's steps are checked against the models it is made of when it loads
        problems = []
        for number in versions:
            loaded = await asyncio.to_thread(self._manager.load_version, source, config, number)
            if loaded.state is not ModelState.READY:
                problems.append(f"version {number}: {loaded.reason}")
            elif loaded.backend_model is not None:
                await asyncio.to_thread(loaded.backend_model.unload)
        if problems:
            raise UploadInvalid(name, problems, version)

    def _move(self, name: str, staged: Path, existing: ModelSource | None, repository: Path, version: int) -> Path:
        """Into the repository in one rename: the model folder (new model) or its version folder."""
        if existing is None:
            source, destination = staged, inside(repository, repository / name)
        else:
            source, destination = staged / str(version), inside(existing.path, existing.path / str(version))
        if os.path.lexists(destination):
            raise conflict(f"model '{name}' changed while it was uploaded: try again")
        _open_permissions(source)
        parent = destination.parent
        if os.stat(source).st_dev == os.stat(parent).st_dev:
            os.rename(source, destination)
        else:
            # Another file system: copied beside the destination under a hidden name (never scanned), then renamed.
            temporary = inside(parent, parent / f".edged-upload-{time.time_ns()}")
            try:
                shutil.copytree(source, temporary)
                _sync_tree(temporary)
                os.rename(temporary, destination)
            except BaseException:
                remove_tree(parent, temporary)
                raise
        sync_directory(parent)
        return destination


def _plan(name: str, members: list[Member], existing: ModelSource | None) -> _Plan:
    """Which layout the archive has, and where its members go (see the module's docstring)."""
    if not any(not member.is_dir for member in members):
        raise UploadInvalid(name, ["the archive holds no files"])
    paths = [member.path for member in members]
    top = {path.parts[0] for path in paths}
    # Each member's path in the archive, by its path in the model folder (the same unless a top folder is dropped).
    origin = {path: path for path in paths}
    if len(top) == 1:
        (folder,) = top
        inner = {path.parts[1] for path in paths if len(path.parts) > 1}
        if not is_version_name(folder) and (CONFIG_FILENAME in inner or any(is_version_name(p) for p in inner)):
            members = [
                Member(PurePosixPath(*m.path.parts[1:]), m.is_dir, m.size) for m in members if len(m.path.parts) > 1
            ]
            origin = {PurePosixPath(*path.parts[1:]): path for path in paths if len(path.parts) > 1}
    files = {origin[m.path]: m.path for m in members if not m.is_dir}
    folders = [m.path for m in members if m.is_dir]
    roots = {m.path.parts[0]: m for m in members}
    has_config = CONFIG_FILENAME in roots and not roots[CONFIG_FILENAME].is_dir
    versions = sorted(
        int(part) for part in roots if is_version_name(part) and any(m.path.parts[0] == part for m in members)
    )
    is_model_folder = has_config or bool(versions)
    if existing is None:
        if not is_model_folder:
            raise UploadInvalid(
                name,
                [
                    f"model '{name}' does not exist: a new model is uploaded as a model folder (config.pbtxt and "
                    "numbered version folders such as 1/model.onnx)"
                ],
            )
        if not versions:
            raise UploadInvalid(name, [f"the archive holds no version folder for model '{name}' (1/, 2/, ...)"])
        return _Plan(files, folders, versions, has_config)
    if not is_model_folder:
        # The files of one version: they go under a placeholder renamed to the next number once it is known.
        return _Plan(
            {source: PurePosixPath("_version", *path.parts) for source, path in files.items()},
            [PurePosixPath("_version", *path.parts) for path in folders] + [PurePosixPath("_version")],
            [],
            False,
        )
    others = sorted(part for part in roots if part != CONFIG_FILENAME and not is_version_name(part))
    if len(versions) != 1 or others:
        held = ", ".join([*(str(v) for v in versions), *others]) or "nothing else"
        raise UploadInvalid(
            name,
            [
                f"model '{name}' exists: a new version is one version folder (with, at most, the model's own "
                f"config.pbtxt), but the archive holds {held}"
            ],
        )
    number = str(versions[0])

    def placed(path: PurePosixPath) -> PurePosixPath:
        return PurePosixPath("_version", *path.parts[1:]) if path.parts[0] == number else path

    return _Plan(
        {source: placed(path) for source, path in files.items()},
        [placed(path) for path in folders],
        [],
        has_config,
    )


def _changed(now: ModelEntry | None, watched: ModelEntry) -> str | None:
    """How the model was changed on purpose since ``watched`` (the entry an upload's load made) was made, if it
    was: model control makes a new entry for every load (an activation, a rollback, another upload's) and marks an
    unloaded one unwanted, in the same step that changes what serves."""
    if now is None:
        return "the model is no longer loaded"
    if now is not watched:
        return "the model was loaded again (a load, an activation, a rollback or another upload)"
    if not now.wanted:
        return "the model was unloaded"
    return None


def _other_versions(model_dir: Path, added: tuple[int, ...]) -> list[int]:
    """The version folders in ``model_dir`` besides ``added``."""
    try:
        return [int(e.name) for e in os.scandir(model_dir) if is_version_name(e.name) and int(e.name) not in added]
    except FileNotFoundError:
        return []


def _next_version(model_dir: Path) -> int:
    numbers = [int(entry.name) for entry in os.scandir(model_dir) if is_version_name(entry.name)]
    return max(numbers, default=0) + 1


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _open_permissions(root: Path) -> None:
    """Folders made for the staging are owner-only; in the repository they read as the rest of it does."""
    for folder, dirs, _files in os.walk(root):
        os.chmod(folder, 0o755)
        dirs.sort()


def _sync_tree(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_directory(Path(folder))
