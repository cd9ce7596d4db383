"""The audit history against a real SQLite state directory: account actions and model transitions read as one
history, newest first, filtered and paged across both tables; its CSV export; an older database upgraded; and
``edged admin`` run as a process, its actions found in the history."""

from __future__ import annotations

import asyncio
import csv
import io
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine

from edged.core.accounts import AuditEntry
from edged.core.audit import CSV_HEADER, EXPORT_BATCH, AuditLog, csv_cell, write_csv
from edged.state.audit import AuditRecord, Event
from edged.state.store import DB_NAME, HEAD_REVISION, StateStore, alembic_config

REPO_ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery"


def _entry(actor: str, action: str, target: str, outcome: str = "done", detail: str = "") -> AuditEntry:
    return AuditEntry(actor, action, target, outcome, detail, "192.0.2.9")  # type: ignore[arg-type]


def _labels(events: list[Event]) -> list[str]:
    return [f"{event.kind}:{event.action}:{event.target}" for event in events]


def _mixed_history(store: StateStore) -> list[str]:
    """Transitions and account actions written alternately, in real time: what the history must show, newest
    first."""
    written = []
    log = AuditLog(store)
    try:
        for step in range(3):
            store.transition("add_sub", 1, "LOADING", "api", actor="user:alice")
            written.append("transition:LOADING:add_sub")
            log.record(_entry("user:alice", "login", "alice"), "console")
            asyncio.run(log.written())
            written.append("audit:login:alice")
            store.transition("identity", None, "READY", "poll" if step else "startup")
            written.append("transition:READY:identity")
    finally:
        log.close()
    return written[::-1]


def test_both_tables_read_as_one_history_newest_first(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        expected = _mixed_history(store)
        events, total = store.events(limit=100)
    assert total == len(expected) == 9
    assert _labels(events) == expected
    assert [event.at for event in events] == sorted((event.at for event in events), reverse=True)
    login = next(event for event in events if event.kind == "audit")
    assert (login.actor, login.source, login.outcome, login.peer) == ("user:alice", "console", "done", "192.0.2.9")
    assert (login.version, login.previous, login.duration_s) == (None, None, None)
    loading = next(event for event in events if event.action == "LOADING")
    assert (loading.version, loading.source, loading.outcome, loading.peer) == (1, "api", None, None)
    # The transitions' own chain is kept: the newest LOADING follows the one before it.
    assert loading.previous == "LOADING"


def test_each_filter(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        log = AuditLog(store)
        try:
            store.transition("add_sub", 1, "READY", "api", actor="user:alice")
            store.transition("add_sub", 1, "UNLOADED", "api", actor="token:ci")
            store.transition("identity", None, "READY", "startup")
            log.record(_entry("cli", "user-create", "alice"), "cli")
            log.record(_entry("user:alice", "login", "alice"), "console")
            log.record(_entry("anonymous", "login", "mallory", "refused", "unknown user"), "console")
            log.record(_entry("user:admin", "user-disable", "add_sub"), "console")  # a target named as a model
            asyncio.run(log.written())

            def labels(
                model: str | None = None, actor: str | None = None, source: str | None = None
            ) -> tuple[list[str], int]:
                events, total = asyncio.run(log.events(model=model, actor=actor, source=source))
                return _labels(events), total

            assert labels(model="add_sub") == (
                ["audit:user-disable:add_sub", "transition:UNLOADED:add_sub", "transition:READY:add_sub"],
                3,
            )
            assert labels(model="nothing") == ([], 0)
            # A plain name is the user of that name, in transitions and account actions alike.
            assert labels(actor="alice") == (["audit:login:alice", "transition:READY:add_sub"], 2)
            assert labels(actor="user:alice") == labels(actor="alice")
            assert labels(actor="token:ci") == (["transition:UNLOADED:add_sub"], 1)
            assert labels(actor="cli") == (["audit:user-create:alice"], 1)
            # "ci" is no user: the token named ci is not it.
            assert labels(actor="ci") == ([], 0)
            assert labels(source="console")[1] == 3
            assert labels(source="startup") == (["transition:READY:identity"], 1)
            assert labels(source="api", actor="alice", model="add_sub") == (["transition:READY:add_sub"], 1)
            refused = asyncio.run(log.events(actor="anonymous"))[0]
            assert [(e.target, e.outcome, e.detail) for e in refused] == [("mallory", "refused", "unknown user")]
        finally:
            log.close()


def test_pages_cover_the_history_once_with_the_total(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        expected = _mixed_history(store) + _mixed_history(store)
        everything = store.events(limit=1000)[0]
        assert len(everything) == 18
        paged: list[Event] = []
        for offset in range(0, 20, 4):
            page, total = store.events(offset=offset, limit=4)
            assert total == 18
            assert len(page) == min(4, 18 - offset)
            paged += page
        assert paged == everything
        assert sorted(_labels(paged)) == sorted(expected)
        assert store.events(offset=18, limit=4) == ([], 18)
        filtered, total = store.events(actor="alice", offset=2, limit=3)
        assert total == 12 and len(filtered) == 3
        assert filtered == store.events(actor="alice", limit=12)[0][2:5]
        # The cursor goes on from an event as the offset does, without counting what came before.
        assert store.events(after=everything[5].key, limit=4)[0] == everything[6:10]
        with pytest.raises(ValueError, match="offset >= 0 and limit >= 1"):
            store.events(offset=-1)
        with pytest.raises(ValueError, match="offset >= 0 and limit >= 1"):
            store.events(limit=0)


def test_old_account_actions_are_pruned(tmp_path: Path) -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    with StateStore.open(tmp_path) as store:
        store.audit_kept = 10
        for n in range(256):
            store.add_audit(
                AuditRecord(at + timedelta(seconds=n), "anonymous", "login", f"u{n}", "refused", "", None, "console")
            )
        # Pruned at the 256th write: the newest 10 stay.
        assert store.audit_count() == 10
        assert [event.target for event in store.events(limit=100)[0]] == [f"u{n}" for n in range(255, 245, -1)]


def test_csv_defuses_formulas_and_keeps_every_field(tmp_path: Path) -> None:
    for dangerous in ('=HYPERLINK("http://x")', "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"):
        assert csv_cell(dangerous) == "'" + dangerous
    assert csv_cell("alice") == "alice"
    assert csv_cell("a=b") == "a=b"
    assert csv_cell(None) == ""
    assert csv_cell(3) == "3"
    assert csv_cell(datetime(2026, 3, 1, 12, tzinfo=UTC)) == "2026-03-01T12:00:00+00:00"

    with StateStore.open(tmp_path) as store:
        store.transition("add_sub", 2, "READY", "upload", 'loaded, "quoted"\nsecond line', 0.5, "user:bob")
        store.add_audit(
            AuditRecord(
                datetime.now(UTC),
                "anonymous",
                "login",
                "=cmd|' /C calc'!A0",
                "refused",
                "unknown user",
                "192.0.2.1",
                "console",
            )
        )
        events = store.events()[0]
    out = io.StringIO(newline="")
    write_csv(events, out)
    rows = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
    assert rows[0] == list(CSV_HEADER)
    by_kind = {row[1]: dict(zip(CSV_HEADER, row, strict=True)) for row in rows[1:]}
    assert by_kind["audit"]["target"] == "'=cmd|' /C calc'!A0"
    assert by_kind["audit"]["actor"] == "anonymous" and by_kind["audit"]["peer"] == "192.0.2.1"
    assert by_kind["audit"]["outcome"] == "refused" and by_kind["audit"]["version"] == ""
    transition = by_kind["transition"]
    assert transition["detail"] == 'loaded, "quoted"\nsecond line'  # quoted by the csv module, read back whole
    assert (transition["version"], transition["duration_s"], transition["source"]) == ("2", "0.5", "upload")
    assert datetime.fromisoformat(transition["time"]).tzinfo is not None


def test_csv_export_reads_in_batches_and_skips_what_arrives_meanwhile(tmp_path: Path) -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    count = EXPORT_BATCH * 2 + 7
    with StateStore.open(tmp_path) as store:
        for n in range(count):
            store.add_audit(
                AuditRecord(at + timedelta(seconds=n), "cli", "user-create", f"u{n}", "done", "", None, "cli")
            )
        log = AuditLog(store)

        async def export() -> list[str]:
            chunks = []
            async for chunk in log.csv_chunks(actor="cli"):
                chunks.append(chunk)
                # Written while the export runs: newer than where it began, so left out, and nothing repeats.
                store.add_audit(AuditRecord(datetime.now(UTC), "cli", "user-create", "late", "done", "", None, "cli"))
            return chunks

        try:
            chunks = asyncio.run(export())
        finally:
            log.close()
    rows = list(csv.reader(io.StringIO("".join(chunks), newline="")))
    assert rows[0] == list(CSV_HEADER)
    assert [row[5] for row in rows[1:]] == [f"u{n}" for n in range(count - 1, -1, -1)]
    assert len(chunks) == 3  # the header with the first batch, then two more


def test_without_a_store_nothing_is_kept() -> None:
    log = AuditLog(None)

    async def export() -> str:
        return "".join([chunk async for chunk in log.csv_chunks()])

    try:
        log.record(_entry("cli", "user-create", "alice"), "cli")
        assert not log.enabled
        assert asyncio.run(log.events()) == ([], 0)
        assert list(csv.reader(io.StringIO(asyncio.run(export()), newline=""))) == [list(CSV_HEADER)]
    finally:
        log.close()


def test_a_database_of_schema_0004_is_upgraded_and_keeps_its_history(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as migrating:
            config = alembic_config(db)
            config.attributes["connection"] = migrating
            command.upgrade(config, "0004")
    finally:
        engine.dispose()
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO models (id, name) VALUES (1, 'add_sub')")
        connection.execute(
            "INSERT INTO transitions (model_id, version, state, previous, source, reason, at, duration_s, actor) "
            "VALUES (1, 1, 'READY', NULL, 'api', '', '2026-01-01 00:00:00.000000', 0.5, 'token:ci')"
        )
    connection.close()
    with StateStore.open(tmp_path) as store:
        store.add_audit(
            AuditRecord(datetime(2026, 2, 1, tzinfo=UTC), "cli", "user-create", "alice", "done", "", None, "cli")
        )
        events, total = store.events()
    assert total == 2
    assert _labels(events) == ["audit:user-create:alice", "transition:READY:add_sub"]
    assert events[1].actor == "token:ci" and events[1].at == datetime(2026, 1, 1, tzinfo=UTC)
    connection = sqlite3.connect(db)
    try:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD_REVISION,)]
        indexes = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    finally:
        connection.close()
    assert {"ix_audit_events_at", "ix_transitions_at"} <= indexes


def _admin(state_dir: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", "admin", "--state-dir", str(state_dir), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        check=False,
        start_new_session=True,  # no terminal: getpass reads standard input
    )


def test_edged_admin_actions_are_in_the_history(tmp_path: Path) -> None:
    made = _admin(tmp_path, "create", "--name", "alice", "--role", "operator", "--password-stdin", stdin=PASSWORD)
    assert made.returncode == 0, made.stderr
    weak = _admin(tmp_path, "create", "--name", "bob", "--role", "viewer", "--password-stdin", stdin="short\n")
    assert weak.returncode == 1
    assert _admin(tmp_path, "passwd", "alice", "--password-stdin", stdin="another long passphrase").returncode == 0
    assert _admin(tmp_path, "disable", "alice").returncode == 0
    assert _admin(tmp_path, "disable", "nobody").returncode == 1
    assert _admin(tmp_path, "list").returncode == 0  # reads only: not an action

    with StateStore.open(tmp_path) as store:
        log = AuditLog(store)
        try:
            events, total = asyncio.run(log.events(source="cli"))
        finally:
            log.close()
    assert total == 5
    assert [(e.actor, e.action, e.target, e.outcome) for e in reversed(events)] == [
        ("cli", "user-create", "alice", "done"),
        ("cli", "user-create", "bob", "refused"),
        ("cli", "password-set", "alice", "done"),
        ("cli", "user-disable", "alice", "done"),
        ("cli", "user-disable", "nobody", "refused"),
    ]
    assert events[-1].detail == "role operator"
    assert "12 characters" in events[-2].detail
    assert events[0].detail == "no user named 'nobody'"
    assert all(PASSWORD not in e.detail and "short" not in e.detail for e in events)
