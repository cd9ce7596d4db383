"""Measuring: in-process onnxruntime (the ceiling), and a server under a load generator, cell by cell."""

from __future__ import annotations

import functools
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import modelgen
import onnxruntime as ort

from .common import CONCURRENCIES, MODEL_STORE, say
from .cuda import CUDA_RUNTIME_FAILURE
from .measurement import Measurement, Mode, Row, SharedMemory, percentile_us
from .results import busy_note, fmt_rate, fmt_us
from .servers import Ports, running_server

if TYPE_CHECKING:
    from .cpu import Retries
    from .load import LoadGenerator
    from .models import Array, BenchModel


def measure_in_process(
    session: ort.InferenceSession, feeds: dict[str, Array], concurrency: int, seconds: float
) -> Measurement:
    """``concurrency`` threads, each running one request after another on the shared session."""
    start = threading.Barrier(concurrency + 1)
    deadline = 0.0

    def worker() -> list[float]:
        latencies: list[float] = []
        start.wait()
        now = time.perf_counter()
        while now < deadline:
            session.run(None, feeds)
            done = time.perf_counter()
            latencies.append(done - now)
            now = done
        return latencies

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(worker) for _ in range(concurrency)]
        began = time.perf_counter()
        deadline = began + seconds
        start.wait()
        latencies = [lat for future in futures for lat in future.result()]
        elapsed = time.perf_counter() - began
    return Measurement(len(latencies) / elapsed, percentile_us(latencies, 50), percentile_us(latencies, 99))


def edged_session_options() -> ort.SessionOptions:
    """What edged's onnxruntime backend sets for a model whose config has no parameters."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def measure_server(
    label: str,
    command: list[str],
    ports: Ports,
    models: Sequence[BenchModel],
    modes: Sequence[Mode],
    load: LoadGenerator,
    rows: dict[tuple[str, str, int], Row],
    shm: SharedMemory,
    retries: Retries,
    concurrencies: Sequence[int] = CONCURRENCIES,
    count_batches: bool = False,
    tls: ssl.SSLContext | None = None,
    name: str | None = None,
) -> None:
    """Measures each model, mode and concurrency on one server; ``count_batches`` also records the mean batch
    the server executed, from its statistics. ``tls``: the server serves HTTP over TLS, and this client context
    trusts it; ``name``: the server's, for its log and messages (the label by default)."""
    try:
        with running_server(name or label, command, ports.http, tls) as started:
            for model in models:
                for mode in modes:
                    for concurrency in concurrencies:
                        if mode.shared_memory and shm.unavailable:
                            continue
                        where = f"{name or label} {model.name} {mode.name} c={concurrency}"
                        measure = functools.partial(load.measure, model, mode, ports, concurrency, label)
                        if count_batches:
                            measure = functools.partial(_batches_counted, measure, ports.http, model.name)
                        result = retries.measure(where, measure, started.pid)
                        if mode.shared_memory and result.error and CUDA_RUNTIME_FAILURE.search(result.error):
                            shm.unavailable = f"perf_analyzer cannot run with --shared-memory system: {result.error}"
                            say(f"{where}: {shm.unavailable}; leaving the shared-memory rows out")
                            continue
                        setattr(rows[model.name, mode.name, concurrency], label, result)
                        if result.error:
                            say(f"{where}: FAILED: {result.error}")
                        else:
                            p99 = "unknown" if result.p99_us is None else f"{fmt_us(result.p99_us)} us"
                            unstable = "" if result.stable else " (unstable: mean of the last 3 windows)"
                            batch = "" if result.batch is None else f", mean batch {result.batch:.2f}"
                            say(
                                f"{where}: {fmt_rate(result.throughput)} infer/s, p50 {fmt_us(result.p50_us)} us, "
                                f"p99 {p99}{batch}{unstable} [{result.seconds:.0f} s]{busy_note(result)}"
                            )
    except RuntimeError as exc:
        say(f"{name or label}: FAILED: {exc}")
        names = {mode.name for mode in modes}
        for row in rows.values():
            if row.protocol in names:
                setattr(row, label, Measurement(error=str(exc)))


def _execution_counts(http_port: int, model: str) -> tuple[int, int] | None:
    """The model's inference and execution counts from the statistics extension (Triton's and edged's alike)."""
    try:
        url = f"http://127.0.0.1:{http_port}/v2/models/{model}/stats"
        with urllib.request.urlopen(url, timeout=5) as reply:
            stats = json.load(reply)["model_stats"]
        return sum(s["inference_count"] for s in stats), sum(s["execution_count"] for s in stats)
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return None


def _batches_counted(measure: Callable[[], Measurement], http_port: int, model: str) -> Measurement:
    """Runs ``measure`` and adds the mean batch the server executed meanwhile (perf_analyzer's warm-up included)."""
    before = _execution_counts(http_port, model)
    result = measure()
    after = _execution_counts(http_port, model)
    if before and after and after[1] > before[1]:
        result.batch = round((after[0] - before[0]) / (after[1] - before[1]), 2)
    return result


def in_process_session(model: BenchModel) -> ort.InferenceSession:
    """One session on the model's generated model.onnx, with the session options and provider edged gives a model
    without parameters: the ceiling edged can reach."""
    path = MODEL_STORE / model.name / "1" / modelgen.MODEL_FILENAME
    return ort.InferenceSession(str(path), edged_session_options(), providers=["CPUExecutionProvider"])
