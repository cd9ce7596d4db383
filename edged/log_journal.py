"""The daemon's recent lines read back from systemd's journal, for the console's log page.

Under systemd (edged.logs sends the records to journald) the journal holds the log, from earlier runs of the unit
too: the run that failed before a restart is often the one an operator wants to see. The unit is found in the
process's cgroup (``/proc/self/cgroup``: ``.../edged.service``); without one, the run's ``INVOCATION_ID``.

systemd-python's ``systemd.journal.Reader`` reads it when it is installed, else ``journalctl -o json`` in a
subprocess, under a time limit. Either way the entries are read newest first, at most ``SCAN_MAX`` of them and for
at most ``TIMEOUT_S`` seconds, and only the ones the filter keeps are held: what a page costs is bounded by its own
limit, not by the size of the journal. An entry's message is clipped as the ring clips it.

A journal that gives nothing at all for the unit is one this process may not read (a system service's user outside
the ``systemd-journal`` group): ``JournalUnreadable``, and the page shows the ring instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from edged.log_ring import LineFilter, LogLine, clip

# Entries looked at for one page at most (newest first), and how long the reading may take: the page reloads every
# few seconds, and a small device must not spend them all reading its journal.
SCAN_MAX: Final = 20_000
TIMEOUT_S: Final = 3.0
# One JSON line of journalctl's longer than this is skipped (journald keeps entries of up to 768 MiB).
MAX_JSON_LINE: Final = 1024 * 1024
# journalctl's fields: the rest of an entry is never sent.
_FIELDS: Final = "MESSAGE,PRIORITY,MODEL,LOGGER,SYSLOG_IDENTIFIER"
# syslog priorities (as edged.logs writes them) back to logging levels.
_LEVELS: Final = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR, 4: logging.WARNING}


class JournalUnreadable(Exception):
    """The journal could not be read, or held no entry of this unit that this process may see."""


@dataclass(frozen=True, slots=True)
class JournalMatch:
    """The journal field and value that pick this daemon's entries, e.g. ``_SYSTEMD_UNIT=edged.service``."""

    field: str
    value: str

    @property
    def expression(self) -> str:
        return f"{self.field}={self.value}"

    @property
    def unit(self) -> str:
        """What the page says it read: the unit, or the run."""
        return self.value if self.field != "_SYSTEMD_INVOCATION_ID" else f"this run ({self.value})"


def unit_match(cgroup: str, environ: Mapping[str, str]) -> JournalMatch | None:
    """The match for this process's unit, read from the text of ``/proc/self/cgroup``; a user service's unit is
    under ``user@UID.service``. Without a unit: the run's ``INVOCATION_ID``, or None."""
    for entry in cgroup.splitlines():
        hierarchy, _, rest = entry.partition(":")
        controllers, _, path = rest.partition(":")
        # cgroup v2's one hierarchy ("0::"), or v1's systemd one.
        if not (hierarchy == "0" and controllers == "") and controllers != "name=systemd":
            continue
        parts = [part for part in path.split("/") if part]
        for index in range(len(parts) - 1, -1, -1):
            if parts[index].endswith(".service"):
                user = any(part.startswith("user@") for part in parts[:index])
                return JournalMatch("_SYSTEMD_USER_UNIT" if user else "_SYSTEMD_UNIT", parts[index])
    invocation = environ.get("INVOCATION_ID", "")
    if invocation and all(char in "0123456789abcdef" for char in invocation):
        return JournalMatch("_SYSTEMD_INVOCATION_ID", invocation)
    return None


def own_match(environ: Mapping[str, str] | None = None) -> JournalMatch | None:
    try:
        cgroup = Path("/proc/self/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cgroup = ""
    return unit_match(cgroup, os.environ if environ is None else environ)


def line_of_entry(entry: Mapping[str, Any]) -> LogLine | None:
    """A journal entry (systemd-python's converted one, or journalctl's JSON) as a line; None when it has none."""
    message = _text(entry.get("MESSAGE"))
    if message is None:
        return None
    try:
        priority = int(_text(entry.get("PRIORITY")) or 6)
    except ValueError:
        priority = 6
    level = _LEVELS.get(priority, logging.INFO if priority < 7 else logging.DEBUG)
    stamp = entry.get("__REALTIME_TIMESTAMP")
    if isinstance(stamp, datetime):  # systemd-python's converter gives one
        at = stamp.timestamp()
    else:
        try:
            at = int(_text(stamp) or 0) / 1_000_000
        except ValueError:
            at = 0.0
    logger = _text(entry.get("LOGGER")) or _text(entry.get("SYSLOG_IDENTIFIER")) or ""
    model = _text(entry.get("MODEL")) or ""
    return LogLine(at, level, clip(logger, 256), clip(message), clip(model, 1024))


def _text(value: Any) -> str | None:
    # journalctl's JSON gives a field that is not UTF-8 as an array of bytes, and one repeated as an array of those.
    if isinstance(value, list) and value and isinstance(value[0], list | str | bytes):
        value = value[-1]
    if isinstance(value, list):
        with contextlib.suppress(ValueError, TypeError):
            return bytes(value).decode("utf-8", "replace")
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def _reader_module() -> Any:
    try:
        # systemd-python ships no type information (see edged.daemon.systemd).
        return importlib.import_module("systemd.journal")
    except ImportError:
        return None


async def read(match: JournalMatch, keep: LineFilter, limit: int) -> list[LogLine]:
    """The newest ``limit`` lines of the unit that ``keep`` accepts, newest first: through systemd-python when it
    is installed, else journalctl. Raises JournalUnreadable."""
    module = _reader_module()
    if module is not None:
        return await read_with_reader(module.Reader, match, keep, limit)
    return await read_with_journalctl("journalctl", match, keep, limit)


async def read_with_reader(make: Callable[[], Any], match: JournalMatch, keep: LineFilter, limit: int) -> list[LogLine]:
    """``read`` through a journal reader like systemd-python's ``Reader`` (which ``make`` makes), in a thread: its
    calls block."""
    return await asyncio.to_thread(_read_with_reader, make, match, keep, limit)


def _read_with_reader(make: Callable[[], Any], match: JournalMatch, keep: LineFilter, limit: int) -> list[LogLine]:
    deadline = time.monotonic() + TIMEOUT_S
    found: list[LogLine] = []
    scanned = 0
    try:
        with contextlib.closing(make()) as journal:
            # The level is filtered here rather than by the journal's own PRIORITY matches: an entry of any level
            # read shows that the journal is readable, and a page of no errors is then just that.
            journal.add_match(match.expression)
            journal.seek_tail()
            while len(found) < limit and scanned < SCAN_MAX and time.monotonic() < deadline:
                entry = journal.get_previous()
                if not entry:
                    break
                scanned += 1
                line = line_of_entry(entry)
                if line is not None and keep(line):
                    found.append(line)
    except OSError as exc:
        raise JournalUnreadable(f"the journal cannot be read: {exc}") from None
    if scanned == 0:
        raise JournalUnreadable(f"the journal holds no entry of {match.unit} that edged may read")
    return found


async def read_with_journalctl(command: str, match: JournalMatch, keep: LineFilter, limit: int) -> list[LogLine]:
    args = [command, "--no-pager", "--quiet", "--all", "--reverse", "-o", "json", f"--output-fields={_FIELDS}"]
    # No -p: the level is filtered here, as with the reader.
    args += ["-n", str(SCAN_MAX), match.expression]
    try:
        process = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=MAX_JSON_LINE,
        )
    except OSError as exc:
        raise JournalUnreadable(f"journalctl cannot be run: {exc}") from None
    found: list[LogLine] = []
    scanned = 0
    try:
        async with asyncio.timeout(TIMEOUT_S):
            scanned = await _collect(process, keep, limit, found)
    except TimeoutError:
        pass  # what was found in time is shown
    finally:
        if process.returncode is None:
            # Enough lines, or out of time: journalctl is not waited for to the end of its output.
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()
    if scanned == 0:
        raise JournalUnreadable(f"the journal holds no entry of {match.unit} that edged may read")
    return found


async def _collect(process: asyncio.subprocess.Process, keep: LineFilter, limit: int, found: list[LogLine]) -> int:
    """Reads journalctl's lines into ``found`` until it has ``limit`` or the output ends; returns the entries seen."""
    stdout = process.stdout
    assert stdout is not None
    scanned = 0
    skipping = False
    while len(found) < limit:
        try:
            data = await stdout.readuntil(b"\n")
        except asyncio.IncompleteReadError as end:
            data = end.partial
            if not data:
                break
        except asyncio.LimitOverrunError as over:
            # A line too long to hold: dropped, piece by piece, to its end.
            await stdout.readexactly(over.consumed)
            skipping = True
            continue
        if skipping:
            skipping = False
            continue
        try:
            entry = json.loads(data)
        except ValueError:
            continue
        scanned += 1
        line = line_of_entry(entry) if isinstance(entry, dict) else None
        if line is not None and keep(line):
            found.append(line)
        if not data.endswith(b"\n"):
            break
    return scanned
