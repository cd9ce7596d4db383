"""The daemon's persistent state: models and versions seen, every state transition, the desired set.

Only ``store.py`` issues SQL; everything else calls ``StateStore``'s typed methods.
"""

from __future__ import annotations

from edged.state.directory import default_state_dir
from edged.state.store import HistoryEvent, SeenVersion, StateError, StateStore

__all__ = ["HistoryEvent", "SeenVersion", "StateError", "StateStore", "default_state_dir"]
