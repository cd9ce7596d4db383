"""``--python``: what a Python-backend model costs.

The repository's add_sub_python (tests/testdata/python_models/add_sub_python, Triton's add_sub example as model.py,
two instances) against the ONNX add_sub with as many instances, both on edged (each Python request crosses to a
stub process and back), and against Triton's own Python backend serving the same model.py (where it passes
response parameters, it does so only when there are some, as Triton 2.51 requires) and config.pbtxt. perf_analyzer
drives each at concurrency 1, 8 and 16 with batch-1 requests (HTTP unless ``--protocols`` says otherwise). Its
results go under the ``python`` key of bench-results.json, beside what other runs left there.
"""

from __future__ import annotations

import argparse
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Final

import modelgen
import onnxruntime as ort

from .common import CONCURRENCIES, EDGED_REPO, MODEL_STORE, ROOT, TRITON_REPO, Phase
from .cpu import Retries, check_idle
from .load import choose_load
from .machine import machine_info
from .measure import measure_server
from .measurement import Row, SharedMemory, unary_modes
from .models import BenchModel, add_sub_inputs, generate_models, instance_group, link_model_file
from .results import (
    fmt_measured,
    fmt_ratio,
    fmt_us,
    markdown,
    p50_difference,
    print_caveats,
    print_saved,
    run_info,
    save_results,
)
from .servers import edged_command, free_ports, triton_command, triton_skipped

# The repository's Python add_sub model (Triton's add_sub example as model.py), copied unchanged into both servers'
# repositories: what edged's stub hop costs against the ONNX add_sub, and against Triton's own Python backend.
PYTHON_MODEL_SOURCE: Final = ROOT / "tests" / "testdata" / "python_models" / "add_sub_python"
PYTHON_MODEL: Final = PYTHON_MODEL_SOURCE.name
ONNX_MODEL: Final = "add_sub"


def python_models(quick: bool) -> list[BenchModel]:
    """add_sub_python and the ONNX add_sub: the same contract (FP32 [16] in and out, max_batch_size 8)."""
    add_sub_bytes = 16 * 4  # OUTPUT0 and OUTPUT1: FP32 [16]
    seconds, window_ms = (2.0, 1000) if quick else (5.0, 3000)
    return [BenchModel(name, seconds, window_ms, add_sub_bytes, add_sub_inputs) for name in (PYTHON_MODEL, ONNX_MODEL)]


def prepare_python_models(onnx: BenchModel) -> int:
    """Copies add_sub_python into edged's and Triton's repositories and writes the ONNX add_sub into edged's, with
    as many instances as add_sub_python's config gives; returns that count."""
    config = (PYTHON_MODEL_SOURCE / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8")
    counts = re.findall(r"\bcount:\s*(\d+)", config)
    if len(counts) != 1:
        raise RuntimeError(f"expected one instance_group count in {PYTHON_MODEL_SOURCE / modelgen.CONFIG_FILENAME}")
    instances = int(counts[0])
    generate_models([onnx])
    for repo in (EDGED_REPO, TRITON_REPO):
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(PYTHON_MODEL_SOURCE, repo / PYTHON_MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    source = MODEL_STORE / onnx.name
    target = EDGED_REPO / onnx.name
    (target / "1").mkdir(parents=True)
    onnx_config = (source / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8") + instance_group(instances)
    (target / modelgen.CONFIG_FILENAME).write_text(onnx_config, encoding="utf-8")
    link_model_file(source, target)
    return instances


PYTHON_HEADER: Final = (
    "conc",
    "protocol",
    "edged Python infer/s",
    "edged Python p50 us",
    "Triton Python infer/s",
    "Triton Python p50 us",
    "edged ONNX infer/s",
    "edged ONNX p50 us",
    "edged Python/Triton Python",
    "edged Python/edged ONNX",
    "stub hop p50 us",
)
PYTHON_TEXT_COLUMNS: Final = 2


def python_table(rows: Sequence[tuple[Row, Row]]) -> str:
    """One line per concurrency and protocol from pairs of rows: add_sub_python (edged and Triton), ONNX add_sub."""
    body = [
        (
            str(python.concurrency),
            python.protocol,
            fmt_measured(python.edged),
            fmt_us(python.edged.p50_us, python.edged.stable),
            fmt_measured(python.triton),
            fmt_us(python.triton.p50_us, python.triton.stable),
            fmt_measured(onnx.edged),
            fmt_us(onnx.edged.p50_us, onnx.edged.stable),
            fmt_ratio(python.edged, python.triton),
            fmt_ratio(python.edged, onnx.edged),
            p50_difference(python.edged, onnx.edged),
        )
        for python, onnx in rows
    ]
    return markdown(PYTHON_HEADER, body, PYTHON_TEXT_COLUMNS)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The Python-backend phase: add_sub_python against the ONNX add_sub on edged (the cost of the stub hop), and
    against Triton's Python backend serving the same model.py and config.pbtxt."""
    began = time.monotonic()
    quick = args.quick
    modes = unary_modes(args.protocols)
    machine = machine_info()
    chosen = choose_load(modes)
    if chosen is None:
        return 2
    load, modes, _ = chosen
    models = python_models(quick)
    python, onnx = models
    instances = prepare_python_models(onnx)
    retries = Retries.for_run(quick)
    rows = {(m.name, mode.name, c): Row(m.name, c, mode.name) for m in models for mode in modes for c in CONCURRENCIES}
    shm = SharedMemory()  # not used: these rows send tensors over the socket

    busy: dict[str, float] = {}
    ports = free_ports()
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged_command(ports), ports, models, modes, load, rows, shm, retries)
    triton_note = triton_skipped(args.skip_triton)
    if triton_note is None:
        ports = free_ports()
        busy["triton"] = check_idle("triton")
        measure_server("triton", triton_command(ports), ports, [python], modes, load, rows, shm, retries)
        triton_note = "Triton 2.51 (CPU build), Python backend, the same model.py and config.pbtxt as edged's"

    pairs = [(rows[python.name, mode.name, c], rows[onnx.name, mode.name, c]) for c in CONCURRENCIES for mode in modes]
    measured = [m for python_row, onnx_row in pairs for m in (python_row.edged, python_row.triton, onnx_row.edged)]
    print()
    print(python_table(pairs))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print(f"servers: {load.description}; conc = requests in flight (perf_analyzer --concurrency-range)")
    print(
        f"models: {python.name} ({PYTHON_MODEL_SOURCE.relative_to(ROOT)}: Triton's add_sub example as model.py) and "
        f"the ONNX {onnx.name} (scripts/modelgen.py); FP32 [1,16] inputs, max_batch_size 8, no dynamic batching, "
        f"instance_group count {instances} (KIND_CPU) each"
    )
    print("stub hop p50 us: edged Python p50 minus edged ONNX p50")
    if machine["edged"]:
        print(f"edged: {machine['edged']}")
    if triton_note:
        print(f"Triton: {triton_note}")
    labelled = [
        (row, label, m)
        for python_row, onnx_row in pairs
        for row, label, m in (
            (python_row, "edged", python_row.edged),
            (python_row, "triton", python_row.triton),
            (onnx_row, "edged", onnx_row.edged),
        )
    ]
    failed = print_caveats(measured, measured, busy, labelled)

    save_results(
        "python",
        {
            **run_info(argv, machine, load),
            "protocols": [m.name for m in modes],
            "triton": triton_note,
            "instances": instances,
            "cpu_busy_before": busy,
            "rows": [
                {
                    "concurrency": python_row.concurrency,
                    "protocol": python_row.protocol,
                    "edged_python": asdict(python_row.edged),
                    "triton_python": asdict(python_row.triton),
                    "edged_onnx": asdict(onnx_row.edged),
                }
                for python_row, onnx_row in pairs
            ],
        },
    )
    print_saved(began, "python")
    return 1 if failed else 0


PHASE: Final = Phase(
    "--python",
    "only the Python-backend comparison: add_sub_python against the ONNX add_sub and Triton's Python "
    "backend (HTTP unless --protocols says otherwise)",
    run,
)
