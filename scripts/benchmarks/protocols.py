"""The default phase: add_sub and the ResNet-50-shaped model in-process, on edged and on Triton, over every
protocol (HTTP, gRPC unary and streaming, both with system shared memory) at concurrency 1, 8 and 16."""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Final

import onnxruntime as ort

from .common import CONCURRENCIES, PROTOCOLS, say
from .cpu import Retries, check_idle
from .load import choose_load
from .machine import machine_info, triton_description
from .measure import in_process_session, measure_in_process, measure_server
from .measurement import MODES, Measurement, Row
from .models import BenchModel, bench_models, prepare_models, prepare_triton_models
from .results import (
    TEXT_COLUMNS,
    busy_note,
    fmt_measured,
    fmt_rate,
    fmt_ratio,
    fmt_us,
    markdown,
    print_caveats,
    print_saved,
    run_info,
    served_cells,
    write_results,
)
from .servers import edged_command, free_ports, triton_command, triton_skipped

TABLE_HEADER: Final = (
    "model",
    "conc",
    "protocol",
    "in-process infer/s",
    "edged infer/s",
    "edged/in-process",
    "edged p50 us",
    "Triton infer/s",
    "edged/Triton",
    "Triton p50 us",
)


def run_in_process(models: Sequence[BenchModel], retries: Retries) -> dict[tuple[str, int], Measurement]:
    results: dict[tuple[str, int], Measurement] = {}
    for model in models:
        session = in_process_session(model)
        feeds = model.make_inputs()
        for _ in range(3):  # first runs allocate the arena and pick kernels
            session.run(None, feeds)
        for concurrency in CONCURRENCIES:
            measure = functools.partial(measure_in_process, session, feeds, concurrency, model.in_process_s)
            result = retries.measure(f"in-process {model.name} c={concurrency}", measure, None)
            results[model.name, concurrency] = result
            say(f"in-process {model.name} c={concurrency}: {fmt_rate(result.throughput)} infer/s{busy_note(result)}")
    return results


def table(rows: Sequence[Row]) -> str:
    body: list[tuple[str, ...]] = [
        (
            row.model,
            str(row.concurrency),
            row.protocol,
            fmt_measured(row.in_process),
            fmt_measured(row.edged),
            fmt_ratio(row.edged, row.in_process),
            fmt_us(row.edged.p50_us, row.edged.stable),
            fmt_measured(row.triton),
            fmt_ratio(row.edged, row.triton),
            fmt_us(row.triton.p50_us, row.triton.stable),
        )
        for row in rows
    ]
    return markdown(TABLE_HEADER, body, TEXT_COLUMNS)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    began = time.monotonic()
    models = bench_models(args.quick)
    protocols = args.protocols or PROTOCOLS
    modes = [m for m in MODES if m.protocol in protocols and not (args.skip_shm and m.shared_memory)]
    machine = machine_info()
    prepare_models(models)
    chosen = choose_load(modes)
    if chosen is None:
        return 2
    load, modes, shm = chosen
    rows = {(m.name, p.name, c): Row(m.name, c, p.name) for m in models for p in modes for c in CONCURRENCIES}

    retries = Retries.for_run(args.quick)
    busy: dict[str, float] = {}
    busy["in-process"] = check_idle("in-process")
    say("measuring in-process onnxruntime")
    in_process = run_in_process(models, retries)
    for row in rows.values():
        row.in_process = in_process[row.model, row.concurrency]

    ports = free_ports()
    edged = edged_command(ports)
    client_shm = any(m.shared_memory for m in modes) and not shm.unavailable
    if client_shm:
        edged.append("--allow-client-shm=true")  # off by default, as in Triton
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged, ports, models, modes, load, rows, shm, retries)

    triton_note = triton_skipped(args.skip_triton)
    if triton_note is None:
        prepare_triton_models(models)
        ports = free_ports()
        busy["triton"] = check_idle("triton")
        measure_server("triton", triton_command(ports), ports, models, modes, load, rows, shm, retries)
        triton_note = triton_description() + ", instance_group count 1"

    shown = [m for m in modes if not (m.shared_memory and shm.unavailable)]
    ordered = [rows[m.name, p.name, c] for m in models for c in CONCURRENCIES for p in shown]
    print()
    print(table(ordered))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print("in-process: one InferenceSession, edged's session options, N threads in a closed loop, batch 1")
    print(f"servers: {load.description}; conc = requests in flight (perf_analyzer --concurrency-range)")
    notes = [
        (any(m.name == "http" for m in shown), "http: HTTP/REST with the binary tensor extension"),
        (any(m.name == "grpc" for m in shown), "grpc: ModelInfer, one call in flight per concurrent client"),
        (any(m.streaming for m in shown), "grpc stream: ModelStreamInfer (--streaming), one stream per client"),
        (
            any(m.shared_memory for m in shown),
            "shm: inputs and outputs in system shared memory regions perf_analyzer registers "
            "(--shared-memory system), unary calls",
        ),
    ]
    for shown_here, note in notes:
        if shown_here:
            print(f"  {note}")
    edged_notes = [str(machine["edged"])] if machine["edged"] else []
    if client_shm:
        edged_notes.append("started with --allow-client-shm=true (client shared memory is off by default)")
    if edged_notes:
        print(f"edged: {'; '.join(edged_notes)}")
    if shm.unavailable:
        print(f"shared memory: not measured: {shm.unavailable}")
    if triton_note:
        print(f"Triton: {triton_note}")
    served = [m for _, _, m in served_cells(ordered)]
    failed = print_caveats(served, [*served, *(row.in_process for row in ordered)], busy, served_cells(ordered))

    write_results(
        {
            **run_info(argv, machine, load),
            "protocols": [m.name for m in shown],
            "shared_memory": shm.unavailable or ("measured" if client_shm else "not asked for"),
            "triton": triton_note,
            "cpu_busy_before": busy,
            "rows": [asdict(row) for row in ordered],
        }
    )
    print_saved(began)
    return 1 if failed else 0
