"""The base of the state store's records by topic (edged.state.accounts, edged.state.sync_runs): the one thing they
need of the store, a session. The store is the only place that opens one, so SQL stays in edged.state."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


class StateError(Exception):
    """A state database that cannot be used; the message is one clear line for the operator."""


class Records:
    """Mixed into edged.state.store.StateStore, which provides ``_session`` and ``_history_per_model``."""

    _history_per_model: int

    def _session(self, *, write: bool) -> AbstractContextManager[Session]:
        """A session; ``write``: in a write transaction, committed at the end."""
        raise NotImplementedError
