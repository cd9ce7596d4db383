"""``--backends``: each framework backend against the framework called in-process on the same model, and against
itself isolated in a process per instance.

One model per installed framework, written for the run: an XGBoost forest served by the fil backend (1,000 trees of
depth 8 on 64 features), and the same multilayer perceptron (1024 -> 4096 -> 4096 -> 10, FP32) as TorchScript, as
OpenVINO IR (converted by OpenVINO from the PyTorch module) and as a TensorFlow SavedModel.

Each model is measured twice: with requests of one row, and with requests of many rows (64 for the forest, 16 for
the perceptron). edged: perf_analyzer at concurrency 8 over HTTP, the model with ``dynamic_batching`` tuned as
Triton's documentation tunes it for 8 clients (``preferred_batch_size`` of the 8 requests' rows and a queue delay
that only a missing request waits for). In-process: one thread calling the framework back to back on batches of
the 8 requests' rows, the most dynamic batching at 8 clients can reach. A framework that is not installed is left
out and named. The edged figures are taken twice: with the frameworks in the daemon, and isolated
(``--backend-config <backend>,isolation=process``). Results go under the ``backends`` key of bench-results.json.

Why both: one request costs about 230 us of CPU in client and server together on 2 cores (HTTP, binary tensors),
more than a row of the forest (about 65 us). With one row per request the protocol bounds the forest, and the
figure says what a client sending single rows gets; with many rows the backend does, and the figure says what it
costs to serve the framework through edged.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
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
# Large enough that execution, not the protocol, is most of a request of many rows, as for the ResNet-50 of the
# protocols phase: the goal (0.9 of in-process) is about batching and execution.
FEATURES: Final = 64
TREES: Final = 1000
WIDTH: Final = 1024
HIDDEN: Final = 4096
# A queue delay that 8 clients in a closed loop never reach: the batch goes when the 8th request arrives (about a
# millisecond after the first). Without preferred_batch_size and a delay, the batcher starts a batch whenever the
# instance is free, and 8 clients settle into batches of k and 8-k requests (4 on average), which these models run
# at nearly the cost of 8.
QUEUE_DELAY_US: Final = 20_000

Array = np.ndarray[Any, Any]
# Writes the model into its version folder 1 and returns the config's first lines (platform or backend, tensors,
# parameters) and a factory of in-process calls on a batch.
Builder = Callable[[Path], tuple[str, Callable[[Array], Callable[[], None]]]]


@dataclass(frozen=True)
class Framework:
    build: Builder
    backend: str  # edged's name for it
    label: str
    width: int  # features of a row
    rows: int  # rows of a request in the many-row measurement


def _rows(width: int, count: int) -> Array:
    return np.random.default_rng(0).random((count, width), dtype=np.float32)


def _batching(rows: int) -> str:
    batch = CONCURRENCY * rows
    return (
        f"max_batch_size: {batch}\n"
        f"dynamic_batching {{ preferred_batch_size: [ {batch} ] max_queue_delay_microseconds: {QUEUE_DELAY_US} }}\n"
    )


def _fil(folder: Path) -> tuple[str, Callable[[Array], Callable[[], None]]]:
    import treelite
    import xgboost

    rows = _rows(FEATURES, 2000)
    labels = (rows[:, 0] + rows[:, 1] > 1.0).astype(np.int32)
    parameters = {"objective": "binary:logistic", "max_depth": 8}
    booster = xgboost.train(parameters, xgboost.DMatrix(rows, label=labels), TREES)
    (folder / "1").mkdir(parents=True)
    booster.save_model(folder / "1" / "xgboost.json")
    head = (
        'backend: "fil"\n'
        f'input [{{ name: "input__0", data_type: TYPE_FP32, dims: [ {FEATURES} ] }}]\n'
        'output [{ name: "output__0", data_type: TYPE_FP32, dims: [ 1 ] }]\n'
        'parameters [{ key: "model_type", value: { string_value: "xgboost_json" } },'
        ' { key: "output_class", value: { string_value: "true" } }]\n'
    )
    forest = treelite.frontend.load_xgboost_model(str(folder / "1" / "xgboost.json"), format_choice="json")
    return head, lambda batch: lambda: treelite.gtil.predict(forest, batch)


def _mlp() -> Any:
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 10)).eval()


def _pytorch(folder: Path) -> tuple[str, Callable[[Array], Callable[[], None]]]:
    import torch

    trace: Any = torch.jit.trace
    module = trace(_mlp(), torch.from_numpy(_rows(WIDTH, CONCURRENCY)))
    (folder / "1").mkdir(parents=True)
    module.save(str(folder / "1" / "model.pt"))
    head = (
        'platform: "pytorch_libtorch"\n'
        f'input [{{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ {WIDTH} ] }}]\n'
        'output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 10 ] }]\n'
    )

    def calls(batch: Array) -> Callable[[], None]:
        tensor = torch.from_numpy(batch)

        def call() -> None:
            with torch.inference_mode():
                module(tensor)

        return call

    return head, calls


def _openvino(folder: Path) -> tuple[str, Callable[[Array], Callable[[], None]]]:
    import openvino
    import torch

    model = openvino.convert_model(_mlp(), example_input=torch.from_numpy(_rows(WIDTH, CONCURRENCY)))
    model.reshape([-1, WIDTH])
    model.inputs[0].set_names({"input"})
    model.outputs[0].set_names({"output"})
    (folder / "1").mkdir(parents=True)
    openvino.save_model(model, str(folder / "1" / "model.xml"))
    request = openvino.Core().compile_model(str(folder / "1" / "model.xml"), "CPU").create_infer_request()
    return 'backend: "openvino"\n', lambda batch: lambda: request.infer({"input": batch})


def _tensorflow(folder: Path) -> tuple[str, Callable[[Array], Callable[[], None]]]:
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
    (folder / "1").mkdir(parents=True)
    tf.saved_model.save(module, str(folder / "1" / "model.savedmodel"), signatures={"serving_default": serve})

    def calls(batch: Array) -> Callable[[], None]:
        tensor = tf.constant(batch)
        return lambda: serve(tensor)

    return 'platform: "tensorflow_savedmodel"\n', calls


FRAMEWORKS: Final = {
    "fil_xgboost": Framework(_fil, "fil", "fil (Treelite, XGBoost model)", FEATURES, 64),
    "pytorch_mlp": Framework(_pytorch, "pytorch", "pytorch (TorchScript)", WIDTH, 16),
    "openvino_mlp": Framework(_openvino, "openvino", "openvino (IR)", WIDTH, 16),
    "tensorflow_mlp": Framework(_tensorflow, "tensorflow", "tensorflow (SavedModel)", WIDTH, 16),
}


def _variants(name: str, framework: Framework, head: str) -> list[tuple[str, int]]:
    """The one-row model and the many-row one (a second model folder sharing the first's version folder), each
    with its config: (model name, rows of a request)."""
    variants = []
    for rows in (1, framework.rows):
        model = name if rows == 1 else f"{name}_x{rows}"
        folder = EDGED_REPO / model
        if rows > 1:
            folder.mkdir()
            (folder / "1").symlink_to(Path("..") / name / "1")
        (folder / "config.pbtxt").write_text(head + _batching(rows), encoding="utf-8")
        variants.append((model, rows))
    return variants


@dataclass(frozen=True)
class _Served:
    framework: str
    rows: int  # of a request
    call: Callable[[], None]  # in-process, on a batch of the 8 requests' rows


def _in_process(call: Callable[[], None], rows: int, seconds: float) -> Measurement:
    for _ in range(5):
        call()
    count = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        call()
        count += 1
    elapsed = time.perf_counter() - began
    return Measurement(throughput=count * rows / elapsed, p50_us=elapsed / count * 1e6, seconds=elapsed)


def _in_process_all(served: dict[str, _Served], seconds: float, when: str) -> dict[str, Measurement]:
    measured = {}
    for model, what in served.items():
        say(f"measuring {model} in-process, {when} (batches of {CONCURRENCY * what.rows} rows)")
        measured[model] = _in_process(what.call, CONCURRENCY * what.rows, seconds)
    return measured


def _mean(first: Measurement, second: Measurement) -> Measurement:
    """The two runs' mean, marked unstable (printed with ~) when they are more than 10% apart."""
    assert first.throughput and second.throughput and first.p50_us and second.p50_us
    spread = abs(first.throughput - second.throughput) / max(first.throughput, second.throughput)
    return Measurement(
        throughput=(first.throughput + second.throughput) / 2,
        p50_us=(first.p50_us + second.p50_us) / 2,
        stable=spread <= 0.1,
        seconds=(first.seconds or 0) + (second.seconds or 0),
    )


def batch(row: Row) -> str:
    """The mean batch edged executed, from its statistics."""
    return f"{row.edged.batch:.1f}" if row.edged.batch else "-"


def ratio(row: Row) -> str:
    """edged over in-process."""
    return fmt_ratio(row.edged, row.in_process)


def _build(missing: list[str]) -> dict[str, _Served]:
    served: dict[str, _Served] = {}
    for name, framework in FRAMEWORKS.items():
        try:
            head, calls = framework.build(EDGED_REPO / name)
        except ImportError as exc:
            missing.append(f"{framework.label}: {exc.name or exc} is not installed")
            continue
        for model, rows in _variants(name, framework, head):
            served[model] = _Served(name, rows, calls(_rows(framework.width, CONCURRENCY * rows)))
    return served


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
    missing: list[str] = []
    served = _build(missing)
    rows = {model: Row(model, CONCURRENCY, "http") for model in served}
    busy = {"in-process": check_idle("in-process")}
    before = _in_process_all(served, seconds, "before edged")
    models = [BenchModel(model, seconds, window_ms, 64, lambda: {}, rows=what.rows) for model, what in served.items()]
    keyed = {(model, "http", CONCURRENCY): row for model, row in rows.items()}
    busy["edged"] = check_idle("edged")
    retries = Retries.for_run(args.quick)
    ports = free_ports()
    measure_server("edged", edged_command(ports), ports, models, modes, load, keyed, SharedMemory(), retries,
                   concurrencies=(CONCURRENCY,), count_batches=True)  # fmt: skip
    # The same models with every framework in a process per instance (--backend-config <backend>,isolation=process).
    isolated = {model: Row(model, CONCURRENCY, "http") for model in served}
    keyed = {(model, "http", CONCURRENCY): row for model, row in isolated.items()}
    isolation = [f"--backend-config={f.backend},isolation=process" for f in FRAMEWORKS.values()]
    measure_server("edged", [*edged_command(ports), *isolation], ports, models, modes, load, keyed, SharedMemory(),
                   retries, concurrencies=(CONCURRENCY,), count_batches=True, name="edged-isolated")  # fmt: skip
    # This machine's speed drifts by 10-20% over minutes: in-process is measured before and after edged, and the
    # ratio is against the mean of the two.
    after = _in_process_all(served, seconds, "after edged")
    for model, row in rows.items():
        row.in_process = _mean(before[model], after[model])
    header = (
        "model",
        "backend",
        "rows/request",
        f"in-process rows/s (batches of {CONCURRENCY} requests' rows)",
        f"edged rows/s (conc {CONCURRENCY})",
        "ratio",
        "mean batch (rows)",
        "isolated rows/s",
        "isolated/in the daemon",
    )
    body = [
        (model, FRAMEWORKS[what.framework].label, str(what.rows), fmt_measured(rows[model].in_process),
         fmt_measured(rows[model].edged), ratio(rows[model]), batch(rows[model]),
         fmt_measured(isolated[model].edged), fmt_ratio(isolated[model].edged, rows[model].edged))
        for model, what in served.items()
    ]  # fmt: skip
    print()
    print(markdown(header, body, 2))
    print()
    machine = machine_info()
    print(
        f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; {load.description.replace(', batch 1', '')}, "
        f"HTTP, dynamic batching with preferred_batch_size of {CONCURRENCY} requests and a "
        f"{QUEUE_DELAY_US} us queue delay"
    )
    for note in missing:
        print(f"left out: {note}")
    save_results(
        "backends",
        {**run_info(argv, machine, load), "missing": missing, "cpu_busy_before": busy,
         "rows": [{"model": model, "rows_per_request": served[model].rows, "in_process": asdict(row.in_process),
                   "edged": asdict(row.edged), "edged_isolated": asdict(isolated[model].edged)}
                  for model, row in rows.items()]},
    )  # fmt: skip
    print_saved(began, "backends")
    return 0


PHASE: Final = Phase(
    "--backends",
    "only the framework backends (fil, pytorch, openvino, tensorflow) against each framework in-process",
    run,
)
