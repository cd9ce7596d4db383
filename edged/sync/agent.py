"""The daemon's side of repository sync: one loop per remote repository that syncs it on an interval with jitter,
backs off after failures, hands each new revision to the models (edged.core.repository.probation), keeps the
history and the metrics, and answers the status, now, pause and resume of the API.

The server reads each remote repository from its local mirror (``SnapshotStore.serving_path``), which exists before
the first model loads (an empty snapshot on a device that never synced): start-up never waits for the network, and
a bucket that cannot be reached leaves the last committed revision serving while the loop keeps trying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from edged.core.repository.manager import VersionsUnavailable
from edged.core.repository.probation import ProbationLimits, apply
from edged.core.repository.scan import ModelSource
from edged.errors import EdgedError
from edged.sync.errors import SourceProblem, SyncError
from edged.sync.fleet import channel_url
from edged.sync.paths import source_id
from edged.sync.plan import changed_models
from edged.sync.runner import RunOptions, SyncResult, Verifier, sync_once
from edged.sync.snapshots import Snapshot, SnapshotStore
from edged.sync.sources import ClientOptions, RemoteRepository, open_repository
from edged.sync.transfer import Progress

if TYPE_CHECKING:
    from edged.core.repository.control import ModelController
    from edged.core.repository.manager import ModelRepositoryManager
    from edged.core.sync_control import SyncObserver
    from edged.state.store import StateStore
    from edged.state.sync_runs import SyncRunRecord

log = logging.getLogger("edged.sync")

# Spread of the interval (plus or minus), so that a fleet started together does not list the bucket together.
JITTER: Final = 0.1
# After a failure the next try comes sooner than the interval: 5 s, doubling up to the interval.
FIRST_RETRY_S: Final = 5.0


@dataclass(frozen=True)
class SyncSettings:
    """What the sync loop needs from the daemon's configuration."""

    interval_s: float = 300.0
    max_rate: int | None = None
    trusted_root: Path | None = None
    channel: str | None = None
    device_id: str = ""
    report_status: bool = False
    probation: ProbationLimits = field(default_factory=ProbationLimits)
    client: ClientOptions = field(default_factory=ClientOptions)


def next_delay(interval_s: float, failures: int, uniform: Callable[[float, float], float] = random.uniform) -> float:
    """Seconds until the next run: the interval give or take JITTER; after ``failures`` failed runs in a row,
    exponential backoff from FIRST_RETRY_S up to the interval, with full jitter over its upper half (so that devices
    that lost the bucket together do not come back together)."""
    if failures:
        return min(interval_s, FIRST_RETRY_S * float(2 ** (failures - 1))) * uniform(0.5, 1.0)
    return interval_s * uniform(1 - JITTER, 1 + JITTER)


@dataclass
class _Source:
    url: str
    state_dir: Path
    store: SnapshotStore
    remote: RemoteRepository
    verifier: Verifier | None
    # Where this device's status is written (the repository without its channel); None: not reported.
    fleet: RemoteRepository | None = None
    phase: str = "idle"
    signed: bool = False
    last_run: SyncRunRecord | None = None
    last_success: datetime | None = None
    last_error: str | None = None
    failures: int = 0
    due: float = 0.0
    progress: Progress | None = None
    held_back: frozenset[str] = frozenset()
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RepositorySync:
    """The sync of every remote repository the daemon serves."""

    def __init__(
        self,
        urls: list[str],
        state_dir: Path,
        settings: SyncSettings,
        controller: ModelController,
        manager: ModelRepositoryManager,
        store: StateStore | None,
        observer: SyncObserver,
        env: Mapping[str, str],
    ) -> None:
        """Opens a client for each repository (SyncError when a URL is wrong or its client is not installed) and
        expects each to have its local snapshot already (edged.daemon.sync.prepare_mirrors makes them before the
        server reads them)."""
        self._settings = settings
        self._controller = controller
        self._manager = manager
        self._state = store
        self._observer = observer
        self._paused = False
        self._tasks: list[asyncio.Task[None]] = []
        self._probations: set[asyncio.Task[None]] = set()
        self._sources: list[_Source] = []
        for base in urls:
            url = channel_url(base, settings.channel)  # SyncError for a channel that cannot be a folder
            snapshots = SnapshotStore(state_dir, url)
            remote = open_repository(url, env, settings.client)
            verifier = self._verifier(settings, snapshots) if settings.trusted_root is not None else None
            fleet = open_repository(base, env, settings.client) if settings.report_status else None
            self._sources.append(_Source(url, state_dir, snapshots, remote, verifier, fleet))

    @staticmethod
    def _verifier(settings: SyncSettings, snapshots: SnapshotStore) -> Verifier:
        from edged.sync.signed import TufVerifier

        assert settings.trusted_root is not None
        return TufVerifier(settings.trusted_root, snapshots.root / "tuf")

    @property
    def paused(self) -> bool:
        return self._paused

    # --- life cycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        for source in self._sources:
            verdicts = await self._verdicts(source)
            source.held_back = frozenset(rev for rev, verdict in verdicts.items() if verdict == "bad")
            self._show_revision(source)
            self._tasks.append(asyncio.get_running_loop().create_task(self._loop(source), name=f"sync {source.url}"))

    def stopping(self) -> None:
        for task in [*self._tasks, *self._probations]:
            task.cancel()

    async def stop(self) -> None:
        await asyncio.gather(*self._tasks, *self._probations, return_exceptions=True)
        self._tasks.clear()
        for source in self._sources:
            for client in (source.remote, source.fleet):
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.close()

    # --- the API ----------------------------------------------------------------------------------------------

    def pause(self) -> None:
        if not self._paused:
            log.info("repository sync paused")
        self._paused = True
        for source in self._sources:
            source.wake.set()  # the loops go back to waiting, for a resume this time

    def resume(self) -> None:
        if self._paused:
            log.info("repository sync resumed")
        self._paused = False
        for source in self._sources:
            source.wake.set()

    async def run_now(self) -> list[dict[str, Any]]:
        """Run every source's sync now (paused or not: asking is explicit) and answer how each went."""
        runs = await asyncio.gather(*(self._run(source) for source in self._sources))
        return [self._run_json(run) for run in runs]

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "paused": self._paused,
            "device_id": self._settings.device_id,
            "channel": self._settings.channel,
            "interval_s": self._settings.interval_s,
            "sources": [self._source_json(source, now) for source in self._sources],
        }

    async def history(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        if self._state is None:
            return [], 0
        runs, total = await asyncio.to_thread(self._state.sync_runs, None, offset=offset, limit=limit)
        return [self._run_json(run) for run in runs], total

    # --- the loop ---------------------------------------------------------------------------------------------

    async def _loop(self, source: _Source) -> None:
        # A revision switched to but never committed (the daemon stopped during its probation) is judged first.
        await self._recover(source)
        while True:
            if not self._paused:
                await self._run(source)
            source.wake.clear()
            # Paused: nothing is due until a resume wakes the loop (a past due time must not spin it).
            wait = None if self._paused else max(0.0, source.due - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(source.wake.wait(), wait)

    async def _run(self, source: _Source) -> SyncRunRecord:
        async with source.lock:
            began = time.monotonic()
            source.phase, source.progress = "syncing", Progress()
            options = RunOptions(
                self._settings.max_rate, source.held_back, progress=source.progress, validate=self._validate
            )
            try:
                result = await sync_once(source.remote, source.state_dir, source.verifier, options)
            except SyncError as error:
                run = await self._failed(source, error, time.monotonic() - began)
            except Exception as error:  # a bug must not end the loop: the next run may well succeed
                log.exception("sync of %s failed", source.url)
                run = await self._failed(source, SyncError(SourceProblem.OTHER, repr(error)), time.monotonic() - began)
            else:
                run = await self._succeeded(source, result)
            finally:
                source.progress = None
                if source.phase == "syncing":
                    source.phase = "idle"
            self._schedule(source)
            await self._report(source)
            return run

    def _schedule(self, source: _Source) -> None:
        source.due = time.monotonic() + next_delay(self._settings.interval_s, source.failures)

    async def _failed(self, source: _Source, error: SyncError, seconds: float) -> SyncRunRecord:
        source.failures += 1
        source.last_error = str(error)
        current = source.store.current()
        revision = current.revision if current is not None else None
        if revision is None:  # nothing synced yet: there is no revision of it to keep
            log.error("sync of %s failed (%s); nothing of it serves until a sync succeeds", source.url, error)
        else:
            log.error("sync of %s failed (%s); revision %s keeps serving", source.url, error, revision)
        self._observer.run(source.url, "failed", error.problem.name.lower(), 0, seconds)
        return await self._record(
            source, "failed", revision, revision, 0, 0, error.problem.name.lower(), str(error), seconds
        )

    async def _succeeded(self, source: _Source, result: SyncResult) -> SyncRunRecord:
        source.failures, source.last_error, source.signed = 0, None, result.signed
        source.last_success = datetime.now(UTC)
        outcome = "held-back" if result.held_back is not None else "updated" if result.changed else "unchanged"
        self._observer.run(source.url, outcome, None, result.bytes_transferred, result.seconds)
        if result.held_back is not None:
            message = f"revision {result.held_back} failed its probation before; waiting for a newer one"
            return await self._record(
                source, "held-back", result.held_back, result.revision, 0, 0, None, message, result.seconds
            )
        if not result.changed:
            return await self._record(
                source, "unchanged", result.revision, result.revision, 0, 0, None, "", result.seconds
            )
        files = len(result.downloaded) + len(result.removed)
        message = (
            f"{len(result.downloaded)} files downloaded, {len(result.linked)} unchanged, {len(result.removed)} removed"
            + ("" if result.signed else " (unsigned source)")
        )
        if result.refused:
            reason = "; ".join(f"model '{name}': {why}" for name, why in sorted(result.refused.items()))
            message += f"; refused before the switch, keeping their files: {reason}"
            source.held_back = source.held_back | {result.remote_revision}
            await self._set_verdict(source, result.remote_revision, "bad", reason)
            for name, why in sorted(result.refused.items()):
                self._observer.rollback(
                    source.url, name, result.remote_revision, f"was refused before the switch: {why}"
                )
        run = await self._record(
            source,
            "updated",
            result.revision,
            result.previous_revision,
            files,
            result.bytes_transferred,
            None,
            message,
            result.seconds,
        )
        self._show_revision(source)
        # After the run's answer (the API's "now" returns with it), before any other run: the lock is fair.
        models = changed_models((*result.downloaded, *result.removed)) - set(result.refused)
        source.phase = "probation"
        task = asyncio.get_running_loop().create_task(self._held_probation(source, result.remote_revision, models))
        self._probations.add(task)
        task.add_done_callback(self._probations.discard)
        return run

    # --- probation and rollback -------------------------------------------------------------------------------

    async def _recover(self, source: _Source) -> None:
        current, good = source.store.current(), source.store.good()
        if current is None or good is None or current.path == good.path:
            return
        changed = {
            path
            for path in set(current.files) | set(good.files)
            if (a := current.files.get(path)) is None or (b := good.files.get(path)) is None or a.sha256 != b.sha256
        }
        log.info(
            "revision %s of %s was not committed when edged stopped: holding its probation",
            current.revision,
            source.url,
        )
        await self._held_probation(source, current.revision, changed_models(changed))

    async def _held_probation(self, source: _Source, revision: str, models: set[str]) -> None:
        async with source.lock:
            try:
                await self._probation(source, revision, models)
            except Exception:
                log.exception("the probation of revision %s of %s failed", revision, source.url)
            finally:
                source.phase = "idle"

    async def _probation(self, source: _Source, revision: str, models: set[str]) -> None:
        source.phase = "probation"
        failed = await apply(self._controller, self._manager, models, self._settings.probation)
        current = source.store.current()
        assert current is not None
        if not failed:
            source.store.mark_good(current)
            if revision not in source.held_back:  # models of it were refused: it stays bad, what serves is good
                await self._set_verdict(source, revision, "good", "")
            await self._record(
                source,
                "committed",
                revision,
                None,
                len(models),
                0,
                None,
                f"models passed their probation: {', '.join(sorted(models)) or 'none'}",
                None,
            )
            log.info("revision %s of %s committed as last known good", revision, source.url)
            await self._report(source)
            return
        source.phase = "rolling back"
        reason = "; ".join(f"model '{name}': {why}" for name, why in sorted(failed.items()))
        good = source.store.good()
        mixed = await asyncio.to_thread(self._roll_back, source, current, good, set(failed), revision)
        for name, why in sorted(failed.items()):
            self._observer.rollback(source.url, name, revision, f"failed its probation: {why}")
        log.error(
            "revision %s of %s failed its probation (%s): rolling %s back to revision %s",
            revision,
            source.url,
            reason,
            ", ".join(sorted(failed)),
            good.revision if good is not None else "(none)",
        )
        outcomes = await self._controller.refresh(set(failed))
        for name, problem in outcomes.items():
            if problem is not None:
                log.error("model '%s' did not load from its last known good files either: %s", name, problem)
        source.held_back = source.held_back | {revision}
        await self._set_verdict(source, revision, "bad", reason)
        await self._record(source, "rolled-back", mixed.revision, revision, len(failed), 0, None, reason, None)
        self._show_revision(source)
        await self._report(source)

    # --- records ----------------------------------------------------------------------------------------------

    async def _verdicts(self, source: _Source) -> dict[str, str]:
        if self._state is None:
            return {}
        return await asyncio.to_thread(self._state.verdicts, source.url)

    async def _set_verdict(self, source: _Source, revision: str, verdict: str, reason: str) -> None:
        if self._state is not None:
            await asyncio.to_thread(self._state.set_verdict, source.url, revision, verdict, reason)

    async def _record(
        self,
        source: _Source,
        outcome: str,
        revision: str | None,
        previous: str | None,
        files: int,
        transferred: int,
        problem: str | None,
        message: str,
        seconds: float | None,
    ) -> SyncRunRecord:
        from edged.state.sync_runs import SyncRunRecord

        run = SyncRunRecord(
            source.url, outcome, revision, previous, files, transferred, problem, message, datetime.now(UTC), seconds
        )
        if self._state is not None:
            try:
                run = await asyncio.to_thread(self._state.add_sync_run, run)
            except Exception:
                log.exception("the sync run of %s was not recorded", source.url)
        source.last_run = run
        return run

    @staticmethod
    def _roll_back(
        source: _Source, current: Snapshot, good: Snapshot | None, models: set[str], revision: str
    ) -> Snapshot:
        """Serve ``models`` from the last known good snapshot again, the rest as they are (in a worker thread)."""
        with source.store.locked():
            source.store.prepare()
            mixed = source.store.build_mixed(current, good, models, f"{revision}~rollback")
            source.store.switch(mixed)
            source.store.mark_good(mixed)
            source.store.collect_garbage()
        return mixed

    def _validate(self, repository: Path, models: frozenset[str]) -> dict[str, str]:
        """Before a switch (in a worker thread): the changed models whose new config cannot be served, as ``edged
        check-repo`` reads it (parsed, completed, its versions found), without loading anything."""
        problems: dict[str, str] = {}
        for name in sorted(models):
            folder = repository / name
            if not folder.is_dir():
                continue  # removed by the revision
            try:
                self._manager.read_config(ModelSource(name, folder, repository))
            except VersionsUnavailable as error:
                problems[name] = error.error.message
            except EdgedError as error:
                problems[name] = error.message
        return problems

    async def _report(self, source: _Source) -> None:
        """Write this device's status next to the repository, for ``edged fleet status``; a failure to write it is
        logged and changes nothing else (the bucket may well be read-only to devices)."""
        if source.fleet is None:
            return
        from edged import __version__
        from edged.sync.fleet import DeviceStatus, ModelStatus, report

        models = {}
        for name in self._manager.names():
            entry = self._manager.entry(name)
            if entry is None or not entry.wanted:
                continue
            versions = self._manager.ready_versions(name)
            models[name] = ModelStatus(entry.state.name, ",".join(map(str, versions)) or None)
        current = source.store.current()
        status = DeviceStatus(
            device=self._settings.device_id,
            channel=self._settings.channel,
            revision=current.revision if current is not None else None,
            signed=source.signed,
            models=models,
            last_error=source.last_error,
            last_sync=source.last_success,
            updated_at=datetime.now(UTC),
            edged_version=__version__,
        )
        try:
            await report(source.fleet, status)
        except (SyncError, ValueError) as error:
            log.warning("the status of this device was not written to %s: %s", source.fleet.url, error)

    def _show_revision(self, source: _Source) -> None:
        current = source.store.current()
        self._observer.revision(source.url, current.revision if current is not None else "")

    # --- JSON -------------------------------------------------------------------------------------------------

    def _source_json(self, source: _Source, now: float) -> dict[str, Any]:
        current, good = source.store.current(), source.store.good()
        return {
            "url": source.url,
            "id": source_id(source.url),
            "phase": source.phase,
            "signed": source.signed,
            "revision": current.revision if current is not None else None,
            "good_revision": good.revision if good is not None else None,
            "held_back": sorted(source.held_back),
            "last_success_at": source.last_success.isoformat() if source.last_success else None,
            "last_error": source.last_error,
            "consecutive_failures": source.failures,
            "next_run_in_s": None if self._paused else round(max(0.0, source.due - now), 1),
            "progress": source.progress.as_json() if source.progress is not None else None,
            "last_run": self._run_json(source.last_run) if source.last_run is not None else None,
        }

    @staticmethod
    def _run_json(run: SyncRunRecord) -> dict[str, Any]:
        return {
            "id": run.id,
            "source": run.source,
            "outcome": run.outcome,
            "revision": run.revision,
            "previous": run.previous,
            "files": run.files,
            "bytes": run.bytes,
            "problem": run.problem,
            "message": run.message,
            "at": run.at.isoformat(),
            "duration_s": run.duration_s,
        }
