"""The daemon's logging: where lines go, which lines go, and the fields that travel with them.

``configure`` installs one handler on the root logger, once, at start-up:

- under systemd's journal (``JOURNAL_STREAM`` names the device and inode of our stderr, which is how systemd says
  that stderr is a journal stream) records go to journald as structured entries: ``MESSAGE``, ``PRIORITY``,
  ``SYSLOG_IDENTIFIER``, ``LOGGER``, ``CODE_FILE``/``CODE_LINE``/``CODE_FUNC``, and ``MODEL``, ``VERSION`` and
  ``REQUEST_ID`` when the record carries them. systemd-python's ``systemd.journal.send`` writes them when it is
  installed; without it edged speaks journald's native protocol to ``/run/systemd/journal/socket`` itself (the
  same datagrams). A journal that cannot be reached makes edged write plain text to stderr, which journald
  records anyway;
- with ``--log-file`` plain text is appended to that file;
- otherwise plain text goes to stderr.

Beside that handler ``configure`` puts a ``LogRing`` (edged.log_ring): the last lines, bounded, in memory, which the
console's log page shows when there is no journal it can read.

The settings of Triton's logging extension (``log_info``, ``log_warning``, ``log_error``, ``log_verbose_level``,
``log_format``) are read by the handler at each record, so ``update`` changes what is written at once, from any
frontend. ``log_file`` is fixed at start-up: nothing received over the network may choose a path the daemon writes.

Fields for the journal come from two places, the record's own winning:

- ``log.info("loaded", extra=fields(model="add_sub", version=1))`` for one line;
- ``with context(model="add_sub", version=1, request_id=request.id): ...`` for every line logged inside the block,
  in this task or thread (a contextvar: asyncio tasks started inside inherit it, worker threads do not).
"""

from __future__ import annotations

import array
import contextlib
import contextvars
import fcntl
import importlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, TextIO, TypeVar

from edged.log_ring import LogRing

LogFormat = Literal["default", "ISO8601"]
LOG_FORMATS: tuple[LogFormat, ...] = ("default", "ISO8601")
Toggle = Literal["log_info", "log_warning", "log_error"]
TOGGLES: tuple[Toggle, ...] = ("log_info", "log_warning", "log_error")
JOURNAL_SOCKET = "/run/systemd/journal/socket"
# Triton keeps the verbose level in a signed 32-bit int: a larger level reads as 0 there, and so it does here.
MAX_VERBOSE_LEVEL = 2**31 - 1

# The journal fields a record may carry, by the LogRecord attribute that holds each.
_FIELD_ATTRIBUTES: dict[str, str] = {
    "MODEL": "edged_model",
    "VERSION": "edged_version",
    "REQUEST_ID": "edged_request_id",
}
# syslog priorities (sd-daemon.h): what journalctl -p filters on.
_PRIORITIES: tuple[tuple[int, int], ...] = (
    (logging.CRITICAL, 2),
    (logging.ERROR, 3),
    (logging.WARNING, 4),
    (logging.INFO, 6),
)
_DEBUG_PRIORITY = 7

_context: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("edged_log_fields", default=None)


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Triton's log settings, under Triton's names; ``log_file`` is "" when lines go to stderr or the journal."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: LogFormat = "default"


class LogFileError(Exception):
    """The configured log file cannot be opened for appending."""


def fields(
    *, model: str | None = None, version: int | str | None = None, request_id: str | None = None
) -> dict[str, str]:
    """The ``extra=`` of a log call whose line concerns a model, a version or a request."""
    values = {"MODEL": model, "VERSION": version, "REQUEST_ID": request_id}
    return {_FIELD_ATTRIBUTES[key]: str(value) for key, value in values.items() if value is not None and value != ""}


@contextlib.contextmanager
def context(
    *, model: str | None = None, version: int | str | None = None, request_id: str | None = None
) -> Iterator[None]:
    """Every line logged inside the block carries these fields (those given; outer ones stay)."""
    token = _context.set({**(_context.get() or {}), **fields(model=model, version=version, request_id=request_id)})
    try:
        yield
    finally:
        _context.reset(token)


def journal_fields(record: logging.LogRecord, formatter: logging.Formatter | None = None) -> dict[str, str]:
    """The journal entry for a record: its message (with the traceback, if any) and every field it carries."""
    message = record.getMessage()
    formatter = formatter or logging.Formatter()
    if record.exc_info:
        message = f"{message}\n{formatter.formatException(record.exc_info)}"
    if record.stack_info:
        message = f"{message}\n{formatter.formatStack(record.stack_info)}"
    priority = next((p for level, p in _PRIORITIES if record.levelno >= level), _DEBUG_PRIORITY)
    entry = {
        "MESSAGE": message,
        "PRIORITY": str(priority),
        "SYSLOG_IDENTIFIER": "edged",
        "LOGGER": record.name,
        "CODE_FILE": record.pathname,
        "CODE_LINE": str(record.lineno),
        "CODE_FUNC": record.funcName,
    }
    carried = _context.get() or {}
    for key, attribute in _FIELD_ATTRIBUTES.items():
        value = getattr(record, attribute, None) or carried.get(attribute)
        if value:
            entry[key] = str(value)
    return entry


def encode_native(entry: Mapping[str, str]) -> bytes:
    """One journal entry in journald's native protocol: ``KEY=value`` lines, or for a value holding a newline the
    key, a newline, its length as 64-bit little endian, the value and a newline."""
    parts: list[bytes] = []
    for key, value in entry.items():
        data = value.encode("utf-8", errors="replace")
        if b"\n" in data:
            parts.append(key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n")
        else:
            parts.append(key.encode() + b"=" + data + b"\n")
    return b"".join(parts)


class NativeJournal:
    """Sends entries to journald's socket as datagrams, as sd_journal_sendv does."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._socket.connect(path)
        except OSError:
            self._socket.close()
            raise

    def send(self, entry: Mapping[str, str]) -> None:
        data = encode_native(entry)
        try:
            self._socket.send(data)
        except OSError as exc:
            if exc.errno != 90:  # EMSGSIZE: larger than a datagram may be
                raise
            self._send_in_memfd(data)

    def _send_in_memfd(self, data: bytes) -> None:
        # journald reads an entry too large for a datagram from a sealed memfd passed with SCM_RIGHTS.
        fd = os.memfd_create("edged-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            self._socket.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        finally:
            os.close(fd)

    def close(self) -> None:
        self._socket.close()


def _systemd_sender() -> Callable[[Mapping[str, str]], None] | None:
    """systemd-python's sender, when it is installed."""
    try:
        journal: Any = importlib.import_module("systemd.journal")
    except ImportError:
        return None

    def send(entry: Mapping[str, str]) -> None:
        rest: dict[str, Any] = dict(entry)
        # journal.send formats CODE_LINE as an integer itself.
        rest["CODE_LINE"] = int(rest["CODE_LINE"])
        journal.send(rest.pop("MESSAGE"), **rest)

    return send


def record_model(record: logging.LogRecord) -> str:
    """The model a record names in its MODEL field (its own, or the context's), "" when none."""
    value = getattr(record, _FIELD_ATTRIBUTES["MODEL"], None) or (_context.get() or {}).get(_FIELD_ATTRIBUTES["MODEL"])
    return str(value) if value else ""


def under_journal(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether ``stream`` is the journal stream systemd connected us to (``JOURNAL_STREAM=<dev>:<inode>``); a
    stderr redirected elsewhere by a child of the service no longer matches."""
    device, _, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        status = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (status.st_dev, status.st_ino) == (int(device), int(inode))


class _State:
    """The settings in force; handlers read them at each record, frontends change them with ``update``."""

    def __init__(self) -> None:
        self.settings = LogSettings()
        self.handler: logging.Handler | None = None
        # Made at the first configure and kept (with its lines) when a process configures again.
        self.ring: LogRing | None = None


_state = _State()


def _allowed(record: logging.LogRecord) -> bool:
    settings = _state.settings
    if record.levelno >= logging.ERROR:
        return settings.log_error
    if record.levelno >= logging.WARNING:
        return settings.log_warning
    if record.levelno >= logging.INFO:
        return settings.log_info
    # Below INFO the logger levels set from log_verbose_level decide.
    return True


class TextFormatter(logging.Formatter):
    """A text line laid out as Triton's (glog's), so that what reads Triton's logs reads edged's:
    ``E1121 15:03:00.613052 4711 edged.core.repository.manager] message`` by default (level letter, local date and
    time to the microsecond, process id, then the logger where Triton names its source file), or
    ``2026-11-21T15:03:00Z E edged.core.repository.manager] message`` (UTC) with log_format ISO8601. Verbose lines
    are I lines, as Triton's are."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        letter = "I" if record.levelno < logging.WARNING else "W" if record.levelno < logging.ERROR else "E"
        if _state.settings.log_format == "ISO8601":
            head = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(record.created))} {letter} {record.name}]"
        else:
            local = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
            micros = int((record.created % 1) * 1_000_000)
            head = f"{letter}{local}.{micros:06d} {record.process} {record.name}]"
        return f"{head} {super().format(record)}"


_H = TypeVar("_H", bound=logging.Handler)


def _text(handler: _H) -> _H:
    handler.setFormatter(TextFormatter())
    handler.addFilter(_allowed)
    return handler


class JournalHandler(logging.Handler):
    """Structured entries to journald; a record the journal refuses is written to stderr instead of being lost."""

    def __init__(self, send: Callable[[Mapping[str, str]], None], fallback: TextIO) -> None:
        super().__init__()
        self._send = send
        self._fallback = _text(logging.StreamHandler(fallback))
        self._failed = False
        self.addFilter(_allowed)

    @property
    def failed(self) -> bool:
        """Whether journald refused an entry, which then went to stderr as text."""
        return self._failed

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._send(journal_fields(record, self._fallback.formatter))
        except Exception as exc:  # a lost journal must not take the daemon's logging with it
            if not self._failed:
                # Said once, so that a journal that refuses every entry does not double every line.
                self._failed = True
                self._fallback.stream.write(f"edged: journald did not take a log entry ({exc!r}): writing text\n")
            self._fallback.emit(record)


def _journal_handler(socket_path: str, fallback: TextIO) -> JournalHandler | None:
    send = _systemd_sender() if socket_path == JOURNAL_SOCKET else None
    if send is None:
        try:
            send = NativeJournal(socket_path).send
        except OSError:
            return None
    return JournalHandler(send, fallback)


def configure(
    verbose: int = 0,
    *,
    log_file: str = "",
    log_format: LogFormat = "default",
    log_info: bool = True,
    log_warning: bool = True,
    log_error: bool = True,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
    journal_socket: str = JOURNAL_SOCKET,
) -> LogSettings:
    """Installs edged's handler on the root logger (replacing the one a previous call installed) and applies the
    settings. Raises LogFileError when ``log_file`` cannot be opened."""
    stream = stream if stream is not None else sys.stderr
    environ = environ if environ is not None else os.environ
    handler: logging.Handler | None = None
    unreachable_journal = False
    if log_file:
        try:
            handler = _text(logging.FileHandler(log_file, encoding="utf-8"))
        except OSError as exc:
            raise LogFileError(f"cannot open log file {log_file}: {exc.strerror or exc}") from None
    elif under_journal(stream, environ):
        handler = _journal_handler(journal_socket, stream)
        unreachable_journal = handler is None
    if handler is None:
        handler = _text(logging.StreamHandler(stream))
    reset()
    logging.getLogger().addHandler(handler)
    _state.handler = handler
    if _state.ring is None:
        # The same lines the daemon's log gets (the level toggles apply to both).
        _state.ring = LogRing(model_of=record_model)
        _state.ring.addFilter(_allowed)
    logging.getLogger().addHandler(_state.ring)
    _state.settings = LogSettings(log_file, log_info, log_warning, log_error, 0, log_format)
    settings = update(log_verbose_level=verbose)
    if unreachable_journal:
        logging.getLogger("edged").warning("journald's socket %s cannot be reached: logging text", journal_socket)
    return settings


def reset() -> None:
    """Removes edged's handler and restores the default settings (for a process that configures again)."""
    if _state.handler is not None:
        logging.getLogger().removeHandler(_state.handler)
        _state.handler.close()
        _state.handler = None
    if _state.ring is not None:
        logging.getLogger().removeHandler(_state.ring)
    _state.settings = LogSettings()
    _apply_verbose_level(0)


def log_format(text: str) -> LogFormat | None:
    """The log_format named by ``text`` exactly (Triton's names are case-sensitive), or None."""
    return next((name for name in LOG_FORMATS if name == text), None)


def toggle(name: Toggle, value: bool) -> LogSettings:
    """Turns the INFO, WARNING or ERROR lines on or off."""
    if name == "log_info":
        return update(log_info=value)
    if name == "log_warning":
        return update(log_warning=value)
    return update(log_error=value)


def current() -> LogSettings:
    return _state.settings


def ring() -> LogRing | None:
    """The last lines logged, kept in memory; None before ``configure``."""
    return _state.ring


def journal_in_use() -> bool:
    """Whether the lines go to journald as entries (and it has not refused one): the journal then holds the log."""
    handler = _state.handler
    return isinstance(handler, JournalHandler) and not handler.failed


def update(
    *,
    log_info: bool | None = None,
    log_warning: bool | None = None,
    log_error: bool | None = None,
    log_verbose_level: int | None = None,
    log_format: LogFormat | None = None,
) -> LogSettings:
    """Changes the settings given (None leaves one as it is) and returns those now in force."""
    settings = _state.settings
    if log_info is not None:
        settings = replace(settings, log_info=log_info)
    if log_warning is not None:
        settings = replace(settings, log_warning=log_warning)
    if log_error is not None:
        settings = replace(settings, log_error=log_error)
    if log_format is not None:
        settings = replace(settings, log_format=log_format)
    if log_verbose_level is not None:
        level = log_verbose_level if 0 <= log_verbose_level <= MAX_VERBOSE_LEVEL else 0
        settings = replace(settings, log_verbose_level=level)
        _apply_verbose_level(level)
    _state.settings = settings
    return settings


def _apply_verbose_level(level: int) -> None:
    # Level 1 opens edged's own debug lines; level 2 also the libraries' (grpc's Python layer logs each event-loop
    # hand-over at DEBUG, which is noise until one debugs grpc itself).
    logging.getLogger().setLevel(logging.DEBUG if level > 1 else logging.INFO)
    logging.getLogger("edged").setLevel(logging.DEBUG if level > 0 else logging.NOTSET)
    logging.getLogger("grpc").setLevel(logging.DEBUG if level > 1 else logging.INFO)
