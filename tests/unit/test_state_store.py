"""StateStore against real SQLite files: every method's round trip, migrations, refusals, concurrency, kill -9."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from edged.state.alerts import AlertRuleRecord, AlertWebhookRecord, FiredAlertRecord
from edged.state.directory import default_state_dir
from edged.state.records import StateError
from edged.state.schema import metadata
from edged.state.store import (
    BUSY_TIMEOUT_S,
    DB_NAME,
    HEAD_REVISION,
    HistoryEvent,
    StateStore,
    alembic_config,
)

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
TABLES: Final = {
    "alembic_version",
    "models",
    "model_versions",
    "transitions",
    "desired_models",
    "sync_runs",
    "sync_verdicts",
    "desired_versions",
    "api_tokens",
    "users",
    "sessions",
    "login_failures",
    "audit_events",
    "alert_rules",
    "alert_webhook",
    "alerts_fired",
}


def _head() -> str:
    head = ScriptDirectory.from_config(alembic_config(Path("unused.db"))).get_current_head()
    assert head is not None
    return head


def _query(db: Path, sql: str) -> list[tuple[object, ...]]:
    """Reads the file through a plain sqlite3 connection of its own, as another process would."""
    connection = sqlite3.connect(db)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def _migrate(db: Path, revision: str) -> None:
    """Alembic's own upgrade of ``db`` to ``revision``, as an older edged left it or a new one would make it."""
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as connection:
            config = alembic_config(db)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def _structure(db: Path) -> dict[str, object]:
    """What a schema is, whatever order its columns were added in (ALTER TABLE ADD COLUMN appends): each table's
    columns, indexes, foreign keys and CHECK constraints, and which tables count with AUTOINCREMENT."""
    found: dict[str, object] = {}
    for name, sql in _query(db, "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        columns = sorted(row[1:] for row in _query(db, f"PRAGMA table_xinfo('{name}')"))
        indexes = sorted(
            (unique, tuple(column for _, _, column in _query(db, f"PRAGMA index_info('{index}')")))
            for _, index, unique, *_ in _query(db, f"PRAGMA index_list('{name}')")
        )
        keys = sorted(row[2:] for row in _query(db, f"PRAGMA foreign_key_list('{name}')"))
        checks = sorted(re.findall(r"CHECK \((.*?)\)[,\n]", str(sql)))
        found[str(name)] = (columns, indexes, keys, checks, "AUTOINCREMENT" in str(sql))
    return found


def _check_chain(events: list[HistoryEvent]) -> None:
    """Each event's ``previous`` is the state of the event before it (oldest first) for the same model+version."""
    last: dict[tuple[str, int | None], str] = {}
    for event in sorted(events, key=lambda e: e.id):
        key = (event.model, event.version)
        assert event.previous == last.get(key), event
        last[key] = event.state


# --- opening and migrations ------------------------------------------------------------------------------------


def test_open_creates_a_private_directory_and_a_wal_database_at_head(tmp_path: Path) -> None:
    state_dir = tmp_path / "var" / "lib" / "edged"
    with StateStore.open(state_dir) as store:
        assert store.path == state_dir / DB_NAME
        assert state_dir.stat().st_mode & 0o777 == 0o700
        assert _query(store.path, "PRAGMA journal_mode") == [("wal",)]
        tables = {name for (name,) in _query(store.path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables - {"sqlite_sequence"} == TABLES
        assert _query(store.path, "SELECT version_num FROM alembic_version") == [(_head(),)]
        assert store.integrity_check() == "ok"


def test_migrations_match_the_models(tmp_path: Path) -> None:
    StateStore.open(tmp_path).close()
    engine = create_engine(f"sqlite:///{tmp_path / DB_NAME}")
    try:
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), metadata) == []
            indexes = {
                name for (name,) in connection.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'index'")
            }
    finally:
        engine.dispose()
    assert {"ix_transitions_model_id_id", "ix_transitions_model_id_version_id"} <= indexes


def test_a_new_database_is_what_every_migration_makes(tmp_path: Path) -> None:
    """A new database is created from the models and stamped, not migrated: it must be exactly what running every
    migration from nothing gives, table for table and index for index."""
    assert _head() == HEAD_REVISION
    StateStore.open(tmp_path / "created").close()
    migrated = tmp_path / "migrated" / DB_NAME
    migrated.parent.mkdir()
    _migrate(migrated, "head")
    assert _structure(tmp_path / "created" / DB_NAME) == _structure(migrated)
    assert _query(migrated, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]


def test_a_database_of_the_first_schema_is_upgraded_and_keeps_its_history(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    _migrate(db, "0001")
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO models (id, name) VALUES (1, 'add_sub')")
        connection.execute(
            "INSERT INTO transitions (model_id, version, state, previous, source, reason, at, duration_s) "
            "VALUES (1, 1, 'READY', NULL, 'startup', '', '2026-01-01 00:00:00', 0.5)"
        )
    connection.close()
    with StateStore.open(tmp_path) as store:
        [event] = store.history("add_sub")[0]
        assert (event.state, event.source, event.actor) == ("READY", "startup", None)
        assert store.tokens() == []
        later = store.transition("add_sub", 1, "UNLOADED", "api", actor="token:ci")
        assert later.actor == "token:ci" and later.previous == "READY"
    assert _query(db, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]


def test_tokens_of_schema_0005_keep_their_rows_and_record_their_last_use(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    _migrate(db, "0005")
    with sqlite3.connect(db) as connection:
        connection.execute(
            "INSERT INTO api_tokens (token_id, name, role, secret_sha256, created_at) "
            "VALUES ('0123456789abcdef', 'ci', 'operator', 'ff', '2026-01-01 00:00:00.000000')"
        )
    connection.close()
    with StateStore.open(tmp_path) as store:
        [token] = store.tokens()
        assert (token.name, token.last_used_at, token.last_used_peer) == ("ci", None, None)
        used = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)
        store.touch_token("0123456789abcdef", used, "192.0.2.7")
        # Never back: an older use written later (another daemon's, a slow write) leaves the newer one.
        store.touch_token("0123456789abcdef", used - timedelta(minutes=5), "192.0.2.8")
        found = store.find_token("0123456789abcdef")
        assert found is not None and (found.last_used_at, found.last_used_peer) == (used, "192.0.2.7")
    assert _query(db, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]


def test_a_database_of_schema_0006_gains_empty_alert_tables_and_keeps_its_tokens(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    _migrate(db, "0006")
    with sqlite3.connect(db) as connection:
        connection.execute(
            "INSERT INTO api_tokens (token_id, name, role, secret_sha256, created_at) "
            "VALUES ('0123456789abcdef', 'ci', 'operator', 'ff', '2026-01-01 00:00:00.000000')"
        )
    connection.close()
    with StateStore.open(tmp_path) as store:
        assert [token.name for token in store.tokens()] == ["ci"]
        assert store.alert_rules() == [] and store.alert_webhook() is None and store.fired_alerts(10) == []
        at = datetime(2026, 3, 1, tzinfo=UTC)
        store.set_alert_rules([AlertRuleRecord("disk-low", True, 10.0, at)])
        store.set_alert_rules([AlertRuleRecord("disk-low", False, 20.0, at)])
        assert store.alert_rules() == [AlertRuleRecord("disk-low", False, 20.0, at)]
        store.set_alert_webhook(AlertWebhookRecord("https://example.net/hook", "s3cret", at))
        store.set_alert_webhook(AlertWebhookRecord("http://192.0.2.1/hook", "other", at))
        assert store.alert_webhook() == AlertWebhookRecord("http://192.0.2.1/hook", "other", at)
        store.set_alert_webhook(None)
        assert store.alert_webhook() is None
    assert _query(db, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]
    # Down and up again: 0007's downgrade drops exactly what its upgrade made.
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as alembic_connection:
            config = alembic_config(db)
            config.attributes["connection"] = alembic_connection
            command.downgrade(config, "0006")
    finally:
        engine.dispose()
    tables = {name for (name,) in _query(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not tables & {"alert_rules", "alert_webhook", "alerts_fired"}
    assert _query(db, "SELECT name FROM api_tokens") == [("ci",)]


def test_fired_alerts_keep_the_newest_and_record_their_delivery(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        at = datetime(2026, 3, 1, tzinfo=UTC)
        ids = [
            store.add_fired_alert(FiredAlertRecord(at, "test", "webhook", f"alert {n}", "pending", "", 0), keep=3)
            for n in range(7)
        ]
        assert ids == sorted(ids) and len(set(ids)) == 7
        kept = store.fired_alerts(10)
        assert [alert.message for alert in kept] == ["alert 6", "alert 5", "alert 4"]
        store.set_alert_delivery(ids[-1], "delivered", "HTTP 200 after 2 tries", 2)
        store.set_alert_delivery(ids[0], "delivered", "pruned already: nothing to update", 1)
        assert store.abandon_pending_alerts("edged stopped") == 2
        found = store.fired_alerts(3)
        assert [(a.delivery, a.detail, a.tries) for a in found] == [
            ("delivered", "HTTP 200 after 2 tries", 2),
            ("failed", "edged stopped", 0),
            ("failed", "edged stopped", 0),
        ]
        with pytest.raises(StateError, match="CHECK constraint"):
            store.add_fired_alert(FiredAlertRecord(at, "test", "webhook", "x", "lost", "", 0), keep=3)


def test_a_database_at_head_opens_without_alembic(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; from edged.state.store import StateStore\n"
        "for _ in range(2):\n"
        "    StateStore.open(Path(sys.argv[1])).close()\n"
        "    assert not any(name.startswith('alembic') for name in sys.modules), 'alembic was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert _query(tmp_path / DB_NAME, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]


def test_opening_again_is_idempotent_and_keeps_everything(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        store.model_seen("add_sub", "/models/add_sub/1", 1, "sha256:aa", 100)
        first = store.transition("add_sub", 1, "READY", "startup", "loaded", 0.25)
        store.set_desired("add_sub", [1])
        store.set_desired("identity", None)
        before = (store.model_versions("add_sub"), store.history(None), store.desired())
    schema = _query(tmp_path / DB_NAME, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    for _ in range(2):
        with StateStore.open(tmp_path) as store:
            assert (store.model_versions("add_sub"), store.history(None), store.desired()) == before
            assert store.history("add_sub")[0] == [first]
    assert _query(tmp_path / DB_NAME, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert _query(tmp_path / DB_NAME, "SELECT version_num FROM alembic_version") == [(_head(),)]


# --- refusals --------------------------------------------------------------------------------------------------


def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    garbage = b"this is not a database, it is a model file someone copied here\n" * 200
    db.write_bytes(garbage)
    with pytest.raises(StateError) as raised:
        StateStore.open(tmp_path)
    message = str(raised.value)
    assert str(db) in message
    assert "not a SQLite database" in message
    assert "\n" not in message
    assert db.read_bytes() == garbage


def test_a_corrupt_database_is_refused(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        for i in range(400):
            store.transition("add_sub", i % 3, "READY", "poll", "x" * 200)
    db = tmp_path / DB_NAME
    data = bytearray(db.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    assert len(data) > 8 * page_size
    # Page 1 (the header and the schema) stays, so SQLite opens the file; the pages after it are overwritten.
    data[2 * page_size : len(data) - page_size] = b"\xa5" * (len(data) - 3 * page_size)
    db.write_bytes(bytes(data))
    with pytest.raises(StateError) as raised:
        StateStore.open(tmp_path)
    message = str(raised.value)
    assert str(db) in message
    assert "is corrupt" in message
    assert "\n" not in message


def test_a_schema_from_a_newer_edged_is_refused(tmp_path: Path) -> None:
    StateStore.open(tmp_path).close()
    db = tmp_path / DB_NAME
    connection = sqlite3.connect(db)
    with connection:
        connection.execute("UPDATE alembic_version SET version_num = '0099_from_the_future'")
    connection.close()
    with pytest.raises(StateError) as raised:
        StateStore.open(tmp_path)
    message = str(raised.value)
    assert str(db) in message
    assert "written by a newer edged" in message
    assert "0099_from_the_future" in message
    assert "\n" not in message
    # Nothing was migrated or stamped over the newer schema.
    assert _query(db, "SELECT version_num FROM alembic_version") == [("0099_from_the_future",)]


def test_a_sqlite_file_of_another_program_is_refused(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    connection = sqlite3.connect(db)
    with connection:
        connection.execute("CREATE TABLE settings (key TEXT, value TEXT)")
    connection.close()
    with pytest.raises(StateError, match="not an edged state database") as raised:
        StateStore.open(tmp_path)
    assert str(db) in str(raised.value)
    assert {name for (name,) in _query(db, "SELECT name FROM sqlite_master")} == {"settings"}


def test_a_state_dir_that_cannot_be_created_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    state_dir = blocker / "edged"
    with pytest.raises(StateError, match="cannot create directory") as raised:
        StateStore.open(state_dir)
    assert str(state_dir / DB_NAME) in str(raised.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a directory whatever its mode says")
def test_an_unwritable_state_dir_is_refused(tmp_path: Path) -> None:
    StateStore.open(tmp_path / "state").close()
    (tmp_path / "state").chmod(0o500)
    try:
        with pytest.raises(StateError, match="not writable") as raised:
            StateStore.open(tmp_path / "state")
    finally:
        (tmp_path / "state").chmod(0o700)
    assert str(tmp_path / "state" / DB_NAME) in str(raised.value)


def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    store = StateStore.open(tmp_path)
    store.close()
    store.close()
    with pytest.raises(StateError, match="closed"):
        store.transition("add_sub", 1, "READY", "api")


# --- models and versions seen ----------------------------------------------------------------------------------


def test_model_seen_keeps_first_seen_and_updates_the_rest(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        before = datetime.now(UTC)
        store.model_seen("add_sub", "/models/add_sub/2", 2, "sha256:22", 2048)
        store.model_seen("add_sub", "/models/add_sub/1", 1, "sha256:11", 1024)
        store.model_seen("identity", "/models/identity/1", 1, "sha256:ii", 10)
        [v1, v2] = store.model_versions("add_sub")
        assert (v1.version, v1.path, v1.checksum, v1.size) == (1, "/models/add_sub/1", "sha256:11", 1024)
        assert (v2.version, v2.path, v2.checksum, v2.size) == (2, "/models/add_sub/2", "sha256:22", 2048)
        assert v1.first_seen.tzinfo is UTC
        assert before <= v1.first_seen == v1.last_seen <= datetime.now(UTC)

        time.sleep(0.01)
        # A 5 GiB version: sizes are 64-bit.
        store.model_seen("add_sub", "/staging/add_sub/1", 1, "sha256:1b", 5 << 30)
        [v1_again, v2_again] = store.model_versions("add_sub")
        assert v1_again.first_seen == v1.first_seen
        assert v1_again.last_seen > v1.last_seen
        assert (v1_again.path, v1_again.checksum, v1_again.size) == ("/staging/add_sub/1", "sha256:1b", 5 << 30)
        assert v2_again == v2
        assert [v.version for v in store.model_versions("identity")] == [1]
        assert store.model_versions("never_seen") == []
        with pytest.raises(ValueError, match="negative"):
            store.model_seen("add_sub", "/models/add_sub/3", 3, "sha256:33", -1)
        with pytest.raises(ValueError, match="empty"):
            store.model_seen("", "/models/x/1", 1, "sha256:00", 1)


# --- transitions and history -----------------------------------------------------------------------------------


def test_transition_returns_what_history_gives_back(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        before = datetime.now(UTC)
        event = store.transition("add_sub", 3, "UNAVAILABLE", "poll", "failed to load: bad config", 1.5)
        assert event.model == "add_sub"
        assert (event.version, event.state, event.previous) == (3, "UNAVAILABLE", None)
        assert (event.source, event.reason, event.duration_s) == ("poll", "failed to load: bad config", 1.5)
        assert event.at.tzinfo is UTC
        assert before <= event.at <= datetime.now(UTC)
        plain = store.transition("identity", None, "LOADING", "api")
        assert (plain.reason, plain.duration_s, plain.version) == ("", None, None)
        assert store.history(None) == ([plain, event], 2)
    # Stored as UTC, whatever the local zone: the raw column holds the UTC wall time.
    [(raw,)] = _query(tmp_path / DB_NAME, f"SELECT at FROM transitions WHERE id = {event.id}")
    assert datetime.fromisoformat(str(raw)).replace(tzinfo=UTC) == event.at


def test_previous_chains_per_model_and_version(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        steps = [
            ("add_sub", 1, "LOADING", None),
            ("add_sub", 2, "LOADING", None),
            ("add_sub", 1, "READY", "LOADING"),
            ("add_sub", None, "READY", None),  # the model as a whole chains apart from its versions
            ("identity", 1, "LOADING", None),  # another model's version 1 chains apart too
            ("add_sub", 2, "UNAVAILABLE", "LOADING"),
            ("add_sub", 1, "UNLOADING", "READY"),
            ("add_sub", 1, "UNLOADED", "UNLOADING"),
            ("add_sub", None, "UNAVAILABLE", "READY"),
            ("add_sub", 1, "LOADING", "UNLOADED"),
        ]
        for name, version, state, previous in steps:
            assert store.transition(name, version, state, "api").previous == previous
        events, total = store.history(None, limit=100)
        assert total == len(steps)
        _check_chain(events)


def test_history_pages_newest_first_with_the_total(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        made = []
        for i in range(10):
            made.append(store.transition("add_sub" if i % 3 else "identity", 1, f"STATE{i}", "poll", f"step {i}"))
        add_sub = [e for e in reversed(made) if e.model == "add_sub"]
        assert len(add_sub) == 6

        assert store.history("add_sub", offset=0, limit=4) == (add_sub[:4], 6)
        assert store.history("add_sub", offset=4, limit=4) == (add_sub[4:], 6)
        assert store.history("add_sub", offset=6, limit=4) == ([], 6)
        assert store.history("add_sub") == (add_sub, 6)
        assert store.history(None, offset=2, limit=3) == (list(reversed(made))[2:5], 10)
        assert store.history("identity")[1] == 4
        assert store.history("never_seen") == ([], 0)
        # A model only in the desired set has no history yet.
        store.set_desired("desired_only", None)
        assert store.history("desired_only") == ([], 0)
        for offset, limit in ((-1, 10), (0, 0)):
            with pytest.raises(ValueError, match="offset"):
                store.history(None, offset=offset, limit=limit)
        with pytest.raises(ValueError, match="duration"):
            store.transition("add_sub", 1, "READY", "poll", duration_s=-0.1)
        with pytest.raises(ValueError, match="duration"):
            store.transition("add_sub", 1, "READY", "poll", duration_s=float("nan"))
        assert store.history(None)[1] == 10


# --- the desired set -------------------------------------------------------------------------------------------


def test_desired_set_round_trips(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        assert store.desired() == {}
        store.set_desired("add_sub", [3, 1, 3])
        store.set_desired("identity", None)
        store.set_desired("nothing_yet", [])
        assert store.desired() == {"add_sub": [1, 3], "identity": None, "nothing_yet": []}

        store.set_desired("add_sub", None)
        store.set_desired("identity", [2])
        assert store.desired() == {"add_sub": None, "identity": [2], "nothing_yet": []}

        store.remove_desired("identity")
        store.remove_desired("never_desired")
        assert store.desired() == {"add_sub": None, "nothing_yet": []}
        # The versions went with the model (ON DELETE CASCADE, so foreign keys are on), none left behind.
        assert _query(store.path, "SELECT count(*) FROM desired_versions") == [(0,)]

        store.set_desired("add_sub", [4, 5])
        assert store.desired() == {"add_sub": [4, 5], "nothing_yet": []}
    with StateStore.open(tmp_path) as store:
        assert store.desired() == {"add_sub": [4, 5], "nothing_yet": []}


# --- concurrency and crashes -----------------------------------------------------------------------------------


def test_a_reader_in_another_connection_does_not_block_writes(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        store.transition("add_sub", 1, "LOADING", "startup")
        reader = sqlite3.connect(store.path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM transitions").fetchone() == (1,)
            started = time.monotonic()
            # Without WAL this commit would wait for the reader's lock, then fail after the busy timeout.
            store.transition("add_sub", 1, "READY", "startup")
            assert time.monotonic() - started < BUSY_TIMEOUT_S / 2
            assert reader.execute("SELECT count(*) FROM transitions").fetchone() == (1,)  # its snapshot
            reader.execute("COMMIT")
            assert reader.execute("SELECT count(*) FROM transitions").fetchone() == (2,)
        finally:
            reader.close()


def test_threads_share_one_store(tmp_path: Path) -> None:
    threads_n, each = 8, 25
    errors: list[BaseException] = []
    with StateStore.open(tmp_path) as store:

        def work(worker: int) -> None:
            try:
                for i in range(each):
                    store.transition("add_sub", 1, f"W{worker}-{i}", "api")
                    store.model_seen("add_sub", f"/models/{worker}", worker, f"sha256:{i}", i)
                    store.set_desired(f"model_{worker}", [i, i + 1])
                    store.history("add_sub", limit=5)
            except BaseException as error:
                errors.append(error)

        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        assert errors == []
        events, total = store.history("add_sub", limit=threads_n * each)
        assert total == threads_n * each
        _check_chain(events)
        assert len(store.model_versions("add_sub")) == threads_n
        assert store.desired() == {f"model_{n}": [each - 1, each] for n in range(threads_n)}


CRASHING_WRITER: Final = """
import sys
from pathlib import Path
from edged.state.store import StateStore

store = StateStore.open(Path(sys.argv[1]))
i = 0
while True:
    i += 1
    event = store.transition("add_sub", i % 4, f"STATE{i}", "poll", "r" * (i % 500), 0.001)
    store.model_seen("add_sub", f"/models/add_sub/{i % 4}", i % 4, f"sha256:{i}", i)
    store.set_desired("add_sub", list(range(i % 50)))
    print(event.id, flush=True)
"""


@pytest.mark.parametrize("run", range(3))
def test_kill_9_mid_write_leaves_a_sound_database(tmp_path: Path, run: int) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    committed = 0
    deadline = time.monotonic() + 60
    # Different points in the write loop on each run: the kill lands mid-transaction most of the time.
    target = 40 + 53 * run
    try:
        while committed < target and time.monotonic() < deadline:
            line = writer.stdout.readline()
            if not line:
                break
            committed = int(line)
    finally:
        writer.send_signal(signal.SIGKILL)  # no chance to roll back, checkpoint or close
        _, stderr = writer.communicate(timeout=30)
    assert writer.returncode == -signal.SIGKILL, stderr
    assert committed >= target, stderr

    with StateStore.open(tmp_path) as store:
        assert store.integrity_check() == "ok"
        events, total = store.history("add_sub", limit=100_000)
        # Every transaction the writer saw committed is there, and nothing half-written is.
        assert total >= committed
        assert {event.id for event in events} >= set(range(1, committed + 1))
        _check_chain(events)
        desired = store.desired()["add_sub"]
        assert desired is not None
        assert desired == list(range(len(desired)))
        store.transition("add_sub", 1, "READY", "startup")
    assert _query(tmp_path / DB_NAME, "PRAGMA integrity_check") == [("ok",)]


# --- the default state directory -------------------------------------------------------------------------------


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    home = {"HOME": "/home/edge"}
    assert default_state_dir({**home, "EDGED_STATE_DIR": "/srv/edged", "INVOCATION_ID": "x"}) == Path("/srv/edged")
    assert default_state_dir({**home, "STATE_DIRECTORY": "/var/lib/edged2:/var/lib/x"}) == Path("/var/lib/edged2")
    assert default_state_dir({**home, "XDG_STATE_HOME": "/xdg"}) == Path("/xdg/edged")
    assert default_state_dir({**home, "XDG_STATE_HOME": "relative"}) == Path("/home/edge/.local/state/edged")
    assert default_state_dir(home) == Path("/home/edge/.local/state/edged")

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_state_dir({**home, "INVOCATION_ID": "0123"}) == Path("/var/lib/edged")
    assert default_state_dir(home) == Path("/home/edge/.local/state/edged")  # root, but not under systemd

    # A user service: systemd --user sets INVOCATION_ID too, but /var/lib/edged is not the user's to write.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert default_state_dir({**home, "INVOCATION_ID": "0123"}) == Path("/home/edge/.local/state/edged")
    # A dedicated system user whose /var/lib/edged the package made.
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) == Path("/var/lib/edged"))
    assert default_state_dir({**home, "INVOCATION_ID": "0123"}) == Path("/var/lib/edged")

    monkeypatch.setenv("EDGED_STATE_DIR", str(Path("/from/os/environ")))
    assert default_state_dir() == Path("/from/os/environ")


def test_timestamps_are_utc_whatever_the_local_zone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        with StateStore.open(tmp_path) as store:
            event = store.transition("add_sub", 1, "READY", "api")
            assert abs(event.at - datetime.now(UTC)) < timedelta(seconds=5)
        with StateStore.open(tmp_path) as store:
            [again], _ = store.history("add_sub")
            assert again.at == event.at
            assert again.at.utcoffset() == timedelta(0)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_history_keeps_the_newest_events_of_each_model(tmp_path: Path) -> None:
    with StateStore.open(tmp_path, history_per_model=5) as store:
        store.transition("quiet", 1, "READY", "startup")
        for n in range(520):
            store.transition("busy", 1, f"S{n}", "poll")
        events, total = store.history("busy", limit=1000)
        # Pruned on the writes whose ids are multiples of 256 (512: busy's S510): its newest 5 then, and what came
        # after.
        assert total == len(events) == 5 + 9
        assert [event.state for event in events] == [f"S{n}" for n in range(519, 505, -1)]
        assert store.history("quiet")[1] == 1
