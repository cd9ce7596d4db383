"""The last lines the daemon logged, kept in memory for the console's log page, and the filters that page applies.

``LogRing`` is a logging handler that ``edged.logs.configure`` puts beside the daemon's own: it keeps each record
as a ``LogLine`` (time, level, logger, message, model) and drops the oldest once it holds ``MAX_LINES`` lines or
``MAX_BYTES`` of text, whichever comes first, so that nothing a client makes the daemon log (a flood of refused
requests, a model name of 255 bytes in every line, a traceback the size of a page) can make it hold more. A
message longer than ``MAX_MESSAGE_CHARS`` keeps its beginning and says how much was cut.

Under systemd the journal keeps the log and the page reads it (``edged.log_journal``); the ring is still kept
there, since the daemon's user may not be allowed to read the journal.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from edged.core.names import printable

# The bound of the ring: 5,000 lines or 2 MiB of text, whichever is reached first.
MAX_LINES: Final = 5_000
MAX_BYTES: Final = 2 * 1024 * 1024
# A message longer than this is cut (a traceback's first 16,000 characters hold its reason and most of its frames).
MAX_MESSAGE_CHARS: Final = 16_000
# What a kept line costs besides its strings: the LogLine object, its float and int, the deque's slot.
LINE_OVERHEAD_BYTES: Final = 160

# The levels the page filters by, each with the least severe level it shows: "error" is error and critical.
LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


@dataclass(frozen=True, slots=True)
class LogLine:
    """One logged line: ``at`` in seconds since the epoch, ``level`` a logging level number, ``model`` the model the
    record names in its MODEL field ("" when it names none)."""

    at: float
    level: int
    logger: str
    message: str
    model: str = ""

    @property
    def level_name(self) -> str:
        if self.level >= logging.CRITICAL:
            return "critical"
        if self.level >= logging.ERROR:
            return "error"
        if self.level >= logging.WARNING:
            return "warning"
        return "info" if self.level >= logging.INFO else "debug"

    def cost(self) -> int:
        """The memory the line holds, as the ring counts it."""
        return (
            LINE_OVERHEAD_BYTES + sys.getsizeof(self.message) + sys.getsizeof(self.logger) + sys.getsizeof(self.model)
        )


def clip(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` cut to ``limit`` characters, saying how many were left out."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}… ({len(message) - limit} more characters)"


@dataclass(frozen=True, slots=True)
class LineFilter:
    """What the page narrows the lines to: ``level`` the least severe level shown (0: all), ``model`` a model's
    name ("" for any)."""

    level: int = 0
    model: str = ""

    def __call__(self, line: LogLine) -> bool:
        if line.level < self.level:
            return False
        if not self.model:
            return True
        if line.model == self.model:
            return True
        # Log lines quote a model's name as 'name' (shortened by printable when it is long).
        return any(quoted in line.message for quoted in self._quoted())

    def _quoted(self) -> tuple[str, ...]:
        shown = printable(self.model)
        return (f"'{self.model}'",) if shown == self.model else (f"'{self.model}'", f"'{shown}'")


def newest(lines: Sequence[LogLine], keep: LineFilter, limit: int) -> list[LogLine]:
    """The last ``limit`` lines that ``keep`` accepts, newest first; ``lines`` run oldest to newest."""
    found: list[LogLine] = []
    for line in reversed(lines):
        if keep(line):
            found.append(line)
            if len(found) >= limit:
                break
    return found


class LogRing(logging.Handler):
    """The last lines logged, at most ``max_lines`` of them and ``max_bytes`` of memory as ``LogLine.cost`` counts
    it; ``model_of`` finds the model a record names (edged.logs reads its MODEL field)."""

    def __init__(
        self,
        max_lines: int = MAX_LINES,
        max_bytes: int = MAX_BYTES,
        *,
        model_of: Callable[[logging.LogRecord], str] | None = None,
    ) -> None:
        super().__init__()
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._model_of = model_of
        self._lines: deque[LogLine] = deque()
        self._bytes = 0
        # Its own lock, not the handler's: the console copies the lines from another thread than the one logging.
        self._guard = threading.Lock()
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.line_of(record)
        except Exception:
            self.handleError(record)
            return
        self.add(line)

    def line_of(self, record: logging.LogRecord) -> LogLine:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self._formatter.formatException(record.exc_info)}"
        if record.stack_info:
            message = f"{message}\n{self._formatter.formatStack(record.stack_info)}"
        model = self._model_of(record) if self._model_of is not None else ""
        return LogLine(record.created, record.levelno, clip(record.name, 256), clip(message), clip(model, 1024))

    def add(self, line: LogLine) -> None:
        cost = line.cost()
        with self._guard:
            self._lines.append(line)
            self._bytes += cost
            # The oldest go first. With the default bound a clipped line always fits (at most about 70 KiB); a line
            # larger than a smaller bound goes too, so that the bound holds whatever it is.
            while self._lines and (len(self._lines) > self.max_lines or self._bytes > self.max_bytes):
                self._bytes -= self._lines.popleft().cost()

    def lines(self) -> list[LogLine]:
        """A copy of the lines kept, oldest first."""
        with self._guard:
            return list(self._lines)

    def size(self) -> tuple[int, int]:
        """(lines kept, their bytes as counted against ``max_bytes``)."""
        with self._guard:
            return len(self._lines), self._bytes
