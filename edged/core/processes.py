"""What edged's own processes use, read from Linux's ``/proc``: the daemon and every process under it (the Python
backend's stub processes, an isolated model's instances, frontend workers), for the console's Health card, and one
process tree's memory, for a model's page.

Memory is the resident set (RSS) of each process, summed: pages two processes share (libraries, the Python
backend's shared-memory rings) count once per process, so the sum is an upper bound. PSS (``smaps_rollup``) would
not double-count them, but walks every page table on each read; RSS is one short read of ``/proc/<pid>/stat``.

CPU is the processes' user and system time between two readings, as a share of all the host's CPUs (the share the
host's own figure is): 1.0 is every CPU busy with edged. A process that ended between two readings takes the time
of its last interval with it.

Every reader takes the ``/proc`` root as a parameter (tests give them a tree of their own) and never raises for a
process that is gone or a file that is missing: what cannot be read is left out, or None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")
PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcessStat:
    """One process as ``/proc/<pid>/stat`` has it."""

    pid: int
    ppid: int
    cpu_ticks: int  # user + system time, in clock ticks (CLOCK_TICKS a second)
    rss_bytes: int


def read_stat(pid: int, proc: Path = PROC) -> ProcessStat | None:
    """The process's stat line; None when it is gone or the line cannot be read."""
    try:
        text = (proc / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
        # The command name (field 2) is in parentheses and may itself hold spaces and ')': the fields after it
        # start after the last ')'. fields[0] is then field 3 (the state), fields[n - 3] field n.
        fields = text[text.rindex(")") + 2 :].split()
        return ProcessStat(pid, int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE_SIZE)
    except (OSError, ValueError, IndexError):
        return None


def process_tree(root: int, proc: Path = PROC) -> list[int]:
    """``root`` and every process under it, ``root`` first; empty when ``root`` is gone.

    Read from each thread's ``task/<tid>/children`` (a few small reads for the daemon's threads and its children),
    or, on a kernel without that file (CONFIG_PROC_CHILDREN), from every process's parent in ``/proc``."""
    if not (proc / str(root)).is_dir():
        return []
    found = [root]
    index = 0
    while index < len(found):
        children = _children(found[index], proc)
        if children is None:
            return _tree_by_parents(root, proc)
        found.extend(pid for pid in children if pid not in found)
        index += 1
    return found


def _children(pid: int, proc: Path) -> list[int] | None:
    """The children of every thread of ``pid``; None when the kernel has no children files."""
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return []  # gone meanwhile: nothing under it either
    children: list[int] = []
    for task in tasks:
        try:
            text = (task / "children").read_text(encoding="ascii")
        except FileNotFoundError:
            if task.is_dir():
                return None  # the thread is there, its children file is not: the kernel does not offer them
            continue  # the thread ended meanwhile
        except OSError:
            continue
        children.extend(int(word) for word in text.split() if word.isdigit())
    return children


def _tree_by_parents(root: int, proc: Path) -> list[int]:
    parents: dict[int, list[int]] = {}
    try:
        entries = [entry.name for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return [root]
    for name in entries:
        stat = read_stat(int(name), proc)
        if stat is not None:
            parents.setdefault(stat.ppid, []).append(stat.pid)
    found = [root]
    index = 0
    while index < len(found):
        found.extend(pid for pid in sorted(parents.get(found[index], ())) if pid not in found)
        index += 1
    return found


def tree_memory(root: int, proc: Path = PROC) -> int | None:
    """The RSS of ``root`` and every process under it, in bytes; None when ``root`` is gone."""
    stats = [stat for stat in (read_stat(pid, proc) for pid in process_tree(root, proc)) if stat is not None]
    return sum(stat.rss_bytes for stat in stats) if stats else None


@dataclass(frozen=True, slots=True)
class TreeUsage:
    """What a process tree used: its CPU share since the previous reading (None at the first), its memory."""

    cpu_utilization: float | None  # 0.0 - 1.0 of all the host's CPUs
    rss_bytes: int | None
    processes: int


class ProcessTreeUsage:
    """Reads one process tree (by default this process's) each ``read``: its CPU since the previous reading and its
    memory now. Blocking (files): the metrics history calls it from a worker thread, one call at a time."""

    def __init__(
        self,
        root: int | None = None,
        proc: Path = PROC,
        *,
        cpu_count: int | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = root if root is not None else os.getpid()
        self._proc = proc
        # The host's CPUs, all of them, as /proc/stat's aggregate counts them (not this process's affinity).
        self._cpus = cpu_count or os.cpu_count() or 1
        self._monotonic = monotonic
        self._ticks: dict[int, int] = {}
        self._at: float | None = None

    def read(self) -> TreeUsage:
        at = self._monotonic()
        pids = process_tree(self._root, self._proc)
        stats = [stat for stat in (read_stat(pid, self._proc) for pid in pids) if stat is not None]
        ticks = {stat.pid: stat.cpu_ticks for stat in stats}
        utilization = None
        if self._at is not None and at > self._at and stats:
            # A process new since the previous reading counts all its time: it started within the interval (a pid
            # reused as fast is as rare as it would be harmless for one point).
            spent = sum(max(0, now - self._ticks.get(pid, 0)) for pid, now in ticks.items())
            utilization = min(1.0, spent / CLOCK_TICKS / ((at - self._at) * self._cpus))
        self._ticks, self._at = ticks, at
        memory = sum(stat.rss_bytes for stat in stats) if stats else None
        return TreeUsage(utilization, memory, len(stats))
