"""Memory of a process and of the processes under it, from /proc: Rss, Pss and USS (Private_Clean +
Private_Dirty) from smaps_rollup, threads from status, and the mappings that hold it from smaps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Memory:
    """KiB."""

    rss: int = 0
    pss: int = 0
    uss: int = 0

    def add(self, other: Memory) -> None:
        self.rss += other.rss
        self.pss += other.pss
        self.uss += other.uss


def _fields(text: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, colon, rest = line.partition(":")
        parts = rest.split()
        if colon and parts and parts[0].isdigit():
            values[key] = int(parts[0])
    return values


def _memory(values: dict[str, int]) -> Memory:
    private = values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)
    return Memory(values.get("Rss", 0), values.get("Pss", 0), private)


@dataclass
class Process:
    pid: int
    name: str
    command: str
    threads: int
    memory: Memory


def descendants(root: int) -> list[int]:
    """``root`` and every process under it, parents first, from /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        after = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        children.setdefault(int(after[1]), []).append(int(stat.parent.name))
    found = [root]
    for pid in found:
        found.extend(sorted(children.get(pid, [])))
    return found


def _process(pid: int) -> Process:
    status = Path(f"/proc/{pid}/status").read_text()
    name = next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Name:"))
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    command = " ".join(part.decode(errors="replace") for part in argv if part)
    return Process(pid, name, command, _fields(status)["Threads"], rollup(pid))


def tree(root: int) -> list[Process]:
    processes = []
    for pid in descendants(root):
        try:
            processes.append(_process(pid))
        except (OSError, StopIteration, KeyError):  # gone meanwhile
            continue
    return processes


def mappings(pid: int) -> list[dict[str, Any]]:
    """The process's mappings grouped by what they map (a file, ``[heap]``, ``[anon]``...), largest Pss first."""
    groups: dict[str, tuple[Memory, list[int]]] = {}
    current: Memory | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:
            # "start-end perms offset dev inode [pathname]" begins each mapping.
            name = head[5].strip() if len(head) == 6 else "[anon]"
            memory, count = groups.setdefault(name, (Memory(), [0]))
            count[0] += 1
            current = memory
            continue
        key, _, rest = line.partition(":")
        if current is None or not rest.split() or not rest.split()[0].isdigit():
            continue
        value = int(rest.split()[0])
        if key == "Rss":
            current.rss += value
        elif key == "Pss":
            current.pss += value
        elif key in ("Private_Clean", "Private_Dirty"):
            current.uss += value
    ordered = sorted(groups.items(), key=lambda item: item[1][0].pss, reverse=True)
    return [
        {"mapping": name, "mappings": count[0], "rss_kib": m.rss, "pss_kib": m.pss, "uss_kib": m.uss}
        for name, (m, count) in ordered
    ]


def rollup(pid: int) -> Memory:
    """The process's own memory (smaps_rollup), without the processes under it."""
    return _memory(_fields(Path(f"/proc/{pid}/smaps_rollup").read_text()))
