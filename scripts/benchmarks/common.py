"""What every phase shares: where things are, the protocols and concurrencies, progress messages and what a phase
is to the command line."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent.parent
BENCH_DIR: Final = ROOT / "bench-models"
MODEL_STORE: Final = BENCH_DIR / "models"
EDGED_REPO: Final = BENCH_DIR / "edged"
TRITON_REPO: Final = BENCH_DIR / "triton"
RESULTS_FILE: Final = BENCH_DIR / "bench-results.json"
# The bundled repository: what a device serves out of the box (--console, --footprint).
BUNDLED_REPO: Final = ROOT / "model_repository"
TOOLS: Final = ROOT.parent / "shared" / "tools"
PERF_ANALYZER: Final = TOOLS / "perf-analyzer"
TRITON_REFERENCE: Final = TOOLS / "triton-reference"
# perf_analyzer runs in a chroot; the files it writes are found under this root on the host.
PA_ROOT: Final = Path(os.environ.get("PA_ROOT", "/var/tmp/perf-analyzer-root"))
CONCURRENCIES: Final = (1, 8, 16)
PROTOCOLS: Final = ("http", "grpc")


def say(message: str) -> None:
    print(f"bench: {message}", flush=True)


@dataclass(frozen=True)
class Phase:
    """One phase of the benchmark, chosen by its flag (``--tls``); the protocols phase runs when none is given."""

    flag: str
    help: str
    # Runs the phase with the parsed options and the arguments as given (None: sys.argv); returns the exit status.
    run: Callable[[argparse.Namespace, list[str] | None], int]
