"""Retiring a version: it stops taking requests at once, answers those it has (never interrupted), then unloads on
the load pool; each step is recorded. Model control retires the version a reload replaces and those an unload ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from edged.core.repository.manager import ModelState
from edged.core.scheduling.rate_limiter import RATE_LIMITER

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from edged.core.repository.manager import ModelVersion
    from edged.core.repository.modes import Origin

log = logging.getLogger(__name__)


class Transition(Protocol):
    """Records one step of a model's life (edged.core.repository.control.ModelController._transition)."""

    def __call__(
        self,
        name: str,
        version: int | None,
        state: str,
        origin: Origin,
        reason: str = "",
        *,
        duration_s: float | None = None,
    ) -> None: ...


class Retirements:
    """The versions being retired, so that stopping can wait for them."""

    def __init__(self, load_pool: Executor, transition: Transition) -> None:
        self._load_pool = load_pool
        self._transition = transition
        self._tasks: set[asyncio.Task[None]] = set()

    def retire(self, version: ModelVersion, origin: Origin) -> asyncio.Task[None]:
        """Stop routing requests to ``version`` now; unload it once those it has are answered."""
        version.state = ModelState.UNLOADING
        self._transition(version.name, version.version, ModelState.UNLOADING.value, origin)
        task = asyncio.get_running_loop().create_task(self._unload_when_idle(version, origin))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self) -> None:
        """Until every retirement in progress has ended."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _unload_when_idle(self, version: ModelVersion, origin: Origin) -> None:
        started = time.monotonic()
        if version.scheduler is not None:
            await version.scheduler.drain()
        backend_model, version.backend_model, version.scheduler = version.backend_model, None, None
        RATE_LIMITER.forget(backend_model)
        if backend_model is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self._load_pool, backend_model.unload)
            except Exception:
                log.exception("unloading '%s' version %d failed", version.name, version.version)
        version.state, version.reason = ModelState.UNAVAILABLE, "unloaded"
        log.info("model '%s' version %d unloaded", version.name, version.version)
        self._transition(
            version.name, version.version, "UNLOADED", origin, "unloaded", duration_s=time.monotonic() - started
        )
