"""Triton's trace extension on both wires: read and update the global trace setting or one model's.

Each wire turns its request into a map of setting names to their values as text (None: clear, so the model follows
the global setting again); the checks, errors and reply are Triton's, shared here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from edged.core.access import ACTOR
from edged.core.tracing import level_names, new_setting
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from edged.core.service import InferenceService

log = logging.getLogger(__name__)


def trace_setting(
    service: InferenceService, model: str, update: Mapping[str, Sequence[str] | None] | None, http: bool
) -> dict[str, Any]:
    """The setting in force for ``model`` (the global one when empty), after applying ``update`` if given."""
    if model and not service.model_ready(model, -1):
        raise EdgedError(ErrorCode.INVALID_ARG, f"Request for unknown model : {model}")
    if update is not None:
        service.tracing.update(model, new_setting(update, http))
        if update:
            changes = ", ".join(f"{k}={v}" for k, v in update.items())
            log.info(
                "trace settings of %s changed over %s by %s: %s",
                f"model '{model}'" if model else "the server",
                "HTTP" if http else "gRPC",
                ACTOR.get() or "anonymous",
                changes,
            )
    values = service.tracing.setting(model)
    return {
        "trace_level": level_names(values.level),
        "trace_rate": str(values.rate),
        "trace_count": str(values.count),
        "log_frequency": str(values.log_frequency),
        "trace_file": values.file,
        "trace_mode": values.mode,
    }


def http_update(body: Mapping[str, Any]) -> dict[str, Sequence[str] | None]:
    """A POST body's settings, with Triton's errors for values of the wrong JSON type (500, as Triton answers)."""
    update: dict[str, Sequence[str] | None] = {}
    if "trace_file" in body:
        update["trace_file"] = None
        return update
    for name in ("trace_level", "trace_rate", "trace_count", "log_frequency"):
        if name not in body:
            continue
        value = body[name]
        if value is None:
            update[name] = None
        elif name == "trace_level":
            if not isinstance(value, list):
                raise EdgedError(ErrorCode.INTERNAL, "attempt to access JSON non-array as array")
            if not all(isinstance(item, str) for item in value):
                raise EdgedError(ErrorCode.INTERNAL, "attempt to access JSON non-string as string")
            update[name] = value
        elif isinstance(value, str):
            update[name] = [value]
        else:
            raise EdgedError(ErrorCode.INTERNAL, "attempt to access JSON non-string as string")
    return update
