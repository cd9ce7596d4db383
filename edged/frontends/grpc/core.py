"""grpc's C core, imported with the settings edged serves with: the core reads them once, when grpc is first
imported, so this runs before anything else imports grpc (the package's ``__init__``, which the daemon imports
first).

The listener. grpc 1.85's default (EventEngine's listener) reads and writes every connection on its own worker
threads, which then hand each finished operation to grpc.aio's poller thread and from there to the event loop.
The older listener polls the connections from the thread that polls the completion queue, one hand-off fewer
each way: measured under perf_analyzer on add_sub (batch 1, concurrency 1), 14 context switches per unary call
against 8, and 10-20% less CPU per call, unary and streaming alike. grpc still ships that path behind the
``event_engine_listener`` experiment, which is turned off here unless the environment sets ``GRPC_EXPERIMENTS``
itself; a grpc that no longer knows the experiment keeps its default.
"""

from __future__ import annotations

import os
import sys
from typing import Final

ENVIRONMENT: Final = "GRPC_EXPERIMENTS"
EXPERIMENTS: Final = "-event_engine_listener"


def import_core() -> None:
    """Imports grpc with edged's settings, leaving the environment as it was (child processes inherit it)."""
    if "grpc" in sys.modules:
        return  # imported already, with whatever settings it was imported with
    chosen = os.environ.get(ENVIRONMENT)
    if chosen is None:
        os.environ[ENVIRONMENT] = EXPERIMENTS
    try:
        import grpc  # noqa: F401
    finally:
        if chosen is None:
            del os.environ[ENVIRONMENT]
