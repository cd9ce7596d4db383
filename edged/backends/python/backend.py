"""The Python backend: Triton ``model.py`` files served unchanged, one supervised stub process per instance.

Load: the model's name and file name are checked (no shell metacharacters, ``..`` or ``/``), the interpreter is
chosen (``EXECUTION_ENV_PATH``), then every instance's stub is started at once and initialized with the ``args``
Triton passes. A failing ``initialize`` makes the version UNAVAILABLE with the exception's line as the reason.

Settings (``--backend-config=python,<key>=<value>``): ``stub-timeout-seconds`` (default 30: how long a finalize,
or a restart, may take before the stub is killed; as in Triton it does not bound execute),
``execute-timeout-seconds`` (default 0, none: how long one execute may run before its stub is killed and restarted,
an edged option), ``shm-default-byte-size`` (each ring's first size), ``env-cache-directory`` (where packed
execution environments are unpacked).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edged.backends.python.dispatch import SLOTS_PER_INSTANCE, Dispatcher, Slot
from edged.backends.python.environment import stub_interpreter
from edged.backends.python.instance import PythonInstance, stub_log
from edged.backends.python.model_state import ModelState
from edged.backends.python.process import StubGone, StubProcess, stub_environment
from edged.backends.python.wire import shm
from edged.core.backend_api import CustomMetric, CustomMetricFamily
from edged.core.config.model_config import model_config_from_json, model_config_to_json
from edged.core.devices import InstancePlacement, instance_placements
from edged.core.scheduling.rate_limiter import RATE_LIMITER
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edged.core.backend_api import LoadContext, ServerApi
    from edged.proto.model_config_pb2 import ModelConfig

log = logging.getLogger("edged.backends.python")

# Characters a shell would interpret: a model or file name holding one is refused, so no name can ever change
# what a command means even if one were built from it.
_SHELL_METACHARACTERS = re.compile(r"[\s;&|`$<>(){}\[\]*?!~#'\"\\]")


@dataclass(frozen=True, slots=True)
class Settings:
    stub_timeout_s: float = 30.0
    shm_default_byte_size: int = shm.DEFAULT_SIZE
    env_cache_dir: Path = field(
        default_factory=lambda: Path(tempfile.gettempdir()) / f"edged-python-envs-{os.getuid()}"
    )
    # 0: an execute may run as long as it needs (Triton has no such limit).
    execute_timeout_s: float = 0.0

    @classmethod
    def from_backend_config(cls, values: dict[str, str]) -> Settings:
        try:
            timeout = float(values.get("stub-timeout-seconds", "30"))
            size = int(values.get("shm-default-byte-size", str(shm.DEFAULT_SIZE)))
            execute_timeout = float(values.get("execute-timeout-seconds", "0"))
        except ValueError as exc:
            raise EdgedError(ErrorCode.INVALID_ARG, f"invalid --backend-config for the python backend: {exc}") from None
        if timeout <= 0 or size <= 0:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                "--backend-config python,stub-timeout-seconds and shm-default-byte-size must be positive",
            )
        if not execute_timeout >= 0:  # also refuses nan
            raise EdgedError(
                ErrorCode.INVALID_ARG, "--backend-config python,execute-timeout-seconds must be 0 (none) or positive"
            )
        cache = values.get("env-cache-directory")
        if cache:
            return cls(timeout, size, Path(cache), execute_timeout)
        return cls(timeout, size, execute_timeout_s=execute_timeout)


def check_name(what: str, value: str) -> None:
    if not value or value in (".", "..") or "/" in value or ".." in value or _SHELL_METACHARACTERS.search(value):
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"{what} '{value}' is refused by the python backend: names may not hold '/', '..', white space or shell "
            "metacharacters",
        )


class PythonBackend:
    def __init__(self, backend_config: dict[str, str], host: ServerApi | None) -> None:
        """``backend_config``: the ``--backend-config python,...`` settings; ``host``: the server BLS calls reach."""
        self._host = host
        self._settings: Settings | None = None
        self._settings_error: EdgedError | None = None
        try:
            self._settings = Settings.from_backend_config(backend_config)
        except EdgedError as exc:
            self._settings_error = exc
        # Custom metric families the models create, by name, as Triton keeps them: one family per name and one
        # series per label set, shared by every instance (and model) that creates the same ones. The ids a stub
        # gives its families and metrics are its own, so they are mapped per instance. Written from the
        # instances' reader threads, read by the metrics endpoint: under the lock.
        self._metric_families: dict[str, CustomMetricFamily] = {}
        self._metric_series: dict[tuple[str, tuple[tuple[str, str], ...]], CustomMetric] = {}
        self._metric_ids: dict[str, dict[str, Any]] = {}
        self._metrics_lock = threading.Lock()

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            assert self._settings_error is not None
            raise self._settings_error
        return self._settings

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        """Run the model's ``auto_complete_config`` in a throw-away stub. A model.py that never names the function
        has nothing to run, so no process is started for it."""
        check_name("model name", context.model_name)
        check_name("model file name", context.model_file.name)
        try:
            source = context.model_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return  # a missing file is reported by load, with the version it is missing from
        if "auto_complete_config" not in source:
            return
        stub = self._spawn(context, config, f"{context.model_name}_auto_complete")
        try:
            reply = stub.request_blocking(
                {
                    "t": "auto_complete",
                    "config": model_config_to_json(config).decode(),
                    "model_name": context.model_name,
                    **_paths(context),
                },
                "auto_complete_done",
                lambda message: stub_log(stub.name, message),
            )
        except StubGone as exc:
            raise EdgedError(
                ErrorCode.INTERNAL,
                f"auto-complete of model '{context.model_name}' failed: its stub process {exc}",
            ) from None
        finally:
            stub.close()
        if "error" in reply:
            raise EdgedError(
                ErrorCode.INVALID_ARG, f"auto-complete of model '{context.model_name}' failed: {reply['error']}"
            )
        completed = model_config_from_json(str(reply["config"]))
        config.CopyFrom(completed)

    def load(self, config: ModelConfig, context: LoadContext) -> PythonModel:
        check_name("model name", context.model_name)
        check_name("model file name", context.model_file.name)
        if not context.model_file.is_file():
            # Triton's words, with the path within the repository (the reason reaches clients).
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                "Failed to preinitialize Python stub: Python model file not found in "
                f"'{context.model_name}/{context.version}/{context.model_file.name}'",
            )
        settings = self.settings
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        interpreter = stub_interpreter(
            context.model_name, parameters.get("EXECUTION_ENV_PATH", ""), context.model_dir, settings.env_cache_dir
        )
        folder = f"<folder of model '{context.model_name}'>"
        private = {str(context.model_dir): folder, os.path.realpath(context.model_dir): folder}
        state = ModelState(
            config=config,
            settings_timeout_s=settings.stub_timeout_s,
            execute_timeout_s=settings.execute_timeout_s,
            shm_size=settings.shm_default_byte_size,
            interpreter=interpreter,
            env=stub_environment(os.environ, interpreter, sys.executable),
            init={
                "t": "init",
                "decoupled": bool(config.model_transaction_policy.decoupled),
                "outputs": [o.name for o in config.output],
                **_paths(context),
            },
            args={
                "model_config": model_config_to_json(config).decode(),
                "model_repository": str(context.model_dir),
                "model_version": str(context.version),
                "model_name": context.model_name,
            },
            record_metric=self.record_metric,
            host=self._host,
            # Longest first: the resolved folder may contain the given one, or the reverse.
            private_paths=tuple(sorted(private.items(), key=lambda item: -len(item[0]))),
        )
        instances = _start_instances(state, instance_placements(config, context.devices))
        # Behind the dynamic batcher a stub takes one batch at a time, so that requests wait in the batcher's queue
        # and join a batch there, as in Triton; alone, requests are pipelined to the stubs (see dispatch).
        # Behind the sequence batcher each instance is itself: a sequence stays on the stub it started on.
        choice = config.WhichOneof("scheduling_choice")
        slots = {"dynamic_batching": 1, "sequence_batching": 0}.get(choice or "", SLOTS_PER_INSTANCE)
        if RATE_LIMITER.on:
            slots = 0  # the rate limiter gates each instance itself, on its device, with its group's resources
        model = PythonModel(instances, slots, state)
        if state.host is not None:
            state.host.loop.call_soon_threadsafe(model.attach)
        return model

    def _spawn(self, context: LoadContext, config: ModelConfig, name: str) -> StubProcess:
        settings = self.settings
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        interpreter = stub_interpreter(
            context.model_name, parameters.get("EXECUTION_ENV_PATH", ""), context.model_dir, settings.env_cache_dir
        )
        try:
            return StubProcess(
                name,
                interpreter,
                stub_environment(os.environ, interpreter, sys.executable),
                settings.shm_default_byte_size,
            )
        except StubGone as exc:
            raise EdgedError(
                ErrorCode.INTERNAL, f"unable to start the stub of model '{context.model_name}': {exc}"
            ) from None

    def record_metric(self, instance: str, message: dict[str, Any]) -> None:
        """Custom metrics from a model (pb_utils.MetricFamily and its Metric): families, series and updates."""
        with self._metrics_lock:
            ids = self._metric_ids.setdefault(instance, {})
            op = message.get("op")
            if op == "family":
                name = str(message.get("name"))
                kind = _METRIC_KINDS.get(int(message.get("kind", -1)))
                if kind is None:
                    return
                family = self._metric_families.get(name)
                if family is None:
                    family = CustomMetricFamily(name, str(message.get("description", "")), kind)
                    self._metric_families[name] = family
                elif family.kind != kind:
                    log.warning("%s: metric family '%s' exists with another kind; ignored", instance, name)
                    return
                ids[f"family:{message.get('family')}"] = family
            elif op == "metric":
                family = ids.get(f"family:{message.get('family')}")
                if family is None:
                    return
                labels = {str(k): str(v) for k, v in (message.get("labels") or {}).items()}
                key = (family.name, tuple(sorted(labels.items())))
                metric = self._metric_series.get(key)
                if metric is None:
                    buckets = sorted(float(b) for b in message.get("buckets") or [])
                    metric = CustomMetric(labels, buckets=buckets, bucket_counts=[0] * (len(buckets) + 1))
                    self._metric_series[key] = metric
                    family.metrics.append(metric)
                ids[f"metric:{message.get('metric')}"] = metric
            elif op in ("increment", "set", "observe"):
                metric = ids.get(f"metric:{message.get('metric')}")
                if metric is None:
                    return
                value = float(message.get("value", 0.0))
                if op == "set":
                    metric.value = value
                    return
                metric.value += value
                if op == "observe":
                    metric.count += 1
                    metric.bucket_counts[bisect.bisect_left(metric.buckets, value)] += 1

    def custom_metrics(self) -> list[CustomMetricFamily]:
        """A snapshot of the models' metric families, for the metrics endpoint."""
        with self._metrics_lock:
            return [
                CustomMetricFamily(
                    family.name,
                    family.description,
                    family.kind,
                    [
                        CustomMetric(dict(m.labels), m.value, m.count, list(m.buckets), list(m.bucket_counts))
                        for m in family.metrics
                    ],
                )
                for family in self._metric_families.values()
            ]


# pb_utils.MetricFamily kinds: COUNTER, GAUGE, HISTOGRAM.
_METRIC_KINDS: dict[int, Literal["counter", "gauge", "histogram"]] = {0: "counter", 1: "gauge", 2: "histogram"}


def _paths(context: LoadContext) -> dict[str, Any]:
    return {
        "model_file": str(context.model_file),
        # pb_utils.get_model_dir(): the folder of the model file Triton names, <model>/<version>, even for a
        # Python-based backend whose model.py lives elsewhere.
        "model_dir": str(context.version_dir),
        # Triton appends the version folder, then the model folder, to sys.path.
        "paths": [str(context.version_dir), str(context.model_dir)],
    }


def _start_instances(state: ModelState, placements: Sequence[InstancePlacement]) -> list[PythonInstance]:
    """A stub for each placement (Triton's names, kinds and device ids; an NPU's id for KIND_MODEL when a device
    plug-in reports NPUs). Every stub starts at once; each then initializes while the others do."""
    instances = []
    for placement in placements:
        instance = PythonInstance(state, placement.name, placement.kind, placement.device_id)
        instance.placement = placement
        instances.append(instance)
    try:
        for instance in instances:
            instance.spawn()
        for instance in instances:
            instance.wait_initialized()
    except EdgedError:
        for instance in instances:
            instance.discard()
        raise
    return instances


class PythonModel:
    """A loaded version: its stub instances, and the slots through which the scheduler reaches them (dispatch)."""

    def __init__(self, instances: list[PythonInstance], slots_per_instance: int, state: ModelState) -> None:
        self._instances = instances
        self._state = state
        self._slots_per_instance = slots_per_instance
        self._dispatcher = Dispatcher(instances)
        count = len(instances)
        self._slots = [Slot(self._dispatcher, instances[i % count].name) for i in range(count * slots_per_instance)]
        self._leaving: list[PythonInstance] = []

    def resize(self, config: ModelConfig, context: LoadContext) -> tuple[list[Slot], list[Slot]]:
        """Start a stub for each instance the config's groups add, and stop sending to those they drop: returns the
        scheduler's slots (added, removed). Blocking; the dropped stubs stop in ``finish_resize``."""
        unused = list(self._instances)
        kept: list[PythonInstance] = []
        wanted: list[InstancePlacement] = []
        for placement in instance_placements(config, context.devices):
            same = next((i for i in unused if i.placement == placement), None)
            if same is None:
                wanted.append(placement)
            else:
                unused.remove(same)
                kept.append(same)
        # New stubs initialize with the new config, as a reload would give them.
        self._state.config = config
        self._state.args = {**self._state.args, "model_config": model_config_to_json(config).decode()}
        added = _start_instances(self._state, wanted)
        host = self._state.host
        if host is not None:
            asyncio.run_coroutine_threadsafe(self._switch(added, unused), host.loop).result()
        self._instances = kept + added
        self._leaving = unused
        per = self._slots_per_instance
        new_slots = (
            [Slot(self._dispatcher, added[i % len(added)].name) for i in range(len(added) * per)] if added else []
        )
        dropped = self._slots[len(self._slots) - len(unused) * per :] if unused else []
        self._slots = [slot for slot in self._slots if slot not in dropped] + new_slots
        return new_slots, dropped

    async def _switch(self, added: list[PythonInstance], removed: list[PythonInstance]) -> None:
        for instance in added:
            instance.attach()
        self._dispatcher.remove(removed)
        self._dispatcher.add(added)

    def finish_resize(self) -> None:
        """Stop the stubs ``resize`` dropped, once what they have in flight is answered. Blocking."""
        leaving, self._leaving = self._leaving, []
        deadline = time.monotonic() + self._state.settings_timeout_s
        while any(instance.in_flight for instance in leaving) and time.monotonic() < deadline:
            time.sleep(0.01)
        for instance in leaving:
            instance.begin_stop()
        for instance in leaving:
            instance.end_stop()

    @property
    def instances(self) -> Sequence[Slot | PythonInstance]:
        # No slots (sequence batching): the scheduler addresses each stub itself.
        return self._slots if self._slots_per_instance else self._instances

    def each_instance(self) -> list[PythonInstance]:
        """Each stub itself, for model_warmup: a slot runs on whichever stub is free."""
        return list(self._instances)

    def attach(self) -> None:
        for instance in self._instances:
            instance.attach()

    def is_ready(self) -> bool:
        return all(instance.is_ready() for instance in self._instances)

    def crash_count(self) -> int:
        return sum(instance.crashes for instance in self._instances)

    def instance_processes(self) -> list[tuple[str, int]]:
        """Each running stub's instance name and process id (edged.core.model_memory reads their memory)."""
        return [(instance.name, pid) for instance in self._instances if (pid := instance.pid) is not None]

    def unload(self) -> None:
        """finalize in every stub at once, then wait for each (killed past the stub timeout)."""
        self._dispatcher.fail_waiting(EdgedError(ErrorCode.UNAVAILABLE, "the model is unloading"))
        for instance in self._instances:
            instance.begin_stop()
        for instance in self._instances:
            instance.end_stop()
        self._instances = []
        self._slots = []
