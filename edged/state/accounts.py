"""The state database's side of console accounts: users, their login sessions and failed logins (table models
in edged.state.schema; the policy is edged.core.accounts')."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select

from edged.state.records import Records, StateError
from edged.state.schema import LoginFailure, LoginSession, User

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


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


class AccountRecords(Records):
    """Users, sessions and failed logins; mixed into edged.state.store.StateStore."""

    def add_user(self, user: UserRecord, *, only_if_none: bool = False) -> UserRecord | None:
        """Stores a new user and returns it with its id; StateError if the name is taken. ``only_if_none``: only
        when there is no user yet, else None; checked inside the write transaction, so of two first-run setups
        (two browsers, or a browser and ``edged admin create``) exactly one makes the first user."""
        try:
            with self._session(write=True) as session:
                if only_if_none and session.scalar(select(func.count()).select_from(User)):
                    return None
                row = User(
                    name=user.name,
                    role=user.role,
                    password_hash=user.password_hash,
                    created_at=user.created_at,
                    password_changed_at=user.password_changed_at,
                    disabled_at=user.disabled_at,
                )
                session.add(row)
                session.flush()
                return _user(row)
        except StateError as error:
            if "UNIQUE constraint failed" in str(error):
                raise StateError(f"a user named '{user.name}' exists already") from None
            raise

    def users(self) -> list[UserRecord]:
        """Every user, disabled ones too, oldest first."""
        with self._session(write=False) as session:
            return [_user(row) for row in session.scalars(select(User).order_by(User.id))]

    def count_users(self) -> int:
        with self._session(write=False) as session:
            return session.scalar(select(func.count()).select_from(User)) or 0

    def find_user(self, name: str) -> UserRecord | None:
        with self._session(write=False) as session:
            row = session.scalar(select(User).where(User.name == name))
            return None if row is None else _user(row)

    def set_password(self, name: str, password_hash: str, at: datetime) -> int | None:
        """Replaces ``name``'s password hash and revokes every open session of the user, in one transaction;
        returns how many sessions were revoked, or None when there is no such user."""
        with self._session(write=True) as session:
            row = session.scalar(select(User).where(User.name == name))
            if row is None:
                return None
            row.password_hash, row.password_changed_at = password_hash, at
            return _revoke_sessions(session, row.id, at)

    def rehash_password(self, name: str, old_hash: str, new_hash: str) -> bool:
        """Replaces a hash made with older parameters by ``new_hash`` of the same password; nothing else changes.
        False when the hash is no longer ``old_hash`` (the password was changed meanwhile)."""
        with self._session(write=True) as session:
            row = session.scalar(select(User).where(User.name == name, User.password_hash == old_hash))
            if row is None:
                return False
            row.password_hash = new_hash
            return True

    def disable_user(self, name: str, at: datetime) -> int | None:
        """Disables ``name`` and revokes its open sessions; how many were revoked, None when there is no such user
        (a user disabled already stays disabled since the first time)."""
        with self._session(write=True) as session:
            row = session.scalar(select(User).where(User.name == name))
            if row is None:
                return None
            if row.disabled_at is None:
                row.disabled_at = at
            return _revoke_sessions(session, row.id, at)

    def add_session(self, record: SessionRecord) -> None:
        """Stores a new session of ``record.user``, and drops every session past its absolute expiry."""
        with self._session(write=True) as session:
            user_id = session.scalar(select(User.id).where(User.name == record.user))
            if user_id is None:
                raise StateError(f"no user named '{record.user}'")
            session.execute(delete(LoginSession).where(LoginSession.expires_at <= record.created_at))
            session.add(
                LoginSession(
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
        with self._session(write=False) as session:
            found = session.execute(
                select(LoginSession, User)
                .join(User, User.id == LoginSession.user_id)
                .where(LoginSession.id == session_id)
            ).first()
            if found is None:
                return None
            row, user = found
            return _login_session(row, user.name), _user(user)

    def touch_session(self, session_id: str, at: datetime) -> None:
        """Moves a session's last use to ``at``."""
        with self._session(write=True) as session:
            row = session.get(LoginSession, session_id)
            if row is not None:
                row.last_seen_at = max(row.last_seen_at, at)

    def revoke_session(self, session_id: str, at: datetime) -> bool:
        """Revokes one session; False when it is unknown or was revoked already."""
        with self._session(write=True) as session:
            row = session.get(LoginSession, session_id)
            if row is None or row.revoked_at is not None:
                return False
            row.revoked_at = at
            return True

    def add_login_failure(self, keys: list[str], at: datetime, keep_since: datetime) -> None:
        """Records a failed login under each key, dropping the keys' failures older than ``keep_since``."""
        with self._session(write=True) as session:
            session.execute(delete(LoginFailure).where(LoginFailure.key.in_(keys), LoginFailure.at < keep_since))
            session.add_all(LoginFailure(key=key, at=at) for key in keys)

    def login_failures(self, key: str, since: datetime) -> list[datetime]:
        """The times of ``key``'s failed logins since ``since``, oldest first."""
        with self._session(write=False) as session:
            return list(
                session.scalars(
                    select(LoginFailure.at)
                    .where(LoginFailure.key == key, LoginFailure.at >= since)
                    .order_by(LoginFailure.at)
                )
            )

    def clear_login_failures(self, key: str) -> None:
        with self._session(write=True) as session:
            session.execute(delete(LoginFailure).where(LoginFailure.key == key))


def _user(row: User) -> UserRecord:
    return UserRecord(
        row.name, row.role, row.password_hash, row.created_at, row.password_changed_at, row.disabled_at, row.id
    )


def _login_session(row: LoginSession, user: str) -> SessionRecord:
    return SessionRecord(
        row.id, user, row.csrf_key, row.peer, row.created_at, row.last_seen_at, row.expires_at, row.revoked_at
    )


def _revoke_sessions(session: Session, user_id: int, at: datetime) -> int:
    """Revokes every open session of one user inside the caller's transaction; how many."""
    rows = session.scalars(
        select(LoginSession).where(LoginSession.user_id == user_id, LoginSession.revoked_at.is_(None))
    ).all()
    for row in rows:
        row.revoked_at = at
    return len(rows)
