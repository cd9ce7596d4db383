"""The base of the state store's records by topic (edged.state.accounts, edged.state.sync_runs): the one thing they
need of the store, a transaction. The store is the only place that opens one, so SQL stays in edged.state."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy import Connection, CursorResult


class StateError(Exception):
    """A state database that cannot be used; the message is one clear line for the operator."""


class Records:
    """Mixed into edged.state.store.StateStore, which provides ``_transaction`` and ``_history_per_model``."""

    _history_per_model: int

    def _transaction(self, *, write: bool) -> AbstractContextManager[Connection]:
        """A connection inside one transaction, committed at the end; ``write``: a write transaction."""
        raise NotImplementedError


def inserted_id(result: CursorResult[Any]) -> int:
    """The integer primary key SQLite gave the row that an INSERT of one row just wrote."""
    key = result.inserted_primary_key
    row_id = None if key is None else key[0]
    if not isinstance(row_id, int):
        raise StateError(f"the database assigned no id to the new row (got {row_id!r})")
    return row_id
