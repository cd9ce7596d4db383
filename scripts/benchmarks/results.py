"""The one results writer: bench-results.json, and the tables and notes each phase prints."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from .common import RESULTS_FILE, ROOT
from .measurement import BUSY_WARNING, Measurement, Row

if TYPE_CHECKING:
    from .load import LoadGenerator

# --------------------------------------------------------------------------------------------------------
# bench-results.json


def run_header(argv: list[str] | None) -> dict[str, Any]:
    """What every phase's results begin with: when, and the command."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["scripts/bench", *(argv if argv is not None else sys.argv[1:])]),
    }


def run_info(argv: list[str] | None, machine: dict[str, Any], load: LoadGenerator) -> dict[str, Any]:
    """What the server phases' results begin with: when, the command, the machine and the load generator."""
    return {**run_header(argv), "machine": machine, "load_generator": load.description}


def write_results(results: dict[str, Any]) -> None:
    """Replaces bench-results.json with ``results`` (what the protocols and batching phases do: they own the file)."""
    staged = RESULTS_FILE.with_name(f".{RESULTS_FILE.name}.tmp")
    staged.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    staged.replace(RESULTS_FILE)


def save_results(key: str, value: dict[str, Any]) -> None:
    """Puts ``value`` under ``key`` in bench-results.json and keeps the file's other keys (other phases' results)."""
    results: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        existing = json.loads(RESULTS_FILE.read_text(encoding="utf-8"))
        if isinstance(existing, dict):
            results = existing
    results[key] = value
    write_results(results)


# --------------------------------------------------------------------------------------------------------
# tables

# The first columns of a table, left-aligned, name what a line is; the others hold figures.
TEXT_COLUMNS: Final = 3


def busy_note(result: Measurement) -> str:
    if not result.disturbed:
        return ""
    return f" (disturbed: other processes used {result.others_cpu:.0%} of the CPU meanwhile)"


def fmt_rate(value: float | None, stable: bool = True) -> str:
    if value is None:
        return "-"
    text = f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"
    return text if stable else f"~{text}"


def fmt_us(value: float | None, stable: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if stable else f"~{value:,.0f}"


def fmt_ratio(a: Measurement, b: Measurement) -> str:
    if a.throughput is None or not b.throughput:
        return "-"
    ratio = f"{a.throughput / b.throughput:.2f}"
    return ratio if a.stable and b.stable else f"~{ratio}"


def fmt_measured(m: Measurement) -> str:
    """Throughput, with ~ when perf_analyzer found no stable windows and ! when other processes disturbed it."""
    text = fmt_rate(m.throughput, m.stable)
    return f"{text}!" if m.disturbed and m.throughput is not None else text


def p50_difference(a: Measurement, b: Measurement) -> str:
    """How much longer ``a``'s median request takes than ``b``'s."""
    if a.p50_us is None or b.p50_us is None:
        return "-"
    difference = f"{a.p50_us - b.p50_us:+,.0f}"
    return difference if a.stable and b.stable else f"~{difference}"


def markdown(header: Sequence[str], body: Sequence[Sequence[str]], text_columns: int) -> str:
    """Names (the first ``text_columns``) left-aligned, figures right-aligned: also valid Markdown."""
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i < text_columns else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|" + "|".join("-" * (w + 2) if i < text_columns else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    )
    return "\n".join([line(header), rule, *(line(cells) for cells in body)])


def print_caveats(
    served: Sequence[Measurement],
    measured: Sequence[Measurement],
    busy: dict[str, float],
    labelled: Sequence[tuple[Row, str, Measurement]],
) -> bool:
    """What the figures of a table need said: unstable (``~``, among the servers' ``served``) and disturbed (``!``,
    among all ``measured``) figures, a busy machine before a phase, and the measurements that failed (True when
    any did)."""
    if any(not m.stable for m in served):
        print("~: perf_analyzer found no three windows within 10%; mean of its last three windows, p99 unknown")
    disturbed = [m for m in measured if m.disturbed]
    if disturbed:
        print(
            f"!: other processes used more than {BUSY_WARNING:.0%} of the CPU during that measurement "
            f"({len(disturbed)} of them); those figures are likely low: measure them again"
        )
    if any(share > BUSY_WARNING for share in busy.values()):
        print(
            "warning: other processes used the CPU before "
            + ", ".join(f"{phase} ({share:.0%})" for phase, share in busy.items() if share > BUSY_WARNING)
        )
    failures = [
        f"{row.model} {row.protocol} c={row.concurrency} {label}: {m.error}" for row, label, m in labelled if m.error
    ]
    for failure in failures:
        print(f"failed: {failure}")
    return bool(failures)


def served_cells(rows: Sequence[Row]) -> list[tuple[Row, str, Measurement]]:
    """Each row's edged and Triton measurements, labelled, as print_caveats takes them."""
    return [(row, label, m) for row in rows for label, m in (("edged", row.edged), ("triton", row.triton))]


def print_saved(began: float, key: str | None = None) -> None:
    """A phase's last line: where its results went (under ``key``) and how long the phase took."""
    where = str(RESULTS_FILE.relative_to(ROOT)) + (f", key {key}" if key else "")
    print(f"results: {where} ({time.monotonic() - began:.0f} s)")
