"""``--batching``: dynamic batching on the ResNet-50-shaped model.

1. in-process: one thread running ``InferenceSession.run`` on batches of 1, 2, 4, 8 and 16 images back to back;
   the best images per second is the ceiling every ratio divides by;
2. edged and Triton, each serving four models over the same model.onnx: without batching and with
   ``dynamic_batching``, each with one and with two instances, driven by perf_analyzer at concurrency 1, 4, 8 and
   16 with batch-1 requests (HTTP unless ``--protocols`` says otherwise). The servers' statistics give the mean
   batch they executed.
"""

from __future__ import annotations

import argparse
import functools
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import modelgen
import numpy as np
import onnxruntime as ort

from .common import EDGED_REPO, MODEL_STORE, TRITON_REPO, Phase, say
from .cpu import Retries, check_idle
from .load import choose_load
from .machine import machine_info, triton_description
from .measure import in_process_session, measure_in_process, measure_server
from .measurement import Measurement, Row, SharedMemory, unary_modes
from .models import (
    TRITON_MODEL_PY,
    BenchModel,
    generate_models,
    instance_group,
    link_model_file,
    python_backend,
    resnet50_inputs,
)
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

# The in-process ceiling: one session running batches of these sizes back to back; 16 is max_batch_size.
BATCH_SIZES: Final = (1, 2, 4, 8, 16)
BATCHING_CONCURRENCIES: Final = (1, 4, 8, 16)
BATCHING_QUICK_CONCURRENCIES: Final = (1, 8)
# How long a batch waits for more requests after its oldest one arrived. It matters only when an instance is idle:
# while every instance runs, the next batch gathers in the queue anyway. 2 ms lets the requests of clients that
# were answered together (one batch) arrive and be parsed, yet costs a lone request (concurrency 1, about 40 ms a
# run on 2 cores) only 5%. No preferred_batch_size: onnxruntime on this CPU gains little from any one batch size,
# so a batch goes when the delay has passed or it is full.
BATCHING_QUEUE_DELAY_US: Final = 2000


@dataclass(frozen=True)
class Variant:
    """One way to serve the ResNet-50-shaped model: a model of its own in each server's repository."""

    name: str
    dynamic_batching: bool
    instances: int

    @property
    def label(self) -> str:
        batching = "dynamic batching" if self.dynamic_batching else "no batching"
        return f"{batching}, {self.instances} instance{'s' if self.instances > 1 else ''}"

    def config(self, base: str, source: Path) -> str:
        """``base`` (the generated config.pbtxt) renamed, with this variant's instances and batching."""
        config, count = re.subn(r'(?m)^name: "[^"]*"$', f'name: "{self.name}"', base)
        if count != 1:
            raise RuntimeError(f"unexpected config.pbtxt layout in {source}")
        config += instance_group(self.instances)
        if self.dynamic_batching:
            config += f"dynamic_batching {{\n  max_queue_delay_microseconds: {BATCHING_QUEUE_DELAY_US}\n}}\n"
        return config


VARIANTS: Final = (
    Variant("resnet50_1", dynamic_batching=False, instances=1),
    Variant("resnet50_2", dynamic_batching=False, instances=2),
    Variant("resnet50_batching_1", dynamic_batching=True, instances=1),
    Variant("resnet50_batching_2", dynamic_batching=True, instances=2),
)


def batching_model(quick: bool) -> BenchModel:
    # Windows of 3 s hold 5 or more batches of 16 (about 0.6 s each on 2 cores), enough for a steady rate.
    return BenchModel("resnet50", 3.0 if quick else 8.0, 1500 if quick else 3000, 1000 * 4, resnet50_inputs)


def prepare_batching_models(model: BenchModel) -> list[BenchModel]:
    """Writes one model per variant, all over the same model.onnx, into edged's and Triton's repositories."""
    generate_models([model])
    source = MODEL_STORE / model.name
    base = (source / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8")
    for repo in (EDGED_REPO, TRITON_REPO):
        shutil.rmtree(repo, ignore_errors=True)
        for variant in VARIANTS:
            target = repo / variant.name
            (target / "1").mkdir(parents=True)
            config = variant.config(base, source)
            if repo == TRITON_REPO:
                config = python_backend(source, config)
                (target / "1" / "model.py").write_text(TRITON_MODEL_PY, encoding="utf-8")
            (target / modelgen.CONFIG_FILENAME).write_text(config, encoding="utf-8")
            link_model_file(source, target)
    return [
        BenchModel(v.name, model.in_process_s, model.window_ms, model.output_bytes, model.make_inputs) for v in VARIANTS
    ]


def run_in_process_batches(model: BenchModel, retries: Retries) -> dict[int, Measurement]:
    """One thread running batches of each size back to back on one session; throughput in images per second."""
    session = in_process_session(model)
    image = model.make_inputs()
    results: dict[int, Measurement] = {}
    for size in BATCH_SIZES:
        feeds = {name: np.repeat(array, size, axis=0) for name, array in image.items()}
        for _ in range(2):  # first runs of a new shape allocate the arena
            session.run(None, feeds)
        measure = functools.partial(measure_in_process, session, feeds, 1, model.in_process_s)
        result = retries.measure(f"in-process {model.name} batch {size}", measure, None)
        if result.throughput is not None:
            result.throughput *= size
        result.batch = size
        results[size] = result
        say(
            f"in-process {model.name} batch {size}: {fmt_rate(result.throughput)} images/s, "
            f"p50 {fmt_us(result.p50_us)} us a batch{busy_note(result)}"
        )
    return results


BATCHING_HEADER: Final = (
    "variant",
    "conc",
    "protocol",
    "edged infer/s",
    "edged/in-process best",
    "edged p50 us",
    "edged batch",
    "Triton infer/s",
    "Triton/in-process best",
    "Triton p50 us",
    "Triton batch",
)


def batching_table(rows: Sequence[Row]) -> str:
    labels = {variant.name: variant.label for variant in VARIANTS}

    def batch(m: Measurement) -> str:
        return "-" if m.batch is None else f"{m.batch:.1f}"

    body = [
        (
            labels.get(row.model, row.model),
            str(row.concurrency),
            row.protocol,
            fmt_measured(row.edged),
            fmt_ratio(row.edged, row.in_process),
            fmt_us(row.edged.p50_us, row.edged.stable),
            batch(row.edged),
            fmt_measured(row.triton),
            fmt_ratio(row.triton, row.in_process),
            fmt_us(row.triton.p50_us, row.triton.stable),
            batch(row.triton),
        )
        for row in rows
    ]
    return markdown(BATCHING_HEADER, body, TEXT_COLUMNS)


def in_process_table(results: dict[int, Measurement]) -> str:
    body = [(str(size), fmt_measured(m), fmt_us(m.p50_us)) for size, m in sorted(results.items())]
    return markdown(("batch", "in-process images/s", "p50 us a batch"), body, 0)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The dynamic-batching phase: edged and Triton serving the ResNet-50-shaped model with and without dynamic
    batching, one and two instances, against the best batch throughput of in-process onnxruntime."""
    began = time.monotonic()
    quick = args.quick
    modes = unary_modes(args.protocols)
    machine = machine_info()
    chosen = choose_load(modes)
    if chosen is None:
        return 2
    load, modes, _ = chosen
    model = batching_model(quick)
    concurrencies = BATCHING_QUICK_CONCURRENCIES if quick else BATCHING_CONCURRENCIES
    variants = prepare_batching_models(model)
    retries = Retries.for_run(quick)
    busy: dict[str, float] = {}
    busy["in-process"] = check_idle("in-process")
    say(f"measuring in-process onnxruntime at batch {', '.join(map(str, BATCH_SIZES))}")
    in_process = run_in_process_batches(model, retries)
    best_size = max(BATCH_SIZES, key=lambda size: in_process[size].throughput or 0.0)
    best = in_process[best_size]
    say(f"in-process best: {fmt_rate(best.throughput)} images/s at batch {best_size}")
    rows = {
        (v.name, m.name, c): Row(v.name, c, m.name, in_process=best)
        for v in variants
        for m in modes
        for c in concurrencies
    }
    shm = SharedMemory()  # not used: batching rows send tensors over the socket

    ports = free_ports()
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged_command(ports), ports, variants, modes, load, rows, shm, retries, concurrencies, True)
    triton_note = triton_skipped(args.skip_triton)
    if triton_note is None:
        ports = free_ports()
        busy["triton"] = check_idle("triton")
        measure_server(
            "triton", triton_command(ports), ports, variants, modes, load, rows, shm, retries, concurrencies, True
        )
        triton_note = triton_description() + "; model.py runs each batch as one session.run"

    ordered = [rows[v.name, m.name, c] for v in variants for m in modes for c in concurrencies]
    print()
    print(in_process_table(in_process))
    print()
    print(batching_table(ordered))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print(
        f"in-process best: {fmt_rate(best.throughput)} images/s at batch {best_size} (one InferenceSession, edged's "
        "session options, one thread running batches back to back); every ratio divides by it"
    )
    print(f"servers: {load.description}; conc = requests in flight (perf_analyzer --concurrency-range)")
    print(
        f"dynamic batching: max_batch_size 16, max_queue_delay_microseconds {BATCHING_QUEUE_DELAY_US}, "
        "no preferred_batch_size; instances: instance_group count, KIND_CPU"
    )
    print("batch: inferences per model execution on the server during the measurement (its statistics)")
    if machine["edged"]:
        print(f"edged: {machine['edged']}")
    if triton_note:
        print(f"Triton: {triton_note}")
    served = [m for _, _, m in served_cells(ordered)]
    failed = print_caveats(served, [*served, *in_process.values()], busy, served_cells(ordered))

    write_results(
        {
            **run_info(argv, machine, load),
            "protocols": [m.name for m in modes],
            "triton": triton_note,
            "cpu_busy_before": busy,
            "batching": {
                "max_queue_delay_microseconds": BATCHING_QUEUE_DELAY_US,
                "variants": {v.name: asdict(v) | {"label": v.label} for v in VARIANTS},
                "in_process": {str(size): asdict(m) for size, m in in_process.items()},
                "in_process_best_batch": best_size,
                "rows": [asdict(row) for row in ordered],
            },
        }
    )
    print_saved(began)
    return 1 if failed else 0


PHASE: Final = Phase(
    "--batching",
    "only the dynamic-batching comparison on resnet50 (HTTP unless --protocols says otherwise)",
    run,
)
