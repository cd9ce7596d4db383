"""StateStore: the one module that issues SQL, over one SQLite file ``<state_dir>/edged.db``.

Threads: every method is synchronous and takes the store's lock, so the store may be shared between threads; the
daemon calls it from one dedicated worker thread, never on the event loop (a write waits on fsync and, when another
process holds the write lock, on SQLite's busy timeout). Other processes may read the file at the same time: in
WAL mode readers never block the writer and see only committed transactions.

Durability: each method is one short transaction. Writes begin with ``BEGIN IMMEDIATE``, so a write takes SQLite's
write lock before it reads (no lock upgrade that could fail half way). With WAL and ``synchronous=FULL`` a method
that returned has its transaction fsynced to the write-ahead log: it survives the process being killed and a power
cut alike (on storage that honours fsync).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self

from sqlalchemy import URL, Connection, Engine, create_engine, delete, event, func, insert, inspect, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError

import edged
from edged.state.accounts import AccountRecords
from edged.state.alerts import AlertRecords
from edged.state.audit import AuditRecords
from edged.state.records import StateError, inserted_id
from edged.state.schema import (
    api_tokens,
    desired_models,
    desired_versions,
    metadata,
    model_versions,
    models,
    transitions,
)
from edged.state.sync_runs import SyncRecords

if TYPE_CHECKING:
    import sqlite3

    from alembic.config import Config
    from sqlalchemy import RowMapping
    from sqlalchemy.pool import ConnectionPoolEntry

DB_NAME: Final = "edged.db"
MIGRATIONS_DIR: Final = Path(__file__).parent / "migrations"
# The schema revision of this edged (the newest in migrations/versions; a test holds them equal). A database at it,
# or a new one, opens without Alembic, whose import alone takes a fifth of a second of every start on a small device;
# Alembic runs only to upgrade an older database or to refuse one it cannot place.
HEAD_REVISION: Final = "0007"
# The table in which Alembic keeps a database's revision, as Alembic itself creates it.
_VERSION_TABLE: Final = (
    "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
    "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
)
# History kept per model by default: the newest events; older ones go (a model reloaded every minute for a week
# keeps its whole week).
HISTORY_PER_MODEL: Final = 10_000
# Pruning runs on one write in this many, so that its cost is spread thin.
_PRUNE_EVERY: Final = 256
# How long a write waits for another process's write lock before it fails with "database is locked".
BUSY_TIMEOUT_S: Final = 5.0
# An execution option (ours, not SQLAlchemy's) that makes the "begin" hook emit BEGIN IMMEDIATE.
_WRITE: Final = "edged_write"

# SQLite's errors that an operator can act on: what to say after the file's name instead of SQLite's bare text.
_MOVE_ASIDE: Final = "move it aside and edged starts with an empty state (the models stay in the repository)"
_EXPLAINED: Final = {
    "file is not a database": f"is not a SQLite database; {_MOVE_ASIDE}",
    "database disk image is malformed": f"is corrupt (database disk image is malformed); {_MOVE_ASIDE}",
    "unable to open database file": "cannot be opened; check that it and its directory are writable by this user",
    "attempt to write a readonly database": "is read-only; check the permissions of the file and of its directory",
    "database is locked": "is locked by another process; is another edged running with the same state directory?",
}


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One state transition of a model (``version`` None) or of one of its versions."""

    id: int
    model: str
    version: int | None
    state: str  # Triton's model states: READY, UNAVAILABLE, LOADING, UNLOADING, and UNLOADED once gone
    previous: str | None  # the state before, for the same model and version; None for the first one
    source: str  # what caused it: startup, poll, api, upload, sync, probation, or console (a console user's request)
    reason: str
    at: datetime  # tz-aware, UTC
    duration_s: float | None
    actor: str | None = None  # who asked ("token:<name>", "loopback", ...); None for the daemon's own changes


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """An API token as stored: never its secret, only the secret's SHA-256."""

    token_id: str
    name: str
    role: str
    secret_sha256: str
    created_at: datetime  # tz-aware, UTC
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None = None  # tz-aware, UTC; None: never used (or not since the column exists)
    last_used_peer: str | None = None  # the client address of that use


@dataclass(frozen=True, slots=True)
class SeenVersion:
    """A version of a model as last found in the repository."""

    version: int
    path: str
    checksum: str
    size: int  # bytes
    first_seen: datetime  # tz-aware, UTC
    last_seen: datetime  # tz-aware, UTC


# A token's columns, named as TokenRecord's fields.
_TOKENS: Final = select(
    api_tokens.c.token_id,
    api_tokens.c.name,
    api_tokens.c.role,
    api_tokens.c.secret_sha256,
    api_tokens.c.created_at,
    api_tokens.c.expires_at,
    api_tokens.c.revoked_at,
    api_tokens.c.last_used_at,
    api_tokens.c.last_used_peer,
)


def alembic_config(db: Path) -> Config:
    """Alembic's configuration for the database at ``db``, built in code: edged ships no alembic.ini."""
    from alembic.config import Config

    config = Config()
    # Config values go through ConfigParser interpolation, where "%" starts a reference.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    url = URL.create("sqlite", database=str(db)).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


class StateStore(AccountRecords, AlertRecords, AuditRecords, SyncRecords):
    """The daemon's state: models and versions seen, every state transition, explicit mode's desired set, API
    tokens; console accounts (edged.state.accounts), alerts (edged.state.alerts), the audit history
    (edged.state.audit) and sync runs (edged.state.sync_runs) by topic of their own."""

    def __init__(self, path: Path, engine: Engine, history_per_model: int = HISTORY_PER_MODEL) -> None:
        """Use ``StateStore.open``, which checks and migrates the database first."""
        self._history_per_model = history_per_model
        self._path = path
        self._engine = engine
        self._reader = engine
        self._writer = engine.execution_options(**{_WRITE: True})
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, state_dir: Path, history_per_model: int = HISTORY_PER_MODEL) -> StateStore:
        """Opens (creating it if needed) ``<state_dir>/edged.db`` and migrates its schema to this edged's; each
        model's history keeps its newest ``history_per_model`` events.

        Raises StateError, naming the file, for a directory that cannot be created or written, a file that is not
        a SQLite database or is corrupt, a schema newer than this edged knows, or a file that is not edged's.
        """
        state_dir = Path(state_dir)
        db = state_dir / DB_NAME
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            reason = error.strerror or str(error)
            raise StateError(f"state database {db}: cannot create directory {state_dir}: {reason}") from error
        # Checked up front because SQLite's own error ("unable to open database file") would not say why; WAL
        # needs to create the -wal and -shm files beside the database even when the database itself exists.
        if not os.access(state_dir, os.W_OK | os.X_OK):
            raise StateError(f"state database {db}: directory {state_dir} is not writable by this user")
        engine = _create_engine(db)
        try:
            _check_and_migrate(engine, db)
        except DBAPIError as error:
            engine.dispose()
            raise StateError(_describe(db, error)) from error
        except BaseException:
            engine.dispose()
            raise
        return cls(db, engine, history_per_model)

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def close(self) -> None:
        """Closes the connection (SQLite then checkpoints the WAL into the file). Closing twice is harmless."""
        with self._lock:
            self._closed = True
            self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # --- models and versions seen --------------------------------------------------------------------------

    def model_seen(self, name: str, path: str, version: int, checksum: str, size: int) -> None:
        """Records that ``version`` of ``name`` is in the repository now: first_seen is kept, the rest updated."""
        if size < 0:
            raise ValueError(f"size of version {version} of model '{name}' must not be negative, got {size}")
        now = _now()
        with self._transaction(write=True) as connection:
            model_id = _model_id(connection, name)
            upsert = sqlite_insert(model_versions).values(
                model_id=model_id,
                version=version,
                path=path,
                checksum=checksum,
                size=size,
                first_seen=now,
                last_seen=now,
            )
            connection.execute(
                upsert.on_conflict_do_update(
                    index_elements=[model_versions.c.model_id, model_versions.c.version],
                    set_={
                        "path": upsert.excluded.path,
                        "checksum": upsert.excluded.checksum,
                        "size": upsert.excluded.size,
                        "last_seen": upsert.excluded.last_seen,
                    },
                )
            )

    def model_versions(self, name: str) -> list[SeenVersion]:
        """Every version of ``name`` ever seen, by version number; empty for a model never seen."""
        versions = model_versions.c
        with self._transaction(write=False) as connection:
            rows = connection.execute(
                select(
                    versions.version,
                    versions.path,
                    versions.checksum,
                    versions.size,
                    versions.first_seen,
                    versions.last_seen,
                )
                .join(models, models.c.id == versions.model_id)
                .where(models.c.name == name)
                .order_by(versions.version)
            ).mappings()
            return [SeenVersion(**row) for row in rows]

    # --- history ---------------------------------------------------------------------------------------------

    def transition(
        self,
        name: str,
        version: int | None,
        state: str,
        source: str,
        reason: str = "",
        duration_s: float | None = None,
        actor: str | None = None,
    ) -> HistoryEvent:
        """Records a state change of a model (``version`` None) or of one version; returns it as stored."""
        if duration_s is not None and not duration_s >= 0:  # "not >=" also refuses NaN
            raise ValueError(f"duration of the '{name}' transition to {state} must be >= 0 seconds, got {duration_s}")
        now = _now()
        t = transitions.c
        with self._transaction(write=True) as connection:
            model_id = _model_id(connection, name)
            same_version = t.version.is_(None) if version is None else t.version == version
            previous = connection.scalar(
                select(t.state).where(t.model_id == model_id, same_version).order_by(t.id.desc()).limit(1)
            )
            event_id = inserted_id(
                connection.execute(
                    insert(transitions).values(
                        model_id=model_id,
                        version=version,
                        state=state,
                        previous=previous,
                        source=source,
                        reason=reason,
                        at=now,
                        duration_s=duration_s,
                        actor=actor,
                    )
                )
            )
            if event_id % _PRUNE_EVERY == 0:
                self._prune(connection, model_id)
        return HistoryEvent(event_id, name, version, state, previous, source, reason, now, duration_s, actor)

    def _prune(self, connection: Connection, model_id: int) -> None:
        """Drops the model's events older than its newest ``history_per_model`` (one indexed range delete)."""
        t = transitions.c
        oldest_kept = connection.scalar(
            select(t.id)
            .where(t.model_id == model_id)
            .order_by(t.id.desc())
            .offset(self._history_per_model - 1)
            .limit(1)
        )
        if oldest_kept is not None:
            connection.execute(delete(transitions).where(t.model_id == model_id, t.id < oldest_kept))

    def history(self, name: str | None, *, offset: int = 0, limit: int = 50) -> tuple[list[HistoryEvent], int]:
        """A page of transitions, newest first, and how many there are in all; ``name`` None: every model's."""
        if offset < 0 or limit < 1:
            raise ValueError(f"history needs offset >= 0 and limit >= 1, got offset {offset} and limit {limit}")
        t = transitions.c
        with self._transaction(write=False) as connection:
            page = select(transitions, models.c.name.label("model")).join(models, models.c.id == t.model_id)
            count = select(func.count()).select_from(transitions)
            if name is not None:
                model_id = connection.scalar(select(models.c.id).where(models.c.name == name))
                if model_id is None:
                    return [], 0
                page = page.where(t.model_id == model_id)
                count = count.where(t.model_id == model_id)
            total = connection.scalar(count) or 0
            rows = connection.execute(page.order_by(t.id.desc()).offset(offset).limit(limit)).mappings()
            return [_event(row) for row in rows], total

    # --- explicit mode's desired set -------------------------------------------------------------------------

    def desired(self) -> dict[str, list[int] | None]:
        """Model name -> the versions asked for (ascending), or None for "as the model's version policy says"."""
        with self._transaction(write=False) as connection:
            rows = connection.execute(
                select(models.c.name, desired_models.c.by_policy, desired_versions.c.version)
                .join(desired_models, desired_models.c.model_id == models.c.id)
                .outerjoin(desired_versions, desired_versions.c.model_id == desired_models.c.model_id)
                .order_by(models.c.name, desired_versions.c.version)
            )
            result: dict[str, list[int] | None] = {}
            for name, by_policy, version in rows:
                if by_policy:
                    result[name] = None
                    continue
                versions = result.setdefault(name, [])
                if versions is not None and version is not None:
                    versions.append(version)
            return result

    def set_desired(self, name: str, versions: list[int] | None) -> None:
        """Replaces what is desired of ``name``: these versions (duplicates dropped), or None for its policy's."""
        now = _now()
        with self._transaction(write=True) as connection:
            model_id = _model_id(connection, name)
            upsert = sqlite_insert(desired_models).values(model_id=model_id, by_policy=versions is None, set_at=now)
            connection.execute(
                upsert.on_conflict_do_update(
                    index_elements=[desired_models.c.model_id],
                    set_={"by_policy": upsert.excluded.by_policy, "set_at": upsert.excluded.set_at},
                )
            )
            connection.execute(delete(desired_versions).where(desired_versions.c.model_id == model_id))
            if versions:
                connection.execute(
                    insert(desired_versions), [{"model_id": model_id, "version": v} for v in sorted(set(versions))]
                )

    def remove_desired(self, name: str) -> None:
        """Drops ``name`` from the desired set; a model not in it is left as it is."""
        with self._transaction(write=True) as connection:
            # desired_versions rows go with it: ON DELETE CASCADE, with foreign_keys=ON on every connection.
            connection.execute(
                delete(desired_models).where(
                    desired_models.c.model_id == select(models.c.id).where(models.c.name == name).scalar_subquery()
                )
            )

    # --- API tokens -----------------------------------------------------------------------------------------

    def add_token(self, token: TokenRecord) -> None:
        """Stores a new token; StateError if its name (or, by a one-in-2**64 chance, its id) is taken."""
        try:
            with self._transaction(write=True) as connection:
                connection.execute(
                    insert(api_tokens).values(
                        token_id=token.token_id,
                        name=token.name,
                        role=token.role,
                        secret_sha256=token.secret_sha256,
                        created_at=token.created_at,
                        expires_at=token.expires_at,
                        revoked_at=token.revoked_at,
                    )
                )
        except StateError as error:
            if "UNIQUE constraint failed" in str(error):
                raise StateError(f"a token named '{token.name}' exists already") from None
            raise

    def tokens(self) -> list[TokenRecord]:
        """Every token, revoked and expired ones too, oldest first."""
        with self._transaction(write=False) as connection:
            return [TokenRecord(**row) for row in connection.execute(_TOKENS.order_by(api_tokens.c.id)).mappings()]

    def find_token(self, token_id: str) -> TokenRecord | None:
        with self._transaction(write=False) as connection:
            row = connection.execute(_TOKENS.where(api_tokens.c.token_id == token_id)).mappings().first()
            return None if row is None else TokenRecord(**row)

    def revoke_token(self, name: str) -> bool:
        """Revokes the token called ``name``; False when there is none (or it was revoked already)."""
        with self._transaction(write=True) as connection:
            revoked = connection.execute(
                update(api_tokens)
                .where(api_tokens.c.name == name, api_tokens.c.revoked_at.is_(None))
                .values(revoked_at=_now())
            )
            return revoked.rowcount > 0

    def touch_token(self, token_id: str, at: datetime, peer: str | None) -> None:
        """Moves a token's last use to ``at`` (from ``peer``); never back: of two daemons' writes, the later use
        stays."""
        with self._transaction(write=True) as connection:
            connection.execute(
                update(api_tokens)
                .where(
                    api_tokens.c.token_id == token_id,
                    (api_tokens.c.last_used_at.is_(None)) | (api_tokens.c.last_used_at < at),
                )
                .values(last_used_at=at, last_used_peer=peer)
            )

    # --- maintenance -----------------------------------------------------------------------------------------

    def integrity_check(self) -> str:
        """SQLite's full ``PRAGMA integrity_check``: "ok", or its findings joined with "; "."""
        with self._transaction(write=False) as connection:
            findings = connection.exec_driver_sql("PRAGMA integrity_check").scalars().all()
            return "; ".join(str(finding) for finding in findings)

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Connection]:
        """One transaction under the store's lock, committed when the block ends without an error, rolled back
        when it raises; SQLite's errors come out as StateError."""
        with self._lock:
            if self._closed:
                raise StateError(f"state database {self._path} is closed")
            try:
                with (self._writer if write else self._reader).begin() as connection:
                    yield connection
            except DBAPIError as error:
                raise StateError(_describe(self._path, error)) from error


def _create_engine(db: Path) -> Engine:
    engine = create_engine(
        URL.create("sqlite", database=str(db)),
        # The store's lock serialises every use, so one connection is all it needs; the connection is made on
        # the thread that opens the store and used on the daemon's worker thread, hence check_same_thread.
        pool_size=1,
        max_overflow=0,
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
    )

    @event.listens_for(engine, "connect")
    def configure(connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
        # The begin hook below emits BEGIN itself; sqlite3's legacy transaction control would skip BEGIN before
        # DDL (the migrations) and SELECT, so neither would be inside the transaction.
        connection.isolation_level = None
        cursor = connection.cursor()
        try:
            # Persistent in the file: readers in other processes never block the writer, and a killed writer
            # leaves a WAL that the next open rolls back or forward.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")  # per connection, off by default
            # FULL: with WAL, each commit fsyncs the log before it returns, so a commit survives a power cut, not
            # only the process being killed (NORMAL's promise). Writes are few (a load, an unload, a transition).
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if connection.get_execution_options().get(_WRITE) else "BEGIN")

    return engine


def _check_and_migrate(engine: Engine, db: Path) -> None:
    """Refuses a corrupt, foreign or newer database, then brings it to this edged's schema in one transaction."""
    with engine.execution_options(**{_WRITE: True}).begin() as connection:
        # quick_check: the page and b-tree structure without matching every index entry, so it stays fast.
        findings = connection.exec_driver_sql("PRAGMA quick_check(3)").scalars().all()
        if findings != ["ok"]:
            # Each finding may span lines ("*** in database main ***\nPage 3: ..."); the message stays one line.
            found = "; ".join(line.strip() for finding in findings for line in str(finding).splitlines()[-1:])
            raise StateError(f"state database {db} is corrupt ({found}); {_MOVE_ASIDE}")
        tables = set(inspect(connection).get_table_names())
        if not tables:
            # A new database: the schema as edged.state.schema declares it, stamped at head, as Alembic's
            # "create_all, then stamp" recipe does (a test holds the result equal to running every migration).
            metadata.create_all(connection)
            connection.exec_driver_sql(_VERSION_TABLE)
            connection.exec_driver_sql("INSERT INTO alembic_version (version_num) VALUES (?)", (HEAD_REVISION,))
        elif "alembic_version" not in tables or _revisions(connection) != [HEAD_REVISION]:
            _migrate(connection, db, tables)
        mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
        if mode != "wal":
            raise StateError(f"state database {db}: cannot use write-ahead logging on this file system ({mode})")


def _revisions(connection: Connection) -> list[str]:
    return [
        str(revision) for revision in connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalars()
    ]


def _migrate(connection: Connection, db: Path, tables: set[str]) -> None:
    """Alembic's upgrade to head, after refusing a revision it does not know or tables that are not edged's."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    config = alembic_config(db)
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    heads = MigrationContext.configure(connection).get_current_heads()
    unknown = sorted(head for head in heads if head not in known)
    if unknown:
        raise StateError(
            f"state database {db} was written by a newer edged (schema revision {', '.join(unknown)} is unknown "
            f"to edged {edged.__version__}); upgrade edged or move the file aside"
        )
    foreign = sorted(tables - {"alembic_version"})
    if not heads and foreign:
        raise StateError(
            f"state database {db} is not an edged state database (it has tables {', '.join(foreign)} "
            "but no edged schema revision); move it aside or choose another state directory"
        )
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def _model_id(connection: Connection, name: str) -> int:
    """The id of model ``name``, adding the model on first use; inside a write transaction, so no race."""
    if not name:
        raise ValueError("a model name must not be empty")
    model_id: int | None = connection.scalar(select(models.c.id).where(models.c.name == name))
    if model_id is None:
        model_id = inserted_id(connection.execute(insert(models).values(name=name)))
    return model_id


def _event(row: RowMapping) -> HistoryEvent:
    return HistoryEvent(
        id=row["id"],
        model=row["model"],
        version=row["version"],
        state=row["state"],
        previous=row["previous"],
        source=row["source"],
        reason=row["reason"],
        at=row["at"],
        duration_s=row["duration_s"],
        actor=row["actor"],
    )


def _now() -> datetime:
    return datetime.now(UTC)


def _describe(db: Path, error: DBAPIError) -> str:
    """One line naming the file: what SQLite's error means for the operator, or SQLite's own first line."""
    text = str(error.orig).splitlines()[0] if str(error.orig) else type(error.orig).__name__
    explained = _EXPLAINED.get(text)
    return f"state database {db} {explained}" if explained else f"state database {db}: {text}"
