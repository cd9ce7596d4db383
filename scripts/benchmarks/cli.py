"""The command line: the options every phase shares and one flag per phase (PHASES); without one, the protocols
phase runs. A new phase is a module with a PHASE and one line in PHASES."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Final

import benchmarks

from . import backends, batching, console, footprint, protocols, python, sync, tls, workers
from .common import BENCH_DIR, PROTOCOLS, Phase

# In the order --help lists them.
PHASES: Final[tuple[Phase, ...]] = (
    batching.PHASE,
    tls.PHASE,
    python.PHASE,
    sync.PHASE,
    console.PHASE,
    footprint.PHASE,
    workers.PHASE,
    backends.PHASE,
)


def _protocols(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in PROTOCOLS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(PROTOCOLS)}, got {text!r}")
    return names


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench", description=benchmarks.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short measurements (by default: add_sub only)")
    group = parser.add_mutually_exclusive_group()
    for phase in PHASES:
        group.add_argument(phase.flag, action="store_true", help=phase.help)
    parser.add_argument("--skip-triton", action="store_true", help="do not measure Triton")
    parser.add_argument(
        "--protocols",
        type=_protocols,
        default=None,
        metavar="http,grpc",
        help="the protocols to measure (default: both; --batching and --python: http); grpc includes streaming",
    )
    parser.add_argument("--skip-shm", action="store_true", help="do not measure with system shared memory")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Stopped with SIGTERM (timeout, kill), it unwinds as for Ctrl-C, so the server it started is stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    BENCH_DIR.mkdir(exist_ok=True)
    chosen = next((phase for phase in PHASES if getattr(args, phase.flag.removeprefix("--"))), None)
    return chosen.run(args, argv) if chosen else protocols.run(args, argv)
