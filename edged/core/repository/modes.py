"""The terms model control (control.py) works in: the mode (Triton's ``--model-control-mode``), its options, and
who asked for a change (the origin every history event records)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path


class ControlMode(enum.StrEnum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


class Origin(enum.StrEnum):
    """Who asked for a change, as the history records it."""

    STARTUP = "startup"
    POLL = "poll"
    API = "api"
    UPLOAD = "upload"
    SYNC = "sync"
    # edged's own verdict on an upload's probation (the removal of one that failed it): nobody asked.
    PROBATION = "probation"


@dataclass(frozen=True, slots=True)
class ControlOptions:
    mode: ControlMode = ControlMode.NONE
    poll_secs: float = 15.0
    # --load-model values (explicit mode); "*" loads every model.
    startup_models: tuple[str, ...] = ()
    load_thread_count: int = 4
    # How long an unload request waits for in-flight requests before it answers (they still finish afterwards).
    unload_timeout_s: float = 30.0
    state_dir: Path | None = None
