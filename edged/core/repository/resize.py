"""Changing a serving version's instance counts in place: the backend adds and removes instances, the scheduler
takes the new ones and lets the old ones finish what they hold, and the version goes on serving (no reload; its
statistics go on). Model control calls it for the versions plan_versions (plan.py) marks ``resize``."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from edged.errors import EdgedError

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from edged.core.backend_api import LoadContext
    from edged.core.repository.manager import ModelVersion
    from edged.proto.model_config_pb2 import ModelConfig

log = logging.getLogger("edged.core.repository.control")


async def resize_in_place(
    version: ModelVersion, config: ModelConfig, context: LoadContext, pool: Executor
) -> tuple[str, float] | None:
    """The instances of ``version`` made as ``config`` counts them (``context``: what the backend loads new ones
    with; ``pool``: where it does). ``(counts, seconds)`` for the history, or None when the backend could not,
    and the version is then reloaded beside instead."""
    loop = asyncio.get_running_loop()
    model, scheduler = version.backend_model, version.scheduler
    assert model is not None and scheduler is not None
    started = time.monotonic()
    try:
        added, removed = await loop.run_in_executor(pool, model.resize, config, context)  # type: ignore[attr-defined]
    except EdgedError as exc:
        log.error("changing the instances of '%s' version %d failed: %s", version.name, version.version, exc)
        return None
    scheduler.add_instances(added)  # type: ignore[attr-defined]
    await scheduler.remove_instances(removed)  # type: ignore[attr-defined]
    await loop.run_in_executor(pool, model.finish_resize)  # type: ignore[attr-defined]
    version.config = config
    counts = ", ".join(f"{g.name}: {g.count}" for g in config.instance_group)
    log.info("model '%s' version %d now has instances %s", version.name, version.version, counts)
    return counts, time.monotonic() - started
