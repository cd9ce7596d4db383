"""The state database's tables as SQLAlchemy 2 typed ORM models.

A change here needs a new revision in ``migrations/versions/``; ``tests/unit/test_state_store.py`` fails when the
models and the migrations disagree.

Timestamps are stored as naive UTC (SQLite has no time zone type) and come back tz-aware in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, Index, MetaData, String, Text, TypeDecorator
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

# Named constraints, so that a later migration can alter them (SQLite's batch mode rebuilds tables by name).
NAMING_CONVENTION: Final = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A tz-aware datetime stored as naive UTC; a naive value is a programming error, refused."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} given; state timestamps must be tz-aware")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Model(Base):
    """One row per model name ever seen, loaded or asked for; never deleted, so its history stays."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)


class ModelVersion(Base):
    """A version found in the repository: where, what its files hash to, how big, when first and last seen."""

    __tablename__ = "model_versions"
    __table_args__ = (CheckConstraint("size >= 0", name="size_not_negative"),)

    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    checksum: Mapped[str] = mapped_column(String)
    size: Mapped[int]
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime)


class Transition(Base):
    """One state change of a model (``version`` NULL) or of one of its versions.

    ``previous`` is copied from the latest row for the same model and version when the row is written, so that
    reading history never has to look back. ``id`` orders the rows: the clock may step back, the ids do not.
    """

    __tablename__ = "transitions"
    __table_args__ = (
        CheckConstraint("duration_s IS NULL OR duration_s >= 0", name="duration_not_negative"),
        # history(name): newest first within one model.
        Index("ix_transitions_model_id_id", "model_id", "id"),
        # transition(): the latest state of one model and version.
        Index("ix_transitions_model_id_version_id", "model_id", "version", "id"),
        # The history (edged.state.audit): every model's events newest first, merged with the audit events'.
        Index("ix_transitions_at", "at"),
        # AUTOINCREMENT: an id is never reused, so a client paging through history never sees one twice.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int | None]
    state: Mapped[str] = mapped_column(String)
    previous: Mapped[str | None] = mapped_column(String)
    source: Mapped[str] = mapped_column(String)
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    duration_s: Mapped[float | None]
    # Who asked, for the changes a request caused: "token:<name>", "loopback", "restricted-header", "anonymous";
    # NULL for the daemon's own (start-up, poll, reload).
    actor: Mapped[str | None] = mapped_column(String)


class ApiToken(Base):
    """An API token: its public id (the part of the token a lookup uses), a unique name, a role, and the SHA-256
    of its secret; the secret itself is shown once, when it is made, and never stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_id: Mapped[str] = mapped_column(String, unique=True)
    name: Mapped[str] = mapped_column(String, unique=True)
    role: Mapped[str] = mapped_column(String)
    secret_sha256: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class DesiredModel(Base):
    """A model explicit mode should have loaded. ``by_policy``: the versions its version policy picks."""

    __tablename__ = "desired_models"

    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    by_policy: Mapped[bool]
    set_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DesiredVersion(Base):
    """One version of a desired model that was asked for by number (only when ``by_policy`` is false)."""

    __tablename__ = "desired_versions"

    model_id: Mapped[int] = mapped_column(ForeignKey("desired_models.model_id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(primary_key=True)


class SyncRun(Base):
    """One run of a repository sync: what it found and did, or why it failed. ``outcome``: updated, unchanged,
    held-back (the remote's revision failed its probation before), failed, rolled-back (a model failed its
    probation), committed (the revision passed its probation)."""

    __tablename__ = "sync_runs"
    __table_args__ = (
        CheckConstraint("bytes >= 0", name="bytes_not_negative"),
        Index("ix_sync_runs_source_id", "source", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    source: Mapped[str] = mapped_column(String)
    outcome: Mapped[str] = mapped_column(String)
    revision: Mapped[str | None] = mapped_column(String)
    previous: Mapped[str | None] = mapped_column(String)
    files: Mapped[int]
    bytes: Mapped[int]
    problem: Mapped[str | None] = mapped_column(String)
    message: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    duration_s: Mapped[float | None]


class SyncVerdict(Base):
    """What a probation decided of a remote revision: good (the last known good one to fall back to) or bad
    (never taken again; only a newer revision is)."""

    __tablename__ = "sync_verdicts"

    source: Mapped[str] = mapped_column(String, primary_key=True)
    revision: Mapped[str] = mapped_column(String, primary_key=True)
    verdict: Mapped[str] = mapped_column(String)
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime)


class User(Base):
    """A console user: a unique name, a role (viewer, operator, admin, as API tokens have), and the argon2id hash
    of the password (the PHC string, parameters included, so a hash made with older parameters still verifies).
    ``disabled_at``: the user may no longer log in; the row stays, so that the history's names keep meaning."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)
    role: Mapped[str] = mapped_column(String)
    password_hash: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    password_changed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class LoginSession(Base):
    """A console session. ``id`` is the SHA-256 of the session secret the browser holds in its cookie: the secret
    itself is never stored. ``csrf_key`` keys the HMAC that makes the session's CSRF token. A session ends at
    ``expires_at`` (absolute), after an idle time past ``last_seen_at``, or when revoked (logout, a password change,
    the user disabled)."""

    __tablename__ = "sessions"
    __table_args__ = (Index("ix_sessions_user_id", "user_id"),)

    id: Mapped[str] = mapped_column(String, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    csrf_key: Mapped[str] = mapped_column(String)
    peer: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class LoginFailure(Base):
    """One failed login, under each key it counts against: ``user:<name>`` and ``address:<client address>``.
    Kept only for the throttling window; older rows of a key go when it fails again."""

    __tablename__ = "login_failures"
    __table_args__ = (Index("ix_login_failures_key_at", "key", "at"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String)
    at: Mapped[datetime] = mapped_column(UTCDateTime)


class AuditEvent(Base):
    """One action a person or a script took through the console, the API or the command line (log in, make a
    user, set a password, ...): ``actor`` did ``action`` to ``target`` from ``peer``, through ``source``, and it
    ended ``outcome`` (done or refused; ``detail`` says why). Model state changes stay in ``transitions``; the
    history reads both."""

    __tablename__ = "audit_events"
    __table_args__ = (
        CheckConstraint("outcome IN ('done', 'refused')", name="outcome_known"),
        # The history newest first: SQLite merges this index's order with ix_transitions_at's.
        Index("ix_audit_events_at", "at"),
        # AUTOINCREMENT: an id is never reused, so a client paging through history never sees one twice.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    actor: Mapped[str] = mapped_column(String)
    action: Mapped[str] = mapped_column(String)
    target: Mapped[str] = mapped_column(String)
    outcome: Mapped[str] = mapped_column(String)
    detail: Mapped[str] = mapped_column(Text)
    peer: Mapped[str | None] = mapped_column(String)
    source: Mapped[str] = mapped_column(String)
