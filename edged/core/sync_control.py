"""What the frontends may ask of repository sync (status, a run now, pause, resume, its history): the sync
implements it, the daemon hands it to the service, and the frontends never import the sync itself."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol


class SyncControl(Protocol):
    @property
    def paused(self) -> bool: ...

    def status(self) -> dict[str, Any]:
        """Every source's state as JSON-ready values: revision, phase, progress, last run, last error."""
        ...

    async def run_now(self) -> list[dict[str, Any]]:
        """Sync every source now; one run record (JSON-ready) per source."""
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    async def history(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """A page of sync runs, newest first, and how many there are."""
        ...


class SyncObserver(Protocol):
    """Told what repository sync does, for its metrics: the metrics endpoint implements it, the daemon hands it to
    the sync (which serves nothing itself)."""

    def run(self, source: str, outcome: str, problem: str | None, transferred: int, seconds: float) -> None:
        """A run ended: ``outcome`` updated, unchanged, held-back or failed (``problem`` says why)."""
        ...

    def revision(self, source: str, revision: str) -> None:
        """``source`` serves ``revision`` now."""
        ...

    def rollback(self, source: str, model: str, revision: str, why: str) -> None:
        """``model`` of ``revision`` was kept at its last good files: ``why`` says how it failed ("failed its
        probation: ..." or "was refused before the switch: ...")."""
        ...


class SyncObservers:
    """Several observers told the same (the metrics and the alert rules); one that fails does not stop the rest
    nor the sync."""

    def __init__(self, *observers: SyncObserver) -> None:
        self._observers = observers

    def run(self, source: str, outcome: str, problem: str | None, transferred: int, seconds: float) -> None:
        for observer in self._observers:
            _guarded(observer.run, source, outcome, problem, transferred, seconds)

    def revision(self, source: str, revision: str) -> None:
        for observer in self._observers:
            _guarded(observer.revision, source, revision)

    def rollback(self, source: str, model: str, revision: str, why: str) -> None:
        for observer in self._observers:
            _guarded(observer.rollback, source, model, revision, why)


def _guarded(call: Callable[..., None], *args: Any) -> None:
    try:
        call(*args)
    except Exception:
        logging.getLogger("edged.sync").exception("an observer of the sync failed")
