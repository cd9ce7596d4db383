"""What the frontends may ask of repository sync (status, a run now, pause, resume, its history): the sync
implements it, the daemon hands it to the service, and the frontends never import the sync itself."""

from __future__ import annotations

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
