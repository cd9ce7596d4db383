"""Repository sync as a part of the daemon: its settings taken from the configuration, the local mirrors made
before anything reads them, and the sync loops started after the models loaded and stopped before them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from edged.daemon.endpoints import StartupError

if TYPE_CHECKING:
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from edged.config.settings import Settings
    from edged.core.repository.control import ModelController
    from edged.core.repository.manager import ModelRepositoryManager
    from edged.core.sync_control import SyncObserver
    from edged.state.store import StateStore
    from edged.sync.agent import RepositorySync


def prepare_mirrors(settings: Settings) -> None:
    """Each remote repository's local mirror, made (empty) on a device that never synced, so that the server
    starts at once and serves the models when the first sync brings them."""
    from edged.sync.errors import SyncError
    from edged.sync.paths import channel_url
    from edged.sync.snapshots import SnapshotStore

    assert settings.state_dir is not None
    for url in settings.remote_repositories:
        try:
            SnapshotStore(settings.state_dir, channel_url(url, settings.sync_channel)).ensure_current()
        except (SyncError, OSError) as exc:
            raise StartupError(f"the local mirror of {url} cannot be prepared: {exc}") from None


def mirrors(settings: Settings) -> frozenset[Path]:
    """The local mirrors of the synced repositories, as they appear among the model repositories."""
    if not settings.remote_repositories or settings.state_dir is None:
        return frozenset()
    from edged.sync.paths import local_repository

    state, channel = settings.state_dir, settings.sync_channel
    return frozenset(local_repository(state, url, channel) for url in settings.remote_repositories)


def build_sync(
    settings: Settings,
    controller: ModelController,
    manager: ModelRepositoryManager,
    store: StateStore | None,
    registry: CollectorRegistry,
    observer: SyncObserver | None = None,
) -> RepositorySync:
    """``observer``: told the runs and rollbacks too, beside the sync's metrics (the alert rules)."""
    # Imported only when a repository is remote: a device that syncs nothing loads none of it.
    from edged.core.repository.probation import ProbationLimits
    from edged.core.sync_control import SyncObservers
    from edged.frontends.metrics.sync import SyncMetrics
    from edged.sync.agent import RepositorySync, SyncSettings
    from edged.sync.errors import SyncError
    from edged.sync.sources import ClientOptions

    assert settings.state_dir is not None
    options = SyncSettings(
        interval_s=settings.sync_interval_secs,
        max_rate=settings.sync_max_rate,
        trusted_root=settings.sync_trusted_root,
        channel=settings.sync_channel,
        device_id=settings.device_id,
        report_status=settings.sync_report_status,
        probation=ProbationLimits(
            window_s=settings.sync_probation_secs,
            max_error_rate=settings.sync_max_error_rate,
            sequence_wait_s=settings.sync_sequence_wait_secs,
        ),
        client=ClientOptions(read_timeout_s=settings.sync_timeout_secs),
    )
    try:
        return RepositorySync(
            list(settings.remote_repositories),
            settings.state_dir,
            options,
            controller,
            manager,
            store,
            SyncObservers(SyncMetrics(registry), observer) if observer is not None else SyncMetrics(registry),
            os.environ,
        )
    except SyncError as exc:
        raise StartupError(str(exc)) from None


class SyncPart:
    name = "sync"

    def __init__(self, sync: RepositorySync) -> None:
        self._sync = sync

    async def start(self) -> None:
        await self._sync.start()

    def stopping(self) -> None:
        self._sync.stopping()

    async def stop(self) -> None:
        await self._sync.stop()
