"""Alerts as a part of the daemon: started right after the core, so that what happens while the models load (a
model that fails at start) is delivered as soon as the daemon can, and stopped after everything else."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edged.core.repository.manager import ModelState

if TYPE_CHECKING:
    from edged.core.alerts.engine import Alerts
    from edged.core.repository.manager import ModelRepositoryManager


class AlertsPart:
    name = "alerts"

    def __init__(self, alerts: Alerts) -> None:
        self._alerts = alerts

    async def start(self) -> None:
        await self._alerts.start()

    def stopping(self) -> None:
        pass

    async def stop(self) -> None:
        await self._alerts.stop()


def unready_models(manager: ModelRepositoryManager) -> list[str]:
    """What keeps a device unready under strict readiness: each model that should serve and does not, with why."""
    found: list[str] = []
    for name in manager.names():
        entry = manager.entry(name)
        if entry is not None and entry.wanted and entry.state is not ModelState.READY:
            reason = entry.reason or next((v.reason for v in entry.versions.values() if v.reason), "")
            found.append(f"model '{name}' is {entry.state.value}" + (f" ({reason})" if reason else ""))
    return found
