"""``--backends``: each framework backend against the framework called in-process on the same model.

One model per installed framework, written for the run: an XGBoost forest served by the fil backend (1,000 trees of
depth 8 on 64 features), and the same multilayer perceptron (1024 -> 4096 -> 4096 -> 10, FP32) as TorchScript, as
OpenVINO IR (converted by OpenVINO from the PyTorch module) and as a TensorFlow SavedModel. In-process: one thread
calling the framework on batches of 8 rows back to back, the rate dynamic batching at 8 clients can reach. edged:
perf_analyzer at concurrency 8 with batch-1 requests over HTTP, the model with ``dynamic_batching``. A framework
that is not installed is left out and named. Results go under the ``backends`` key of bench-results.json.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Final

import numpy as np

from .common import EDGED_REPO, Phase, say
from .cpu import Retries, check_idle
from .load import choose_load
from .machine import machine_info
from .measure import measure_server
from .measurement import Measurement, Row, SharedMemory, unary_modes
from .models import BenchModel
from .results import fmt_measured, fmt_ratio, markdown, print_saved, run_info, save_results
from .servers import edged_command, free_ports

CONCURRENCY: Final = 8
BATCH: Final = 8
# Large enough that execution, not the protocol, is most of a request, as for the ResNet-50 of the protocols phase:
# the goal (0.9 of in-process) is about batching and execution, and a tiny model measures the protocol instead.
FEATURES: Final = 64
TREES: Final = 1000
WIDTH: Final = 1024
HIDDEN: Final = 4096


# Batches of what is queued, without waiting (a queue delay made every model slower here: with max_batch_size 64
# and 8 clients, each batch waited the whole delay).
BATCHING: Final = "dynamic_batching {}"


def _rows(width: int, count: int = BATCH) -> np.ndarray[Any, Any]:
    return np.random.default_rng(0).random((count, width), dtype=np.float32)


def _config(backend: str, inputs: str, outputs: str, extra: str = "") -> str:
    return f"{backend}\nmax_batch_size: 64\n{BATCHING}\n{inputs}\n{outputs}\n{extra}"


def _fil() -> Callable[[], None]:
    import treelite
    import xgboost

    rows = _rows(FEATURES, 2000)
    labels = (rows[:, 0] + rows[:, 1] > 1.0).astype(np.int32)
    parameters = {"objective": "binary:logistic", "max_depth": 8}
    booster = xgboost.train(parameters, xgboost.DMatrix(rows, label=labels), TREES)
    folder = EDGED_REPO / "fil_xgboost"
    (folder / "1").mkdir(parents=True)
    booster.save_model(folder / "1" / "xgboost.json")
    (folder / "config.pbtxt").write_text(
        _config(
            'backend: "fil"',
            f'input [{{ name: "input__0", data_type: TYPE_FP32, dims: [ {FEATURES} ] }}]',
            'output [{ name: "output__0", data_type: TYPE_FP32, dims: [ 1 ] }]',
            'parameters [{ key: "model_type", value: { string_value: "xgboost_json" } },'
            ' { key: "output_class", value: { string_value: "true" } }]',
        ),
        encoding="utf-8",
    )
    forest = treelite.frontend.load_xgboost_model(str(folder / "1" / "xgboost.json"), format_choice="json")
    batch = _rows(FEATURES)
    return lambda: treelite.gtil.predict(forest, batch)


def _mlp() -> Any:
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 10)).eval()


def _pytorch() -> Callable[[], None]:
    import torch

    trace: Any = torch.jit.trace
    module = trace(_mlp(), torch.from_numpy(_rows(WIDTH)))
    folder = EDGED_REPO / "pytorch_mlp"
    (folder / "1").mkdir(parents=True)
    module.save(str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text(
        _config(
            'platform: "pytorch_libtorch"',
            f'input [{{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ {WIDTH} ] }}]',
            'output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 10 ] }]',
        ),
        encoding="utf-8",
    )
    batch = torch.from_numpy(_rows(WIDTH))

    def call() -> None:
        with torch.inference_mode():
            module(batch)

    return call


def _openvino() -> Callable[[], None]:
    import openvino
    import torch

    model = openvino.convert_model(_mlp(), example_input=torch.from_numpy(_rows(WIDTH)))
    model.reshape([-1, WIDTH])
    model.inputs[0].set_names({"input"})
    model.outputs[0].set_names({"output"})
    folder = EDGED_REPO / "openvino_mlp"
    (folder / "1").mkdir(parents=True)
    openvino.save_model(model, str(folder / "1" / "model.xml"))
    (folder / "config.pbtxt").write_text(f'backend: "openvino"\nmax_batch_size: 64\n{BATCHING}\n', "utf-8")
    request = openvino.Core().compile_model(str(folder / "1" / "model.xml"), "CPU").create_infer_request()
    batch = _rows(WIDTH)
    return lambda: request.infer({"input": batch})


def _tensorflow() -> Callable[[], None]:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    weights = [layer.weight.detach().numpy().T for layer in _mlp() if hasattr(layer, "weight")]
    biases = [layer.bias.detach().numpy() for layer in _mlp() if hasattr(layer, "bias")]
    module = tf.Module()
    module.variables_ = [tf.Variable(w) for w in weights] + [tf.Variable(b) for b in biases]

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])  # type: ignore[untyped-decorator]
    def serve(x: Any) -> dict[str, Any]:
        for i in range(3):
            x = tf.matmul(x, module.variables_[i]) + module.variables_[3 + i]
            if i < 2:
                x = tf.nn.relu(x)
        return {"y": x}

    module.serve = serve
    folder = EDGED_REPO / "tensorflow_mlp"
    (folder / "1").mkdir(parents=True)
    tf.saved_model.save(module, str(folder / "1" / "model.savedmodel"), signatures={"serving_default": serve})
    (folder / "config.pbtxt").write_text(
        f'platform: "tensorflow_savedmodel"\nmax_batch_size: 64\n{BATCHING}\n', "utf-8"
    )
    batch = tf.constant(_rows(WIDTH))
    return lambda: serve(batch)


FRAMEWORKS: Final = {
    "fil_xgboost": (_fil, "fil (Treelite, XGBoost model)", FEATURES),
    "pytorch_mlp": (_pytorch, "pytorch (TorchScript)", WIDTH),
    "openvino_mlp": (_openvino, "openvino (IR)", WIDTH),
    "tensorflow_mlp": (_tensorflow, "tensorflow (SavedModel)", WIDTH),
}


def _in_process(call: Callable[[], None], seconds: float) -> Measurement:
    for _ in range(20):
        call()
    count = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        call()
        count += 1
    elapsed = time.perf_counter() - began
    return Measurement(throughput=count * BATCH / elapsed, p50_us=elapsed / count * 1e6, seconds=elapsed)


def batch(row: Row) -> str:
    """The mean batch edged executed, from its statistics."""
    return f"{row.edged.batch:.1f}" if row.edged.batch else "-"


def ratio(row: Row) -> str:
    """edged over in-process."""
    return fmt_ratio(row.edged, row.in_process)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    began = time.monotonic()
    seconds, window_ms = (2.0, 1000) if args.quick else (5.0, 3000)
    modes = unary_modes(("http",))
    chosen = choose_load(modes)
    if chosen is None:
        return 2
    load, modes, _ = chosen
    shutil.rmtree(EDGED_REPO, ignore_errors=True)
    EDGED_REPO.mkdir(parents=True)
    calls: dict[str, Callable[[], None]] = {}
    missing: list[str] = []
    for name, (build, label, _) in FRAMEWORKS.items():
        try:
            calls[name] = build()
        except ImportError as exc:
            missing.append(f"{label}: {exc.name or exc} is not installed")
    rows = {name: Row(name, CONCURRENCY, "http") for name in calls}
    busy = {"in-process": check_idle("in-process")}
    for name, call in calls.items():
        say(f"measuring {name} in-process (batches of {BATCH})")
        rows[name].in_process = _in_process(call, seconds)
    models = [BenchModel(name, seconds, window_ms, 64, lambda: {}) for name in calls]
    keyed = {(name, "http", CONCURRENCY): row for name, row in rows.items()}
    busy["edged"] = check_idle("edged")
    retries = Retries.for_run(args.quick)
    ports = free_ports()
    measure_server("edged", edged_command(ports), ports, models, modes, load, keyed, SharedMemory(), retries,
                   concurrencies=(CONCURRENCY,), count_batches=True)  # fmt: skip
    header = (
        "model",
        "backend",
        f"in-process rows/s (batches of {BATCH})",
        "edged infer/s (conc 8)",
        "ratio",
        "mean batch",
    )
    body = [
        (name, FRAMEWORKS[name][1], fmt_measured(row.in_process), fmt_measured(row.edged), ratio(row), batch(row))
        for name, row in rows.items()
    ]
    print()
    print(markdown(header, body, 2))
    print()
    machine = machine_info()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; {load.description}, HTTP, dynamic batching")
    for note in missing:
        print(f"left out: {note}")
    save_results(
        "backends",
        {**run_info(argv, machine, load), "missing": missing, "cpu_busy_before": busy,
         "rows": [{"model": name, "in_process": asdict(row.in_process), "edged": asdict(row.edged)}
                  for name, row in rows.items()]},
    )  # fmt: skip
    print_saved(began, "backends")
    return 0


PHASE: Final = Phase(
    "--backends",
    "only the framework backends (fil, pytorch, openvino, tensorflow) against each framework in-process",
    run,
)
