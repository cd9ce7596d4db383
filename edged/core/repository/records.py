"""Model control's side of the state database: every transition, the versions seen, explicit mode's desired set.

All of it goes through one thread of its own, in order, so the event loop never waits for the disk. History is
queued without waiting (a failed write is logged, never raised); changes to the desired set are awaited and a
failed one fails the request, because an acknowledged load or unload must survive a crash; ``written`` waits for
everything queued so far, so that an action's history is committed before the action is reported finished.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from edged.state.store import HistoryEvent, StateStore

log = logging.getLogger("edged.core.repository.control")


class ControlRecords:
    """The state database as model control uses it; without a store (no state directory) every call does nothing."""

    def __init__(self, store: StateStore | None) -> None:
        self._store = store
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edged-state")
        # Told every history event as it is recorded (the alert rules): (model, version, state, source, reason).
        self._observers: list[Callable[[str, int | None, str, str, str], None]] = []

    def observe(self, observer: Callable[[str, int | None, str, str, str], None]) -> None:
        """Calls ``observer`` with each history event from now on, on the event loop: it must not block."""
        self._observers.append(observer)

    @property
    def enabled(self) -> bool:
        return self._store is not None

    # --- queued ---------------------------------------------------------------------------------------------

    def transition(
        self,
        name: str,
        version: int | None,
        state: str,
        origin: str,
        reason: str,
        duration_s: float | None,
        actor: str | None = None,
    ) -> None:
        if self._store is not None:
            self._queue(self._store.transition, name, version, state, origin, reason, duration_s, actor)
        for observer in self._observers:
            try:
                observer(name, version, state, origin, reason)
            except Exception:
                # An observer's fault never fails the load or unload that made the event.
                log.exception("an observer of model '%s''s history failed", name)

    def seen(self, name: str, path: str, version: int, digest: str, size: int) -> None:
        if self._store is not None:
            self._queue(self._store.model_seen, name, path, version, digest, size)

    # --- awaited --------------------------------------------------------------------------------------------

    async def desired(self) -> dict[str, list[int] | None]:
        if self._store is None:
            return {}
        result: dict[str, list[int] | None] = await self._run(self._store.desired)
        return result

    async def set_desired(self, name: str, versions: list[int] | None = None) -> None:
        """``versions``: those an activation pinned; None: what the model's version policy selects."""
        if self._store is not None:
            store = self._store
            await self._durably(lambda: store.set_desired(name, versions), name, "loaded")

    async def remove_desired(self, name: str) -> None:
        if self._store is not None:
            store = self._store
            await self._durably(lambda: store.remove_desired(name), name, "unloaded")

    async def written(self) -> None:
        """Wait for every write queued so far (the thread runs them in order)."""
        if self._store is not None:
            await self._run(lambda: None)

    async def history(self, name: str | None, offset: int, limit: int) -> tuple[list[HistoryEvent], int]:
        if self._store is None:
            return [], 0
        store = self._store
        result: tuple[list[HistoryEvent], int] = await self._run(
            lambda: store.history(name, offset=offset, limit=limit)
        )
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._store is not None:
            self._store.close()

    # --- the thread -----------------------------------------------------------------------------------------

    async def _durably(self, call: Callable[[], Any], name: str, done: str) -> None:
        try:
            await self._run(call)
        except Exception as exc:
            log.error("recording that model '%s' was %s failed: %s", name, done, exc)
            raise EdgedError(
                ErrorCode.INTERNAL,
                f"model '{name}' was {done}, but the state database could not record it, so a restart would not "
                "keep it so",
            ) from None

    def _queue(self, call: Callable[..., Any], *args: Any) -> None:
        self._pool.submit(call, *args).add_done_callback(_log_failure)

    async def _run(self, call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)


def _log_failure(future: Future[Any]) -> None:
    exc = future.exception()
    if exc is not None:
        log.error("writing the state database failed: %s", exc)
