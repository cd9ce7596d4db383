"""The state database's side of console accounts: users, their login sessions and failed logins (tables in
edged.state.schema; the policy is edged.core.accounts')."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Final

from sqlalchemy import delete, func, insert, select, update

from edged.state import schema
from edged.state.records import Records, StateError, inserted_id

if TYPE_CHECKING:
    from sqlalchemy import Connection


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A console user as stored (``id`` 0 before it is stored). ``password_hash``: argon2id's PHC string."""

    name: str
    role: str
    password_hash: str
    created_at: datetime  # tz-aware, UTC
    password_changed_at: datetime
    disabled_at: datetime | None
    id: int = 0


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A console session as stored: ``id`` is the SHA-256 (hex) of the secret the browser holds, never the secret."""

    id: str
    user: str  # the user's name
    csrf_key: str  # hex; keys the HMAC that makes this session's CSRF token
    peer: str | None  # the client address it was opened from
    created_at: datetime  # tz-aware, UTC
    last_seen_at: datetime
    expires_at: datetime  # the absolute end
    revoked_at: datetime | None


# The tables by other names: the records' methods users() and login_failures() have theirs.
_USERS: Final = schema.users
_SESSIONS: Final = schema.login_sessions
_FAILURES: Final = schema.login_failures
# A user's columns and a session's, named as UserRecord's fields and in the order of SessionRecord's.
_USER: Final = (
    _USERS.c.name,
    _USERS.c.role,
    _USERS.c.password_hash,
    _USERS.c.created_at,
    _USERS.c.password_changed_at,
    _USERS.c.disabled_at,
    _USERS.c.id,
)
_SESSION: Final = (
    _SESSIONS.c.id,
    _USERS.c.name,
    _SESSIONS.c.csrf_key,
    _SESSIONS.c.peer,
    _SESSIONS.c.created_at,
    _SESSIONS.c.last_seen_at,
    _SESSIONS.c.expires_at,
    _SESSIONS.c.revoked_at,
)


class AccountRecords(Records):
    """Users, sessions and failed logins; mixed into edged.state.store.StateStore."""

    def add_user(self, user: UserRecord, *, only_if_none: bool = False) -> UserRecord | None:
        """Stores a new user and returns it with its id; StateError if the name is taken. ``only_if_none``: only
        when there is no user yet, else None; checked inside the write transaction, so of two first-run setups
        (two browsers, or a browser and ``edged admin create``) exactly one makes the first user."""
        try:
            with self._transaction(write=True) as connection:
                if only_if_none and connection.scalar(select(func.count()).select_from(_USERS)):
                    return None
                added = connection.execute(
                    insert(_USERS).values(
                        name=user.name,
                        role=user.role,
                        password_hash=user.password_hash,
                        created_at=user.created_at,
                        password_changed_at=user.password_changed_at,
                        disabled_at=user.disabled_at,
                    )
                )
                return replace(user, id=inserted_id(added))
        except StateError as error:
            if "UNIQUE constraint failed" in str(error):
                raise StateError(f"a user named '{user.name}' exists already") from None
            raise

    def users(self) -> list[UserRecord]:
        """Every user, disabled ones too, oldest first."""
        with self._transaction(write=False) as connection:
            return [UserRecord(**row) for row in connection.execute(select(*_USER).order_by(_USERS.c.id)).mappings()]

    def count_users(self) -> int:
        with self._transaction(write=False) as connection:
            return connection.scalar(select(func.count()).select_from(_USERS)) or 0

    def find_user(self, name: str) -> UserRecord | None:
        with self._transaction(write=False) as connection:
            row = connection.execute(select(*_USER).where(_USERS.c.name == name)).mappings().first()
            return None if row is None else UserRecord(**row)

    def set_password(self, name: str, password_hash: str, at: datetime) -> int | None:
        """Replaces ``name``'s password hash and revokes every open session of the user, in one transaction;
        returns how many sessions were revoked, or None when there is no such user."""
        with self._transaction(write=True) as connection:
            user_id = connection.scalar(select(_USERS.c.id).where(_USERS.c.name == name))
            if user_id is None:
                return None
            connection.execute(
                update(_USERS).where(_USERS.c.id == user_id).values(password_hash=password_hash, password_changed_at=at)
            )
            return _revoke_sessions(connection, user_id, at)

    def rehash_password(self, name: str, old_hash: str, new_hash: str) -> bool:
        """Replaces a hash made with older parameters by ``new_hash`` of the same password; nothing else changes.
        False when the hash is no longer ``old_hash`` (the password was changed meanwhile)."""
        with self._transaction(write=True) as connection:
            changed = connection.execute(
                update(_USERS)
                .where(_USERS.c.name == name, _USERS.c.password_hash == old_hash)
                .values(password_hash=new_hash)
            )
            return changed.rowcount > 0

    def disable_user(self, name: str, at: datetime) -> int | None:
        """Disables ``name`` and revokes its open sessions; how many were revoked, None when there is no such user
        (a user disabled already stays disabled since the first time)."""
        with self._transaction(write=True) as connection:
            user_id = connection.scalar(select(_USERS.c.id).where(_USERS.c.name == name))
            if user_id is None:
                return None
            connection.execute(
                update(_USERS).where(_USERS.c.id == user_id, _USERS.c.disabled_at.is_(None)).values(disabled_at=at)
            )
            return _revoke_sessions(connection, user_id, at)

    def add_session(self, record: SessionRecord) -> None:
        """Stores a new session of ``record.user``, and drops every session past its absolute expiry."""
        with self._transaction(write=True) as connection:
            user_id = connection.scalar(select(_USERS.c.id).where(_USERS.c.name == record.user))
            if user_id is None:
                raise StateError(f"no user named '{record.user}'")
            connection.execute(delete(_SESSIONS).where(_SESSIONS.c.expires_at <= record.created_at))
            connection.execute(
                insert(_SESSIONS).values(
                    id=record.id,
                    user_id=user_id,
                    csrf_key=record.csrf_key,
                    peer=record.peer,
                    created_at=record.created_at,
                    last_seen_at=record.last_seen_at,
                    expires_at=record.expires_at,
                    revoked_at=record.revoked_at,
                )
            )

    def find_session(self, session_id: str) -> tuple[SessionRecord, UserRecord] | None:
        """A session by its id (the SHA-256 of its secret), with its user; expired and revoked ones too."""
        with self._transaction(write=False) as connection:
            found = connection.execute(
                select(*_SESSION, *_USER)
                .join_from(_SESSIONS, _USERS, _USERS.c.id == _SESSIONS.c.user_id)
                .where(_SESSIONS.c.id == session_id)
            ).first()
            if found is None:
                return None
            # Positions, not names: both tables have an id, a created_at ...
            return SessionRecord(*found[: len(_SESSION)]), UserRecord(*found[len(_SESSION) :])

    def touch_session(self, session_id: str, at: datetime) -> None:
        """Moves a session's last use to ``at``; never back."""
        with self._transaction(write=True) as connection:
            connection.execute(
                update(_SESSIONS)
                .where(_SESSIONS.c.id == session_id, _SESSIONS.c.last_seen_at < at)
                .values(last_seen_at=at)
            )

    def revoke_session(self, session_id: str, at: datetime) -> bool:
        """Revokes one session; False when it is unknown or was revoked already."""
        with self._transaction(write=True) as connection:
            revoked = connection.execute(
                update(_SESSIONS)
                .where(_SESSIONS.c.id == session_id, _SESSIONS.c.revoked_at.is_(None))
                .values(revoked_at=at)
            )
            return revoked.rowcount > 0

    def add_login_failure(self, keys: list[str], at: datetime, keep_since: datetime, max_rows: int) -> None:
        """Records a failed login under each key, dropping every failure older than ``keep_since`` and then, past
        ``max_rows`` rows, the oldest: the table is bounded whatever clients send."""
        with self._transaction(write=True) as connection:
            connection.execute(delete(_FAILURES).where(_FAILURES.c.at < keep_since))
            if keys:  # an executemany of no rows is an error
                connection.execute(insert(_FAILURES), [{"key": key, "at": at} for key in keys])
            surplus = (connection.scalar(select(func.count()).select_from(_FAILURES)) or 0) - max_rows
            if surplus > 0:
                oldest = select(_FAILURES.c.id).order_by(_FAILURES.c.id).limit(surplus)
                connection.execute(delete(_FAILURES).where(_FAILURES.c.id.in_(oldest)))

    def login_failures(self, key: str, since: datetime) -> list[datetime]:
        """The times of ``key``'s failed logins since ``since``, oldest first."""
        with self._transaction(write=False) as connection:
            return list(
                connection.scalars(
                    select(_FAILURES.c.at)
                    .where(_FAILURES.c.key == key, _FAILURES.c.at >= since)
                    .order_by(_FAILURES.c.at)
                )
            )

    def clear_login_failures(self, key: str) -> None:
        with self._transaction(write=True) as connection:
            connection.execute(delete(_FAILURES).where(_FAILURES.c.key == key))


def _revoke_sessions(connection: Connection, user_id: int, at: datetime) -> int:
    """Revokes every open session of one user inside the caller's transaction; how many."""
    revoked = connection.execute(
        update(_SESSIONS).where(_SESSIONS.c.user_id == user_id, _SESSIONS.c.revoked_at.is_(None)).values(revoked_at=at)
    )
    return revoked.rowcount
