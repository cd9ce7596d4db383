"""The state database's tables, as SQLAlchemy Core ``Table`` objects on one ``MetaData``.

Core only, no ORM: the store reads rows into its own frozen dataclasses, and importing ``sqlalchemy.orm`` (and
configuring its mappers) would cost every start several megabytes of memory for nothing it uses.

A change here needs a new revision in ``migrations/versions/``; ``tests/unit/test_state_store.py`` fails when the
tables and the migrations disagree. Every column is NOT NULL unless declared ``nullable=True``.

Timestamps are stored as naive UTC (SQLite has no time zone type) and come back tz-aware in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
)

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


def _required(name: str, kind: Any, *args: Any, **kwargs: Any) -> Column[Any]:
    """A NOT NULL column (nullable columns are declared with ``nullable=True`` explicitly)."""
    return Column(name, kind, *args, nullable=False, **kwargs)


metadata: Final = MetaData(naming_convention=NAMING_CONVENTION)

# One row per model name ever seen, loaded or asked for; never deleted, so its history stays.
models: Final = Table(
    "models",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("name", String, unique=True),
)

# A version found in the repository: where, what its files hash to, how big, when first and last seen.
model_versions: Final = Table(
    "model_versions",
    metadata,
    Column("model_id", Integer, ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
    Column("version", Integer, primary_key=True),
    _required("path", Text),
    _required("checksum", String),
    _required("size", Integer),
    _required("first_seen", UTCDateTime),
    _required("last_seen", UTCDateTime),
    CheckConstraint("size >= 0", name="size_not_negative"),
)

# One state change of a model (``version`` NULL) or of one of its versions. ``previous`` is copied from the latest
# row for the same model and version when the row is written, so that reading history never has to look back.
# ``id`` orders the rows: the clock may step back, the ids do not.
transitions: Final = Table(
    "transitions",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("model_id", Integer, ForeignKey("models.id", ondelete="CASCADE")),
    Column("version", Integer, nullable=True),
    _required("state", String),
    Column("previous", String, nullable=True),
    _required("source", String),
    _required("reason", Text),
    _required("at", UTCDateTime),
    Column("duration_s", Double, nullable=True),
    # Who asked, for the changes a request caused: "token:<name>", "loopback", "restricted-header", "anonymous";
    # NULL for the daemon's own (start-up, poll, reload).
    Column("actor", String, nullable=True),
    CheckConstraint("duration_s IS NULL OR duration_s >= 0", name="duration_not_negative"),
    # history(name): newest first within one model.
    Index("ix_transitions_model_id_id", "model_id", "id"),
    # transition(): the latest state of one model and version.
    Index("ix_transitions_model_id_version_id", "model_id", "version", "id"),
    # The history (edged.state.audit): every model's events newest first, merged with the audit events'.
    Index("ix_transitions_at", "at"),
    # AUTOINCREMENT: an id is never reused, so a client paging through history never sees one twice.
    sqlite_autoincrement=True,
)

# An API token: its public id (the part of the token a lookup uses), a unique name, a role, and the SHA-256 of its
# secret; the secret itself is shown once, when it is made, and never stored. And its last use.
api_tokens: Final = Table(
    "api_tokens",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("token_id", String, unique=True),
    _required("name", String, unique=True),
    _required("role", String),
    _required("secret_sha256", String),
    _required("created_at", UTCDateTime),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    # When and from which client address the token was last presented and valid, written at most once a minute
    # (edged.core.access.TOKEN_USE_WRITE_S); NULL while it has not been used.
    Column("last_used_at", UTCDateTime, nullable=True),
    Column("last_used_peer", String, nullable=True),
)

# A model explicit mode should have loaded. ``by_policy``: the versions its version policy picks.
desired_models: Final = Table(
    "desired_models",
    metadata,
    Column("model_id", Integer, ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
    _required("by_policy", Boolean),
    _required("set_at", UTCDateTime),
)

# One version of a desired model that was asked for by number (only when ``by_policy`` is false).
desired_versions: Final = Table(
    "desired_versions",
    metadata,
    Column("model_id", Integer, ForeignKey("desired_models.model_id", ondelete="CASCADE"), primary_key=True),
    Column("version", Integer, primary_key=True),
)

# One run of a repository sync: what it found and did, or why it failed. ``outcome``: updated, unchanged, held-back
# (the remote's revision failed its probation before), failed, rolled-back (a model failed its probation),
# committed (the revision passed its probation).
sync_runs: Final = Table(
    "sync_runs",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("source", String),
    _required("outcome", String),
    Column("revision", String, nullable=True),
    Column("previous", String, nullable=True),
    _required("files", Integer),
    _required("bytes", Integer),
    Column("problem", String, nullable=True),
    _required("message", Text),
    _required("at", UTCDateTime),
    Column("duration_s", Double, nullable=True),
    CheckConstraint("bytes >= 0", name="bytes_not_negative"),
    Index("ix_sync_runs_source_id", "source", "id"),
    sqlite_autoincrement=True,
)

# What a probation decided of a remote revision: good (the last known good one to fall back to) or bad (never
# taken again; only a newer revision is).
sync_verdicts: Final = Table(
    "sync_verdicts",
    metadata,
    Column("source", String, primary_key=True),
    Column("revision", String, primary_key=True),
    _required("verdict", String),
    _required("reason", Text),
    _required("at", UTCDateTime),
)

# A console user: a unique name, a role (viewer, operator, admin, as API tokens have), and the argon2id hash of the
# password (the PHC string, parameters included, so a hash made with older parameters still verifies).
# ``disabled_at``: the user may no longer log in; the row stays, so that the history's names keep meaning.
users: Final = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("name", String, unique=True),
    _required("role", String),
    _required("password_hash", String),
    _required("created_at", UTCDateTime),
    _required("password_changed_at", UTCDateTime),
    Column("disabled_at", UTCDateTime, nullable=True),
)

# A console session. ``id`` is the SHA-256 of the session secret the browser holds in its cookie: the secret itself
# is never stored. ``csrf_key`` keys the HMAC that makes the session's CSRF token. A session ends at ``expires_at``
# (absolute), after an idle time past ``last_seen_at``, or when revoked (logout, a password change, the user
# disabled).
login_sessions: Final = Table(
    "sessions",
    metadata,
    Column("id", String, primary_key=True),
    _required("user_id", Integer, ForeignKey("users.id", ondelete="CASCADE")),
    _required("csrf_key", String),
    Column("peer", String, nullable=True),
    _required("created_at", UTCDateTime),
    _required("last_seen_at", UTCDateTime),
    _required("expires_at", UTCDateTime),
    Column("revoked_at", UTCDateTime, nullable=True),
    Index("ix_sessions_user_id", "user_id"),
)

# One failed login, under each key it counts against: ``user:<name>`` and ``address:<client address>``. Kept only
# for the throttling window; older rows of a key go when it fails again.
login_failures: Final = Table(
    "login_failures",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("key", String),
    _required("at", UTCDateTime),
    Index("ix_login_failures_key_at", "key", "at"),
    sqlite_autoincrement=True,
)

# One action a person or a script took through the console, the API or the command line (log in, make a user, set a
# password, ...): ``actor`` did ``action`` to ``target`` from ``peer``, through ``source``, and it ended ``outcome``
# (done or refused; ``detail`` says why). Model state changes stay in ``transitions``; the history reads both.
audit_events: Final = Table(
    "audit_events",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("at", UTCDateTime),
    _required("actor", String),
    _required("action", String),
    _required("target", String),
    _required("outcome", String),
    _required("detail", Text),
    Column("peer", String, nullable=True),
    _required("source", String),
    CheckConstraint("outcome IN ('done', 'refused')", name="outcome_known"),
    # The history newest first: SQLite merges this index's order with ix_transitions_at's.
    Index("ix_audit_events_at", "at"),
    # AUTOINCREMENT: an id is never reused, so a client paging through history never sees one twice.
    sqlite_autoincrement=True,
)

# An alert rule an admin turned on or off in the console (edged.core.alerts): one row per kind of rule ever set,
# with its threshold (seconds, failures in a row, percent free or degrees Celsius, as the kind says; NULL for the
# kinds that have none). A kind never set is off.
alert_rules: Final = Table(
    "alert_rules",
    metadata,
    Column("kind", String, primary_key=True),
    _required("enabled", Boolean),
    Column("threshold", Double, nullable=True),
    _required("changed_at", UTCDateTime),
)

# Where alerts are sent: one row at most (id 1). ``secret`` keys the HMAC-SHA256 that signs each delivery, so it is
# kept as it is (a hash could not sign); it is shown once, when the webhook is set, and never again.
alert_webhook: Final = Table(
    "alert_webhook",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("url", Text),
    _required("secret", String),
    _required("set_at", UTCDateTime),
    CheckConstraint("id = 1", name="one_webhook"),
)

# An alert that fired, and what became of its delivery: ``delivery`` pending, delivered, failed or unsent (no
# webhook was set); ``detail`` says why, ``tries`` how many POSTs it took. Only the newest rows are kept
# (edged.core.alerts.bounds.FIRED_KEPT).
alerts_fired: Final = Table(
    "alerts_fired",
    metadata,
    Column("id", Integer, primary_key=True),
    _required("at", UTCDateTime),
    _required("kind", String),
    _required("subject", String),
    _required("message", Text),
    _required("delivery", String),
    _required("detail", Text),
    _required("tries", Integer),
    CheckConstraint("delivery IN ('pending', 'delivered', 'failed', 'unsent')", name="delivery_known"),
    CheckConstraint("tries >= 0", name="tries_not_negative"),
    # AUTOINCREMENT: an id is never reused, so a receiver that deduplicates deliveries by id never drops a new one.
    sqlite_autoincrement=True,
)
