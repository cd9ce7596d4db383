"""The log page's sources without a daemon: the ring of recent lines stays within its bound (lines and bytes) under
floods of short lines, long lines, wide characters and a message of megabytes; its filters; the ring that
edged.logs installs; and the journal read through a reader like systemd-python's and through a journalctl that
prints what a real one prints, including a journal this process may not read."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from edged import log_journal, logs
from edged.frontends.console import logs as console_logs
from edged.log_journal import JournalMatch, JournalUnreadable, line_of_entry, unit_match
from edged.log_ring import (
    LEVELS,
    MAX_BYTES,
    MAX_LINES,
    MAX_MESSAGE_CHARS,
    LineFilter,
    LogLine,
    LogRing,
    newest,
)

# --- the ring's bound ---------------------------------------------------------------------------------------


def _logger(ring: LogRing, name: str = "edged.test.ring") -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers[:] = [ring]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def _held(ring: LogRing) -> int:
    """The memory the kept messages hold, measured apart from the ring's own count."""
    return sum(sys.getsizeof(line.message) for line in ring.lines())


def test_many_short_lines_keep_the_newest_within_the_line_bound() -> None:
    ring = LogRing()
    logger = _logger(ring)
    for index in range(MAX_LINES * 3):
        logger.info("request %d refused", index)
    count, size = ring.size()
    assert count == MAX_LINES and size <= MAX_BYTES
    kept = ring.lines()
    assert kept[-1].message == f"request {MAX_LINES * 3 - 1} refused"
    assert kept[0].message == f"request {MAX_LINES * 2} refused"


@pytest.mark.parametrize("char", ["x", "é", "😀"], ids=["ascii", "latin-1", "astral"])
def test_long_lines_keep_within_the_byte_bound(char: str) -> None:
    ring = LogRing()
    logger = _logger(ring)
    # What a client could make the daemon log: its input quoted in every line, each near the clip.
    for index in range(2_000):
        logger.warning("model '%s' refused: %s", index, char * (MAX_MESSAGE_CHARS - 100))
    count, size = ring.size()
    assert size <= MAX_BYTES and _held(ring) <= MAX_BYTES
    assert 0 < count < MAX_LINES
    assert ring.lines()[-1].message.startswith("model '1999' refused")


def test_a_message_of_megabytes_is_clipped_and_the_bound_holds() -> None:
    ring = LogRing()
    logger = _logger(ring)
    logger.error("%s", "y" * (8 * 1024 * 1024))
    (line,) = ring.lines()
    assert line.message.startswith("y" * MAX_MESSAGE_CHARS)
    assert line.message.endswith(f"({8 * 1024 * 1024 - MAX_MESSAGE_CHARS} more characters)")
    for _ in range(500):
        logger.error("%s", "z" * (8 * 1024 * 1024))
        assert ring.size()[1] <= MAX_BYTES
    assert _held(ring) <= MAX_BYTES


def test_a_traceback_is_part_of_its_line() -> None:
    ring = LogRing()
    logger = _logger(ring)
    try:
        raise ValueError("the reason")
    except ValueError:
        logger.exception("unloading 'm' failed")
    (line,) = ring.lines()
    assert line.message.startswith("unloading 'm' failed\nTraceback")
    assert "ValueError: the reason" in line.message


def test_a_smaller_bound_holds_even_against_one_line_larger_than_it() -> None:
    ring = LogRing(max_lines=10, max_bytes=4_000)
    logger = _logger(ring)
    for index in range(100):
        logger.info("%d %s", index, "w" * (index * 50))
        count, size = ring.size()
        assert count <= 10 and size <= 4_000


# --- filters ------------------------------------------------------------------------------------------------


def _line(message: str, level: int = logging.INFO, model: str = "", at: float = 0.0) -> LogLine:
    return LogLine(at, level, "edged.test", message, model)


def test_the_level_filter_keeps_that_level_and_the_more_severe() -> None:
    lines = [_line(name, level) for name, level in LEVELS.items()] + [_line("critical", logging.CRITICAL)]
    kept = newest(lines, LineFilter(LEVELS["warning"]), 100)
    assert [line.message for line in kept] == ["critical", "error", "warning"]
    assert [line.level_name for line in kept] == ["critical", "error", "warning"]
    assert len(newest(lines, LineFilter(), 100)) == 5


def test_the_model_filter_takes_the_field_or_the_quoted_name() -> None:
    lines = [
        _line("failed to load model 'cam': bad config", logging.ERROR),
        _line("loaded", model="cam"),
        _line("failed to load model 'camera': bad config", logging.ERROR),
        _line("cam is a word here, not a name"),
    ]
    kept = newest(lines, LineFilter(0, "cam"), 100)
    assert [line.message for line in kept] == ["loaded", "failed to load model 'cam': bad config"]
    assert newest(lines, LineFilter(logging.ERROR, "cam"), 100) == [lines[0]]
    # A long name is logged shortened (edged.core.names.printable): that form matches too.
    long_name = "n" * 100
    shortened = _line(f"failed to load model '{'n' * 80}... (100 characters)': why", logging.ERROR)
    assert newest([shortened], LineFilter(0, long_name), 10) == [shortened]


def test_newest_stops_at_the_limit_newest_first() -> None:
    lines = [_line(str(index), at=index) for index in range(50)]
    assert [line.message for line in newest(lines, LineFilter(), 3)] == ["49", "48", "47"]


# --- the ring edged.logs installs ----------------------------------------------------------------------------


@pytest.fixture
def configured(tmp_path: Path) -> Any:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    logs.configure(log_file=str(tmp_path / "edged.log"))
    try:
        yield logs.ring()
    finally:
        logs.reset()
        root.handlers[:] = handlers
        root.setLevel(level)


def test_configure_installs_the_ring_with_the_models_and_the_toggles(configured: LogRing) -> None:
    assert configured is not None and not logs.journal_in_use()
    log = logging.getLogger("edged.test.configured")
    log.error("failed to load model 'a': %s", "<b>why</b>", extra=logs.fields(model="a"))
    with logs.context(model="b"):
        log.warning("slow")
    logs.update(log_info=False)
    log.info("not kept: info lines are off")
    logs.update(log_info=True)
    kept = [line for line in configured.lines() if line.logger == "edged.test.configured"]
    assert [(line.message, line.model, line.level_name) for line in kept] == [
        ("failed to load model 'a': <b>why</b>", "a", "error"),
        ("slow", "b", "warning"),
    ]
    # Configured again (a reload): the same ring, its lines kept, installed once.
    logs.configure()
    assert logs.ring() is configured
    assert logging.getLogger().handlers.count(configured) == 1


def test_the_page_shows_the_ring_and_why_when_the_journal_cannot_be_read(
    configured: LogRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger("edged.test.page").error("failed to load model 'p': broken")
    monkeypatch.setattr(logs, "journal_in_use", lambda: True)
    monkeypatch.setattr(log_journal, "own_match", lambda: JournalMatch("_SYSTEMD_UNIT", "edged.service"))

    async def unreadable(*_: Any, **__: Any) -> list[LogLine]:
        raise JournalUnreadable("the journal holds no entry of edged.service that edged may read")

    monkeypatch.setattr(log_journal, "read", unreadable)
    found, source, note = asyncio.run(console_logs._newest(LineFilter(logging.ERROR, "p"), 10))
    assert [line.message for line in found] == ["failed to load model 'p': broken"]
    assert source.startswith("edged's memory") and note is not None and "edged.service" in note


# --- the journal --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cgroup", "environ", "expected"),
    [
        ("0::/system.slice/edged.service\n", {}, ("_SYSTEMD_UNIT", "edged.service")),
        ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/edged.service\n", {},
         ("_SYSTEMD_USER_UNIT", "edged.service")),
        ("12:memory:/x\n1:name=systemd:/system.slice/edged@a.service\n", {}, ("_SYSTEMD_UNIT", "edged@a.service")),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", {"INVOCATION_ID": "0123abcd"},
         ("_SYSTEMD_INVOCATION_ID", "0123abcd")),
        ("0::/\n", {"INVOCATION_ID": "not hex; rm -rf"}, None),
        ("", {}, None),
    ],
)  # fmt: skip
def test_the_unit_is_found_in_the_cgroup(cgroup: str, environ: dict[str, str], expected: Any) -> None:
    found = unit_match(cgroup, environ)
    assert (None if found is None else (found.field, found.value)) == expected


def _entry(message: Any, priority: int, at_us: int, **more: Any) -> dict[str, Any]:
    return {"MESSAGE": message, "PRIORITY": str(priority), "__REALTIME_TIMESTAMP": str(at_us), **more}


def test_journal_entries_become_lines() -> None:
    line = line_of_entry(_entry("failed", 3, 1_700_000_000_123_456, MODEL="m", LOGGER="edged.core"))
    assert line == LogLine(1_700_000_000.123456, logging.ERROR, "edged.core", "failed", "m")
    # Not UTF-8: an array of bytes; repeated: an array of values; too large for the reader: None.
    assert line_of_entry(_entry([104, 105, 255], 4, 0)) == LogLine(0.0, logging.WARNING, "", "hi\ufffd", "")
    assert line_of_entry(_entry(["a", "b"], 7, 0)) == LogLine(0.0, logging.DEBUG, "", "b", "")
    assert line_of_entry(_entry(None, 6, 0)) is None
    converted = {"MESSAGE": "x", "PRIORITY": 2, "__REALTIME_TIMESTAMP": datetime(2026, 1, 2, tzinfo=UTC)}
    assert line_of_entry(converted) == LogLine(datetime(2026, 1, 2, tzinfo=UTC).timestamp(), 50, "", "x", "")


class FakeReader:
    """The part of systemd.journal.Reader the page uses, over a list of entries (oldest first)."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries
        self.matches: list[str] = []
        self.position = len(entries)
        self.read = 0
        self.closed = False

    def add_match(self, *matches: str) -> None:
        self.matches.extend(matches)

    def seek_tail(self) -> None:
        self.position = len(self.entries)

    def get_previous(self) -> dict[str, Any]:
        if self.position == 0:
            return {}
        self.position -= 1
        self.read += 1
        return self.entries[self.position]

    def close(self) -> None:
        self.closed = True


MATCH = JournalMatch("_SYSTEMD_UNIT", "edged.service")


def test_the_reader_gives_the_newest_matching_lines_and_reads_no_further() -> None:
    entries = [
        _entry(f"failed to load model 'm': {i}" if i % 2 else f"info {i}", 3 if i % 2 else 6, i) for i in range(100)
    ]
    reader = FakeReader(entries)
    found = asyncio.run(log_journal.read_with_reader(lambda: reader, MATCH, LineFilter(logging.ERROR, "m"), 3))
    assert [line.message for line in found] == [f"failed to load model 'm': {i}" for i in (99, 97, 95)]
    assert reader.matches == ["_SYSTEMD_UNIT=edged.service"] and reader.closed
    assert reader.read == 5  # 99 down to 95: none older


def test_a_journal_with_nothing_of_the_unit_is_unreadable() -> None:
    with pytest.raises(JournalUnreadable, match=r"no entry of edged\.service"):
        asyncio.run(log_journal.read_with_reader(lambda: FakeReader([]), MATCH, LineFilter(), 10))
    # Entries, but none that the filter keeps: just no lines.
    reader = FakeReader([_entry("info", 6, 1)])
    assert asyncio.run(log_journal.read_with_reader(lambda: reader, MATCH, LineFilter(logging.ERROR), 10)) == []


def _journalctl(tmp_path: Path, lines: list[bytes]) -> str:
    """A journalctl that records its arguments and prints ``lines`` (as a real one does with --reverse -o json)."""
    output = tmp_path / "output"
    output.write_bytes(b"".join(lines))
    script = tmp_path / "journalctl"
    script.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"pathlib.Path({str(tmp_path / 'args')!r}).write_text('\\n'.join(sys.argv[1:]))\n"
        f"sys.stdout.buffer.write(pathlib.Path({str(output)!r}).read_bytes())\n",
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_journalctl_is_read_newest_first_and_an_overlong_entry_is_skipped(tmp_path: Path) -> None:
    newest_first = [
        json.dumps(_entry("failed to load model 'm': newest", 3, 3_000_000)).encode() + b"\n",
        json.dumps(_entry("x" * (2 * log_journal.MAX_JSON_LINE), 3, 2_000_000)).encode() + b"\n",
        b"not json\n",
        json.dumps(_entry("failed to load model 'm': oldest", 3, 1_000_000, MODEL="m")).encode() + b"\n",
    ]
    command = _journalctl(tmp_path, newest_first)
    found = asyncio.run(log_journal.read_with_journalctl(command, MATCH, LineFilter(logging.ERROR, "m"), 10))
    assert [(line.at, line.message) for line in found] == [
        (3.0, "failed to load model 'm': newest"),
        (1.0, "failed to load model 'm': oldest"),
    ]
    args = (tmp_path / "args").read_text().splitlines()
    assert args[-1] == "_SYSTEMD_UNIT=edged.service"
    assert {"--reverse", "--all", "-o", "json", "-n", str(log_journal.SCAN_MAX)} <= set(args)


def test_journalctl_with_nothing_to_show_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(JournalUnreadable):
        asyncio.run(log_journal.read_with_journalctl(_journalctl(tmp_path, []), MATCH, LineFilter(), 10))
    with pytest.raises(JournalUnreadable, match="cannot be run"):
        asyncio.run(log_journal.read_with_journalctl(str(tmp_path / "missing"), MATCH, LineFilter(), 10))
