"""``--workers``: frontend worker processes (``--frontend-workers``) on the cores of this machine.

edged serves the ONNX add_sub (batch 1, FP32 [1,16], no dynamic batching) with 0, 1 and 2 frontend workers, and
perf_analyzer drives it over HTTP at concurrency 1, 8 and 16. Besides throughput and p50, each line gives the CPU
time per request of the daemon and of its workers together, from /proc over the whole perf_analyzer run (its
requests counted by the daemon's nv_inference_request_success), and how many of perf_analyzer's connections the
workers held (the kernel spreads new connections over the sockets sharing the port; read from /proc mid-run).

The daemon's CPU per request is what bounds the throughput once the workers have cores enough: the ratio of the
daemon's own per-request time without workers to its per-request time for relayed requests is how far a tiny
model's throughput can grow on a larger device. gRPC is left out: perf_analyzer's gRPC clients share one
connection, which one process serves whatever the count. Results go under the ``workers`` key of
bench-results.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

import modelgen

from .common import CONCURRENCIES, EDGED_REPO, MODEL_STORE, Phase, say
from .cpu import check_idle
from .load import choose_load
from .machine import machine_info
from .measurement import Measurement, unary_modes
from .models import BenchModel, add_sub_inputs, generate_models, link_model_file
from .results import fmt_measured, fmt_us, markdown, print_saved, run_info, save_results
from .servers import edged_command, free_ports, running_server

WORKER_COUNTS: Final = (0, 1, 2)
TICK_US: Final = 1e6 / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def worker_pids(daemon: int) -> list[int]:
    pids = []
    for pid in _children(daemon):
        try:
            if b"edged.daemon.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            continue
    return pids


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def requests_served(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("nv_inference_request_success{") and 'model="add_sub"' in line
    )


def connection_owners(port: int, pids: list[int]) -> dict[int, int]:
    """How many established connections on ``port`` each of ``pids`` holds."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(int(fields[9]))
    owners = {}
    for pid in pids:
        held = 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in inodes:
                held += 1
        owners[pid] = held
    return owners


def prepare(quick: bool) -> BenchModel:
    seconds, window_ms = (2.0, 1000) if quick else (5.0, 3000)
    model = BenchModel("add_sub", seconds, window_ms, 16 * 4, add_sub_inputs)
    generate_models([model])
    shutil.rmtree(EDGED_REPO, ignore_errors=True)
    source, target = MODEL_STORE / model.name, EDGED_REPO / model.name
    (target / "1").mkdir(parents=True)
    shutil.copy(source / modelgen.CONFIG_FILENAME, target / modelgen.CONFIG_FILENAME)
    link_model_file(source, target)
    return model


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    began = time.monotonic()
    machine = machine_info()
    modes = unary_modes(("http",))
    chosen = choose_load(modes)
    if chosen is None:
        return 2
    load, modes, _ = chosen
    (mode,) = modes
    model = prepare(args.quick)
    rows: list[dict[str, Any]] = []
    check_idle("workers")
    for count in WORKER_COUNTS:
        ports = free_ports()
        command = [*edged_command(ports), "--frontend-workers", str(count), "--allow-console", "false"]
        with running_server(f"edged-workers-{count}", command, ports.http, ready_line="edged ready") as started:
            workers = worker_pids(started.pid)
            if len(workers) != count:
                raise RuntimeError(f"expected {count} frontend workers, found {len(workers)}")
            for concurrency in CONCURRENCIES:
                requests_before = requests_served(ports.metrics)
                daemon_before, workers_before = cpu_ticks([started.pid]), cpu_ticks(workers)
                result: list[Measurement] = []
                runner = threading.Thread(
                    target=lambda out, p, c, label: out.append(load.measure(model, mode, p, c, label)),
                    args=(result, ports, concurrency, f"w{count}"),
                )
                runner.start()
                time.sleep(3.0)  # perf_analyzer has connected, and measures
                owners = connection_owners(ports.http, [started.pid, *workers])
                runner.join()
                requests = requests_served(ports.metrics) - requests_before
                daemon_us = (cpu_ticks([started.pid]) - daemon_before) * TICK_US / max(requests, 1)
                workers_us = (cpu_ticks(workers) - workers_before) * TICK_US / max(requests, 1)
                on_workers = sum(held for pid, held in owners.items() if pid != started.pid)
                measured = result[0]
                say(
                    f"{count} workers, conc {concurrency}: {fmt_measured(measured)} infer/s, daemon "
                    f"{daemon_us:.0f} us/request, workers {workers_us:.0f}, {on_workers}/{sum(owners.values())} "
                    "connections on workers"
                )
                rows.append(
                    {
                        "workers": count,
                        "concurrency": concurrency,
                        "throughput": measured.throughput,
                        "p50_us": measured.p50_us,
                        "stable": measured.stable,
                        "error": measured.error,
                        "daemon_cpu_us_per_request": daemon_us,
                        "workers_cpu_us_per_request": workers_us,
                        "connections_on_workers": on_workers,
                        "connections": sum(owners.values()),
                    }
                )
    header = ("workers", "conc", "infer/s", "p50 us", "daemon CPU us/req", "workers CPU us/req", "conns on workers")
    body = [
        (
            str(row["workers"]),
            str(row["concurrency"]),
            f"{row['throughput']:.0f}" if row["throughput"] else row["error"] or "-",
            fmt_us(row["p50_us"], row["stable"]),
            f"{row['daemon_cpu_us_per_request']:.0f}",
            f"{row['workers_cpu_us_per_request']:.0f}",
            f"{row['connections_on_workers']}/{row['connections']}",
        )
        for row in rows
    ]
    print()
    print(markdown(header, body, 2))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; {load.description}, HTTP")
    save_results("workers", {**run_info(argv, machine, load), "rows": rows})
    print_saved(began, "workers")
    return 0


PHASE: Final = Phase(
    "--workers",
    "only frontend workers: add_sub over HTTP with 0, 1 and 2 workers, with the daemon's and the workers' CPU time "
    "per request",
    run,
)
