"""CPU used by other processes: every measurement assumes an otherwise idle machine, records how far it was not,
and is taken again once when others disturbed it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from .common import say
from .measurement import BUSY_WARNING, Measurement

# How long a phase waits for other processes to leave the CPU before it starts anyway.
QUIET_WAIT_S: Final = 30.0
# Disturbed measurements are taken again, once each, within this much time in all (--quick: a quarter).
RETRY_BUDGET_S: Final = 120.0


def _process_ticks(stat: str) -> tuple[int, int]:
    """The session id and the CPU ticks (its own and those of children it waited for) of one /proc/PID/stat."""
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[3]), sum(int(value) for value in fields[11:15])  # session; utime stime cutime cstime


class CpuMeter:
    """The share of all CPUs used by other processes between ``start`` and ``stop``.

    "Ours" is this process with the children it has waited for (perf_analyzer among them) and every process in
    the session of the server under test (Triton's Python-backend stubs included). Interrupt and softirq time
    counts as busy: the kernel also charges it to the process it interrupted (loopback traffic, mostly).
    """

    def __init__(self, server_session: int | None = None) -> None:
        self.server_session = server_session
        self.begin: tuple[int, int, int] | None = None

    def _sample(self) -> tuple[int, int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
        busy = values[0] + values[1] + values[2] + values[5] + values[6]  # user nice system irq softirq
        ours = _process_ticks(Path("/proc/self/stat").read_text())[1]
        if self.server_session is not None:
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    with contextlib.suppress(OSError, ValueError, IndexError):  # processes come and go
                        session, ticks = _process_ticks(Path(entry.path, "stat").read_text())
                        if session == self.server_session:
                            ours += ticks
        return total, busy, ours

    def start(self) -> None:
        try:
            self.begin = self._sample()
        except (OSError, ValueError, IndexError):
            self.begin = None

    def stop(self) -> float | None:
        if self.begin is None:
            return None
        try:
            total, busy, ours = self._sample()
        except (OSError, ValueError, IndexError):
            return None
        total0, busy0, ours0 = self.begin
        others = (busy - busy0) - (ours - ours0)
        return round(max(0.0, others / max(1, total - total0)), 3)


def others_busy(seconds: float = 1.0) -> float:
    """The share of all CPUs that other processes use over the next ``seconds`` (0.0 where unknown)."""
    meter = CpuMeter()
    meter.start()
    time.sleep(seconds)
    return meter.stop() or 0.0


def wait_for_quiet(limit_s: float) -> float:
    """Waits up to ``limit_s`` for other processes to leave the CPU; returns the share they used last."""
    deadline = time.monotonic() + limit_s
    share = others_busy()
    while share > BUSY_WARNING and time.monotonic() < deadline:
        share = others_busy()
    return share


def check_idle(phase: str) -> float:
    """Every measurement assumes the machine is otherwise idle: waits a while for that, and says when it is not."""
    share = others_busy()
    if share > BUSY_WARNING:
        say(f"{share:.0%} of the CPU is busy with other processes; waiting up to {QUIET_WAIT_S:.0f} s for it to quiet")
        share = wait_for_quiet(QUIET_WAIT_S)
        if share > BUSY_WARNING:
            say(f"warning: {share:.0%} of the CPU is busy with other processes before the {phase} measurements")
    return share


def metered(measure: Callable[[], Measurement], server_session: int | None) -> Measurement:
    """Runs one measurement and records how long it took and how much CPU other processes used meanwhile."""
    meter = CpuMeter(server_session)
    meter.start()
    began = time.monotonic()
    result = measure()
    result.seconds = round(time.monotonic() - began, 1)
    result.others_cpu = meter.stop()
    return result


class Retries:
    """Takes a measurement that other processes disturbed again, once, after the CPU has quieted down.

    A time budget for the whole run keeps a machine that is busy throughout from doubling the run; the result
    kept is the less disturbed of the two.
    """

    def __init__(self, budget_s: float) -> None:
        self.left_s = budget_s

    @classmethod
    def for_run(cls, quick: bool) -> Retries:
        """The budget of a phase: RETRY_BUDGET_S, a quarter of it with --quick."""
        return cls(RETRY_BUDGET_S / 4 if quick else RETRY_BUDGET_S)

    def measure(self, where: str, measure: Callable[[], Measurement], server_session: int | None) -> Measurement:
        first = metered(measure, server_session)
        if not first.disturbed or first.error or self.left_s <= 0:
            return first
        began = time.monotonic()
        say(f"{where}: other processes used {first.others_cpu:.0%} of the CPU meanwhile; measuring it again")
        wait_for_quiet(min(30.0, self.left_s))
        second = metered(measure, server_session)
        self.left_s -= time.monotonic() - began
        if second.error or (second.others_cpu or 0.0) > (first.others_cpu or 0.0):
            return first
        return second
