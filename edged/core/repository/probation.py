"""A new version on probation: after a sync switched to a new revision (``apply``: reload the models it changed,
watch them, and the sync rolls back, model by model, the ones that fail to their last known good files), and after
an upload activated a new version (``watch``; the upload is removed again when it fails).

A model passes when it reached READY (its ``model_warmup`` runs as part of the load) and, for the whole window,
stays ready, has no instance process die, and fails at most ``max_error_rate`` of its requests (judged once it
served ``min_requests``). A model that fails is served again from the last known good snapshot, and the remote
revision is marked bad so that no later run takes it again; only a newer revision is tried.

A probation judges the version it started with, as nobody touched it: a deliberate change to the model meanwhile (an
operator's unload, a load, an activation, another upload) ends it unjudged (``ended``), since a model an operator
unloaded is "not ready" by request, not by failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from edged.core.repository.manager import VersionHealth

if TYPE_CHECKING:
    from edged.core.repository.control import ModelController
    from edged.core.repository.manager import ModelHealth, ModelRepositoryManager

log = logging.getLogger(__name__)

POLL_S: Final = 0.25


@dataclass(frozen=True)
class ProbationLimits:
    window_s: float = 60.0
    max_error_rate: float = 0.1
    min_requests: int = 10
    # How long a changed model with live sequences is left serving its old revision before it is swapped anyway.
    sequence_wait_s: float = 60.0


async def wait_for_sequences(manager: ModelRepositoryManager, names: Iterable[str], wait_s: float) -> None:
    """Wait (up to ``wait_s``) until none of ``names`` has a live sequence: a sequence keeps its state in the
    version serving it, so swapping the version would cut it."""
    deadline = time.monotonic() + wait_s
    pending = {name for name in names if manager.health(name).live_sequences}
    if pending:
        log.info("waiting up to %.0f s for the live sequences of %s to end", wait_s, ", ".join(sorted(pending)))
    while pending and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        pending = {name for name in pending if manager.health(name).live_sequences}
    if pending:
        log.warning("swapping %s with sequences still live: the wait ran out", ", ".join(sorted(pending)))


async def apply(
    controller: ModelController, manager: ModelRepositoryManager, names: set[str], limits: ProbationLimits
) -> dict[str, str]:
    """Reload ``names`` and hold their probation; returns the models that failed, with why (empty: all passed)."""
    await wait_for_sequences(manager, names, limits.sequence_wait_s)
    # Read before the reload: what a new version does from its first moment counts, a crash included.
    baseline = {name: manager.health(name) for name in names}
    outcomes = await controller.refresh(names)
    failed = {name: f"did not load: {reason}" for name, reason in outcomes.items() if reason is not None}
    # Models the revision removed were unloaded (no longer wanted): nothing of theirs to watch.
    watched = []
    for name, reason in sorted(outcomes.items()):
        entry = manager.entry(name)
        if reason is None and entry is not None and entry.wanted:
            watched.append(name)
    if watched:
        log.info("probation of %s for %.0f s", ", ".join(watched), limits.window_s)
        failed |= await watch(manager, watched, limits, baseline)
    return failed


def _never(_name: str) -> str | None:
    return None


async def watch(
    manager: ModelRepositoryManager,
    names: list[str],
    limits: ProbationLimits,
    baseline: dict[str, ModelHealth],
    ended: Callable[[str], str | None] = _never,
) -> dict[str, str]:
    """Watch ``names`` for ``limits.window_s``, against their ``baseline``; returns the ones that failed, with why.
    A model for which ``ended`` gives a reason leaves the watch unjudged. It is asked right before the model's health
    is read, with no await between: a control action changes the model and what ``ended`` reads in one step of the
    event loop, so a probation never sees the one without the other."""
    failed: dict[str, str] = {}
    watched = list(names)
    deadline = time.monotonic() + limits.window_s
    while True:
        for name in list(watched):
            why = ended(name)
            if why is not None:
                log.info("the probation of model '%s' ended unjudged: %s", name, why)
                watched.remove(name)
                continue
            problem = _problem(baseline[name], manager.health(name), limits)
            if problem is not None:
                log.error("model '%s' failed its probation: %s", name, problem)
                failed[name] = problem
                watched.remove(name)
        if not watched or time.monotonic() >= deadline:
            return failed
        await asyncio.sleep(POLL_S)


def _problem(before: ModelHealth, now: ModelHealth, limits: ProbationLimits) -> str | None:
    zero = VersionHealth(0, 0, 0)
    crashes = failed = succeeded = 0
    for key, counts in now.versions.items():
        then = before.versions.get(key, zero)
        crashes += counts.crashes - then.crashes
        failed += counts.failed - then.failed
        succeeded += counts.succeeded - then.succeeded
    # Crashes first: a process that died also leaves the model not ready while it restarts.
    if crashes > 0:
        return f"{crashes} instance process(es) died"
    if not now.ready:
        return "it is not ready"
    total = failed + succeeded
    if total >= limits.min_requests and failed > limits.max_error_rate * total:
        return f"{failed} of {total} requests failed (more than {limits.max_error_rate:.0%})"
    return None
