"""Model control: which models are loaded, and changing that while requests keep flowing.

Modes, as Triton's ``--model-control-mode``:

- ``none``: every model in the repositories loads at start, and nothing changes afterwards;
- ``poll``: the same, then the repositories are scanned every ``--repository-poll-secs`` and models that were
  added, changed or removed are loaded, reloaded or unloaded;
- ``explicit``: only ``--load-model`` models (``*``: all) load at start, with those the load API had loaded before
  the daemon stopped (the desired set kept in the state database); the repository API loads and unloads.

No downtime: a version is (re)loaded beside the one serving and takes requests only once READY; the one it
replaces stops taking requests at that moment, finishes those it has (never interrupted), then unloads
(retirement.py). A version that fails to load leaves the one serving in place, and the failure is recorded. What a
reload does with each version is planned in plan.py (kept as it is, resized in place: resize.py, or loaded anew).
Poll mode never loads a folder that is still being written (poll.py decides what a poll acts on).

Every transition (loading, ready, failed and why, unloading, unloaded) goes to the state database with its origin
(startup, poll, api, upload, sync, probation; a request through the console: console), when it happened and how
long it took, through records.py (one thread of its own, so the event loop never waits for the disk).

Everything here runs on the event loop; blocking work (reading configs, loading, unloading, hashing files) goes to
the load pool, one model at a time per model (a lock per name), many models at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.core.access import ACTOR, DOOR
from edged.core.names import load_name_refusal, model_name_problem, printable
from edged.core.repository.ensembles import composing_models, ensembles_last, is_ensemble
from edged.core.repository.files import FolderPrint, checksum, fingerprint
from edged.core.repository.manager import ModelEntry, ModelState, ModelVersion, VersionsUnavailable
from edged.core.repository.modes import ControlMode, ControlOptions, Origin
from edged.core.repository.plan import plan_versions
from edged.core.repository.poll import FolderWatch
from edged.core.repository.private_copies import PrivateCopies, private_root
from edged.core.repository.records import ControlRecords
from edged.core.repository.resize import resize_in_place
from edged.core.repository.retirement import Retirements
from edged.core.repository.scan import CONFIG_FILENAME, ModelSource
from edged.core.repository.versions import Activation, VersionActivation
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from edged.core.repository.manager import ModelRepositoryManager
    from edged.proto.model_config_pb2 import ModelConfig
    from edged.state.store import HistoryEvent, StateStore

log = logging.getLogger(__name__)


class ModelController:
    def __init__(self, manager: ModelRepositoryManager, options: ControlOptions, store: StateStore | None) -> None:
        self._manager = manager
        state_dir = options.state_dir
        self._copies = PrivateCopies(private_root(state_dir, manager.repositories) if state_dir is not None else None)
        self._options = options
        self._records = ControlRecords(store)
        self._load_pool = ThreadPoolExecutor(max(1, options.load_thread_count), thread_name_prefix="edged-load")
        self._locks: dict[str, asyncio.Lock] = {}
        self._retirements = Retirements(self._load_pool, self._transition)
        # Models loaded only because an ensemble needed them (never by name): unload_dependents takes them along.
        self._implicit: set[str] = set()
        self._watch = FolderWatch()
        self._poller: asyncio.Task[None] | None = None
        # --load-model names no repository holds (explicit mode), for --exit-on-error.
        self.missing_at_start: list[str] = []
        self.versions = VersionActivation(self, manager, self._records, self._transition)
        manager.listing = self._repository_names

    @property
    def mode(self) -> ControlMode:
        return self._options.mode

    def observe(self, observer: Callable[[str, int | None, str, str, str], None]) -> None:
        """Calls ``observer`` with each history event from now on, on the event loop: it must not block."""
        self._records.observe(observer)

    # --- start and stop -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load what this mode serves at start; in poll mode, begin polling."""
        scan = await self._scan()
        if self._options.mode is ControlMode.EXPLICIT:
            wanted = set(self._options.startup_models)
            self.missing_at_start = sorted(name for name in wanted - {"*"} if name not in scan.models)
            for name in self.missing_at_start:
                log.error("model '%s' is not loaded at start: model not found in any model repository", printable(name))
            if "*" in wanted:
                wanted = set(scan.models)
            wanted |= self.versions.restore(await self._records.desired())
            names = sorted(name for name in wanted if self._loadable_at_start(name))
        else:
            names = sorted(scan.models)
        for group in ensembles_last(names, scan):
            results = await asyncio.gather(
                *(self._load(name, Origin.STARTUP, private=self._private_current(name)) for name in group),
                return_exceptions=True,
            )
            for name, result in zip(group, results, strict=True):
                if isinstance(result, EdgedError):
                    log.debug("model '%s' did not load at start: %s", name, result.message)
                elif isinstance(result, BaseException):
                    raise result
        if self._options.mode is ControlMode.POLL:
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    @staticmethod
    def _loadable_at_start(name: str) -> bool:
        """A --load-model name, or one the desired set kept from an older edged, that can be a model's."""
        problem = model_name_problem(name)
        if problem is not None:
            log.error("model '%s' is not loaded at start: it cannot be a model name (%s)", printable(name), problem)
        return problem is None

    async def stop(self) -> None:
        """Stop polling; let unloads in progress end. (The manager unloads what is left.)"""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await self._retirements.wait()
        self._load_pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._records.close()

    # --- the repository API -------------------------------------------------------------------------------------

    async def load(
        self,
        name: str,
        *,
        origin: Origin = Origin.API,
        config_json: str | None = None,
        files: dict[str, bytes] | None = None,
        activation: Activation | None = None,
    ) -> None:
        """Load or reload a model, as ``POST /v2/repository/models/{name}/load``: from its repository folder, or
        from a private copy with ``config_json`` as its config and ``files`` (``<version>/<path>`` -> contents)
        written into it. It serves what its version policy selects, or an ``activation``'s versions."""
        if self._options.mode is not ControlMode.EXPLICIT and origin is Origin.API:
            raise EdgedError(ErrorCode.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")
        refusal = load_name_refusal(name)
        if refusal is not None:
            raise EdgedError(ErrorCode.INVALID_ARG, refusal)
        problem = model_name_problem(name)
        if problem is not None:
            # Triton's answer for a name it finds no folder for, with the reason a folder can never have it.
            raise EdgedError(
                ErrorCode.INTERNAL,
                f"failed to load '{printable(name)}', failed to poll from model repository: "
                f"the name cannot be a model name ({problem})",
            )
        self._implicit.discard(name)
        private = None
        try:
            if config_json is not None or files:
                source = (await self._scan()).models.get(name)
                model_dir = source.path if source is not None else None
                private = await self._copies.make(name, config_json, files or {}, model_dir, self._load_pool)
            else:
                private = await self._kept_override(name)
            try:
                await self._load(name, origin, private=private, desired=True, activation=activation)
            finally:
                self._settle_private(name, private)
        finally:
            # Acknowledged means recorded: the answer waits for the history of this load to be committed.
            await self._records.written()

    async def unload(self, name: str, *, origin: Origin = Origin.API, unload_dependents: bool = False) -> None:
        """Unload every version of a model; answers once they are unloaded, or after the unload timeout while
        requests still finish (they are never interrupted). An unknown model is not an error, as in Triton; a name
        that can never be a model's is (INVALID_ARG). With ``unload_dependents``, as Triton: the models an ensemble
        loaded for itself (never loaded by name) are unloaded with it once no other loaded ensemble uses them. The
        ensembles that use an unloaded model stay loaded, unavailable while it is."""
        if self._options.mode is not ControlMode.EXPLICIT and origin is Origin.API:
            raise EdgedError(ErrorCode.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")
        problem = model_name_problem(name)
        if problem is not None:
            raise EdgedError(
                ErrorCode.INVALID_ARG, f"failed to unload '{printable(name)}': it cannot be a model name ({problem})"
            )
        tasks: list[asyncio.Task[None]] = []
        async with self._lock(name):
            entry = self._manager.entry(name)
            if entry is not None:
                for version in entry.versions.values():
                    if version.state is ModelState.READY:
                        tasks.append(self._retirements.retire(version, origin))
                entry.state, entry.wanted = ModelState.UNAVAILABLE, False
            if self._options.mode is ControlMode.EXPLICIT:
                # Committed before the answer, under the lock, so a load that follows records after it.
                await self._records.remove_desired(name)
        if tasks:
            done, _ = await asyncio.wait(tasks, timeout=self._options.unload_timeout_s)
            if len(done) < len(tasks):
                log.warning(
                    "model '%s' still has requests in flight after %.0fs; it unloads once they finish",
                    name,
                    self._options.unload_timeout_s,
                )
        self._implicit.discard(name)
        if unload_dependents and entry is not None and entry.config is not None:
            # As Triton: the models an ensemble loaded for itself go with it, when no other loaded ensemble uses them.
            for member in dict.fromkeys(step.model_name for step in entry.config.ensemble_scheduling.step):
                if member in self._implicit and not self._manager.dependents(member):
                    log.info("unloading model '%s', which ensemble '%s' loaded", member, name)
                    await self.unload(member, origin=origin, unload_dependents=True)
        await self._records.written()

    async def note(self, name: str, version: int | None, state: str, reason: str, origin: Origin) -> None:
        """Record an event that is not a state change of model control's own (an upload installed or removed)."""
        self._transition(name, version, state, origin, reason)
        await self._records.written()

    async def history(self, name: str | None, offset: int, limit: int) -> tuple[list[HistoryEvent], int]:
        return await self._records.history(name, offset, limit)

    async def restore(self, name: str, before: ModelEntry | None, origin: Origin) -> None:
        """Undo a load that failed (an upload's): the manager's entry of the model ``before`` it is put back (None:
        it had none), so readiness and the index are as they were, and what that load brought up retires. (A failed
        load retired nothing: a version that fails replaces none, and unchanged versions are kept; plan.py.)"""
        async with self._lock(name):
            entry = self._manager.entry(name)
            kept = {id(v) for v in before.versions.values()} if before is not None else set()
            for version in entry.versions.values() if entry is not None else ():
                if version.state is ModelState.READY and id(version) not in kept:
                    self._retirements.retire(version, origin)
            if before is None:
                self._manager.forget(name)
            else:
                self._manager.put_entry(before)
        await self._records.written()

    async def refresh(self, names: Iterable[str], *, origin: Origin = Origin.SYNC) -> dict[str, str | None]:
        """Bring the named models in line with their folders after the repository changed under them (a sync's
        switch): a changed model is reloaded (its new versions load beside the serving ones, so no request fails),
        one whose folder is gone is unloaded, a new one is loaded unless the mode is explicit, where the repository
        API decides what is served, and --load-model: a new model it names (or '*', every model) loads too, as a
        device that syncs its first revision after the start loads what it would have loaded at the start. Returns,
        for each model acted on, None when it serves, else why not."""
        scan = await self._scan()
        outcomes: dict[str, str | None] = {}
        removed = sorted(name for name in set(names) if name not in scan.models)
        present = sorted(name for name in set(names) if name in scan.models)
        for name in removed:
            if self._serves(name):
                log.info("model '%s' is not in the new repository revision: unloading it", name)
                await self.unload(name, origin=origin)
                outcomes[name] = None
        for name in (name for group in ensembles_last(present, scan) for name in group):
            entry = self._manager.entry(name)
            if self.mode is ControlMode.EXPLICIT and not (
                entry.wanted if entry is not None else {"*", name} & set(self._options.startup_models)
            ):
                continue
            try:
                await self._load(name, origin)
            except EdgedError as error:
                outcomes[name] = error.message
            else:
                outcomes[name] = None
        await self._records.written()
        return outcomes

    # --- poll mode ----------------------------------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._options.poll_secs)
            try:
                await self.poll_once()
            except Exception:
                log.exception("polling the model repositories failed")

    async def poll_once(self) -> None:
        scan = await self._scan()
        loop = asyncio.get_running_loop()
        prints: dict[str, FolderPrint | None] = await loop.run_in_executor(
            self._load_pool, lambda: {name: fingerprint(source.path) for name, source in scan.models.items()}
        )
        unload, load = self._watch.changes(prints, self._manager.names(), self._manager.entry, self._serves)
        changes: list[asyncio.Future[Any]] = [
            *(asyncio.ensure_future(self.unload(name, origin=Origin.POLL)) for name in unload),
            *(asyncio.ensure_future(self._load(name, Origin.POLL)) for name in load),
        ]
        for outcome in await asyncio.gather(*changes, return_exceptions=True):
            if isinstance(outcome, EdgedError):
                log.error("%s", outcome.message)
            elif isinstance(outcome, BaseException):
                raise outcome

    # --- loading ------------------------------------------------------------------------------------------------

    async def _load(
        self,
        name: str,
        origin: Origin,
        *,
        private: Path | None = None,
        desired: bool = False,
        activation: Activation | None = None,
        loading: frozenset[str] = frozenset(),
    ) -> None:
        """Load under the model's lock (which versions serve: versions.py); ``desired``: a request's load, then
        recorded (explicit mode) as to be served, before the lock goes, so that an unload after it records after.
        ``loading``: the ensembles whose loads led here (so that a cycle of ensembles ends)."""
        explicit = self._options.mode is ControlMode.EXPLICIT
        if (desired and explicit) or origin is Origin.STARTUP:
            await self._load_composing(name, origin, private, loading | {name})
        async with self._lock(name):
            pin = self.versions.pin_for(name, desired, activation)
            before = self._manager.ready_versions(name)
            try:
                await self._load_locked(name, origin, private, pin)
            finally:
                self.versions.changed(name, before, self._manager.ready_versions(name), origin, activation)
            if desired:
                self.versions.settle(name, pin)
                if self._options.mode is ControlMode.EXPLICIT:
                    await self._records.set_desired(name, pin)
        await self._retry_ensembles(name, origin)

    async def _load_composing(self, name: str, origin: Origin, private: Path | None, loading: frozenset[str]) -> None:
        """As Triton in explicit mode: an ensemble's load first loads the models its steps name that are not ready
        (from the repository, ensembles among them in turn). One that fails is logged; the ensemble's own load then
        fails naming it. At start, in every mode, so that an ensemble of ensembles does not race the one it uses."""
        if private is not None:
            config_file: Path | None = private / CONFIG_FILENAME
        else:
            source = (await self._scan()).models.get(name)
            config_file = source.config_path if source is not None else None
        if config_file is None:
            return
        members = await asyncio.get_running_loop().run_in_executor(self._load_pool, composing_models, config_file)
        for member in members:
            if member in loading:
                continue
            async with self._lock(member):
                pass  # a load of it already under way (another ensemble's, or the start's own) ends first
            entry = self._manager.entry(member)
            if entry is not None and entry.state is ModelState.READY:
                continue
            log.info("loading model '%s', which ensemble '%s' uses", member, name)
            if entry is None or not entry.wanted or entry.state is not ModelState.READY:
                self._implicit.add(member)
            try:
                explicit = self._options.mode is ControlMode.EXPLICIT
                await self._load(member, origin, desired=explicit, loading=loading)
            except EdgedError as exc:
                log.warning("model '%s', which ensemble '%s' uses, did not load: %s", member, name, exc.message)

    async def _retry_ensembles(self, loaded: str, origin: Origin) -> None:
        """An ensemble that could not load for want of a model may load now that ``loaded`` did."""
        entry = self._manager.entry(loaded)
        if entry is None or entry.state is not ModelState.READY:
            return  # (an ensemble that loaded may be what another ensemble waited for)
        for name in self._manager.names():
            other = self._manager.entry(name)
            if (
                other is not None
                and other.wanted
                and other.state is not ModelState.READY
                and other.source.path.is_dir()
                and is_ensemble(other.source.config_path)
            ):
                try:
                    await self._load(
                        name,
                        origin,
                        private=other.source.path if self._copies.holds(name, other.source.path) else None,
                    )
                except EdgedError as exc:
                    log.debug("ensemble '%s' still does not load: %s", name, exc.message)

    async def _load_locked(self, name: str, origin: Origin, private: Path | None, pin: list[int] | None) -> None:
        """Read the config (``pin``: the versions to serve, else its policy's), plan what happens to each version
        (plan_versions), carry the plan out, install the outcome (``_install``). INVALID_ARG names a failed version."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        source = await self._source(name, origin, private)
        old = self._manager.entry(name)
        folder = await loop.run_in_executor(self._load_pool, fingerprint, source.path)
        self._transition(name, None, ModelState.LOADING.value, origin)
        try:
            config, numbers = await loop.run_in_executor(self._load_pool, self._manager.read_config, source, pin)
        except (VersionsUnavailable, EdgedError) as exc:
            error = exc.error if isinstance(exc, VersionsUnavailable) else exc
            self._config_failed(name, source, folder, old, exc, origin, time.monotonic() - started)
            raise EdgedError(ErrorCode.INVALID_ARG, f"load failed for model '{name}': {error.message}") from None
        # Versions may stay where they run from across folders only when theirs is not a private copy, which goes
        # once the model serves from elsewhere.
        movable = old is not None and not self._copies.holds(name, old.source.path)
        plan = plan_versions(old, source, folder, config, numbers, movable=movable)
        old_versions = dict(old.versions) if old is not None else {}
        kept = set(plan.keep)
        for number in kept:
            old_versions[number].config = config  # the same but perhaps for which versions it selects
        for number in sorted(plan.resize):
            if await self._resize(old_versions[number], source, config, origin):
                kept.add(number)
        to_load = [number for number in numbers if number not in kept]
        for number in to_load:
            self._transition(name, number, ModelState.LOADING.value, origin)
        loaded: list[tuple[ModelVersion, float, tuple[str, int]]] = await asyncio.gather(
            *(loop.run_in_executor(self._load_pool, self._load_version, source, config, n) for n in to_load)
        )
        entry = ModelEntry(source, config=config, folder=folder)
        entry.versions = {number: old_versions[number] for number in sorted(kept)}
        failures = self._install(entry, old_versions, numbers, loaded, origin)
        log.info(
            # Triton's words for a load that succeeded, which scripts written for it count.
            "successfully loaded '%s' in %.2fs: %s" if not failures else "model '%s' loaded in %.2fs: %s",
            name,
            time.monotonic() - started,
            ", ".join(f"version {n} {v.state.value}" for n, v in sorted(entry.versions.items())) or "no versions",
        )
        if failures:
            first = failures[0]
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"load failed for model '{name}': version {first.version} is at UNAVAILABLE state: {first.reason};\n",
            )

    async def _source(self, name: str, origin: Origin, private: Path | None) -> ModelSource:
        """Where the model loads from: its private copy, or its folder in the one repository that has it."""
        scan = await self._scan()
        if name in scan.duplicates:
            reason = "model appears in two or more repositories"  # Triton's words
            if self._serves(name):
                # As Triton: the load fails, and the versions serving go on serving.
                self._transition(
                    name, None, ModelState.UNAVAILABLE.value, origin, f"{reason} (the loaded versions keep serving)"
                )
            else:
                self._manager.put_entry(ModelEntry(scan.models[name], ModelState.UNAVAILABLE, reason))
                self._transition(name, None, ModelState.UNAVAILABLE.value, origin, reason)
            raise EdgedError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {reason}")
        source = ModelSource(name, private, private.parent) if private is not None else scan.models.get(name)
        if source is None:
            raise EdgedError(ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model repository")
        return source

    def _install(
        self,
        entry: ModelEntry,
        old_versions: dict[int, ModelVersion],
        numbers: list[int],
        loaded: list[tuple[ModelVersion, float, tuple[str, int]]],
        origin: Origin,
    ) -> list[ModelVersion]:
        """Make ``entry`` (holding the versions kept) the model's: each version that loaded serves from now on and
        the one it replaces retires; one that failed leaves the one serving in place; versions the config no longer
        selects retire once a selected one serves. Returns the versions that failed."""
        name, source = entry.source.name, entry.source
        retire: list[ModelVersion] = []
        failures: list[ModelVersion] = []
        for version, seconds, (digest, size) in loaded:
            current = old_versions.get(version.version)
            serving = current if current is not None and current.state is ModelState.READY else None
            if version.state is ModelState.READY:
                self._manager.activate(version)
                entry.versions[version.version] = version
                if serving is not None:
                    retire.append(serving)
                self._transition(name, version.version, ModelState.READY.value, origin, duration_s=seconds)
                self._records.seen(name, str(source.path / str(version.version)), version.version, digest, size)
                continue
            failures.append(version)
            if serving is not None:
                entry.versions[version.version] = serving  # it keeps serving
                reason = f"{version.reason} (version {version.version} loaded before keeps serving)"
            else:
                entry.versions[version.version] = version
                reason = version.reason
            self._transition(name, version.version, ModelState.UNAVAILABLE.value, origin, reason, duration_s=seconds)
        replaced = any(entry.versions[n].state is ModelState.READY for n in numbers if n in entry.versions)
        for number, current in old_versions.items():
            if number in numbers:
                continue
            entry.versions[number] = current  # shown as UNLOADING, then "unloaded", as Triton lists them
            if current.state is ModelState.READY and replaced:
                retire.append(current)
        serves = any(v.state is ModelState.READY for v in entry.versions.values())
        entry.state = ModelState.READY if serves else ModelState.UNAVAILABLE
        self._manager.put_entry(entry)
        for version in retire:
            self._retirements.retire(version, origin)
        return failures

    async def _resize(self, version: ModelVersion, source: ModelSource, config: ModelConfig, origin: Origin) -> bool:
        context = self._manager.context(source, config, version.version)
        done = await resize_in_place(version, config, context, self._load_pool)
        if done is not None:
            reason = f"instances changed in place ({done[0]})"
            self._transition(version.name, version.version, ModelState.READY.value, origin, reason, duration_s=done[1])
        return done is not None

    def _load_version(
        self, source: ModelSource, config: ModelConfig, number: int
    ) -> tuple[ModelVersion, float, tuple[str, int]]:
        """On the load pool: load one version, and take its checksum for the state database."""
        started = time.monotonic()
        version = self._manager.load_version(source, config, number)
        seconds = time.monotonic() - started
        digest = checksum(source.path / str(number)) if self._records.enabled else ("", 0)
        return version, seconds, digest

    def _config_failed(
        self,
        name: str,
        source: ModelSource,
        folder: FolderPrint | None,
        old: ModelEntry | None,
        exc: VersionsUnavailable | EdgedError,
        origin: Origin,
        seconds: float,
    ) -> None:
        """The config could not be read or completed. A model already serving keeps serving; otherwise it is
        listed UNAVAILABLE with the reason, per version where the config said which."""
        reason = (exc.error if isinstance(exc, VersionsUnavailable) else exc).describe()
        log.error("failed to load model '%s': %s", name, reason)
        if old is not None and any(v.state is ModelState.READY for v in old.versions.values()):
            old.folder = folder  # not tried again until the folder changes
            kept = f"{reason} (the loaded versions keep serving)"
            self._transition(name, None, ModelState.UNAVAILABLE.value, origin, kept, duration_s=seconds)
            return
        entry = ModelEntry(source, ModelState.UNAVAILABLE, folder=folder)
        if isinstance(exc, VersionsUnavailable):
            for number in exc.versions:
                entry.versions[number] = ModelVersion(name, number, ModelState.UNAVAILABLE, reason=reason)
        else:
            entry.reason = reason
        self._manager.put_entry(entry)
        self._transition(name, None, ModelState.UNAVAILABLE.value, origin, reason, duration_s=seconds)

    # --- private copies (loads with override files) -------------------------------------------------------------

    def _private_current(self, name: str) -> Path | None:
        """Explicit mode restores a model from the private copy it was last served from."""
        return self._copies.current(name) if self._options.mode is ControlMode.EXPLICIT else None

    async def _kept_override(self, name: str) -> Path | None:
        """The copy a load without overrides keeps serving from, if any (PrivateCopies.kept: Triton's rule)."""
        entry, loop = self._manager.entry(name), asyncio.get_running_loop()
        serving = entry.source.path if entry is not None and self._serves(name) else None
        source = (await self._scan()).models.get(name) if serving is not None else None
        folder = source.path if source is not None else None
        return await loop.run_in_executor(self._load_pool, self._copies.kept, name, serving, folder)

    def _settle_private(self, name: str, private: Path | None) -> None:
        entry = self._manager.entry(name)
        serving = entry.source.path if entry is not None and entry.state is ModelState.READY else None
        self._copies.settle(name, serving, private)

    # --- helpers ------------------------------------------------------------------------------------------------

    def _serves(self, name: str) -> bool:
        entry = self._manager.entry(name)
        return entry is not None and any(v.state is ModelState.READY for v in entry.versions.values())

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _scan(self) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._load_pool, self._manager.scan)

    def _repository_names(self) -> list[str]:
        """Models in the repositories that were never loaded: Triton's index lists them by name (explicit mode)."""
        if self._options.mode is not ControlMode.EXPLICIT:
            return []
        try:
            return sorted(self._manager.scan().models)
        except EdgedError:
            return []

    def _transition(
        self,
        name: str,
        version: int | None,
        state: str,
        origin: Origin,
        reason: str = "",
        *,
        duration_s: float | None = None,
    ) -> None:
        # Who asked, and through which door, for the changes a request made (edged.core.access): a console click is
        # the console's, whatever it calls; the daemon's own changes have nobody.
        requested = origin in (Origin.API, Origin.UPLOAD)
        actor, source = (ACTOR.get(), DOOR.get() or origin.value) if requested else (None, origin.value)
        self._records.transition(name, version, state, source, reason, duration_s, actor)
