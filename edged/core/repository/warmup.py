"""Triton's ``model_warmup``: the samples a model version runs on every instance before it is READY.

Each ``ModelWarmup`` becomes ``batch_size`` requests of one row each (a batch of that many rows), with inputs of
zeros, random bytes or the raw bytes of ``<model dir>/warmup/<input_data_file>``; they run together ``count``
times (at least once) on each instance, the instances side by side. A sample with ``batch_size`` 0 is skipped, as
Triton skips it. Any error fails the load with Triton's texts: the version goes UNAVAILABLE and a version already
serving keeps serving.

Building a sample happens before any instance runs it, so a missing or short data file fails the load without
running the model. Requests go through the same checks a client's request does (edged.core.request.validation),
so a warmup input of the wrong type or shape gets the message a client would; inputs the config does not name
are handed to the model as they are, as Triton hands them (they may be a sequence model's control inputs).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.core.request.datatypes import WIRE_NAME_BY_CONFIG
from edged.core.request.inference import InferInput, InferRequest
from edged.core.request.tensors import binary_dtype, bytes_array, deserialize_bytes_tensor, element_size
from edged.core.request.validation import validate_request
from edged.core.stats import ExecutionTiming
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from edged.core.backend_api import BackendInstance, BackendModel
    from edged.core.request.validation import ModelSignature
    from edged.proto.model_config_pb2 import ModelConfig, ModelWarmup

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"
_NO_ID = "[request id: <id_unknown>] "
_STRING = "BYTES"


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One ``ModelWarmup`` ready to run: its requests (checked once) and how many times to run them."""

    name: str
    count: int
    batch_size: int
    requests: tuple[InferRequest, ...]

    def fresh_requests(self) -> list[InferRequest]:
        """New request objects over the same tensors: a backend may mark a request (cancelled, run again)."""
        now = time.monotonic_ns()
        return [replace(r, inputs=list(r.inputs), arrival_ns=now) for r in self.requests]


def warmup_file(model_dir: Path, name: str) -> Path | None:
    """The data file ``input_data_file`` names, or None when the name leads outside the warmup folder."""
    folder = (model_dir / WARMUP_FOLDER).resolve()
    path = (folder / name).resolve()
    return path if path.is_relative_to(folder) and path != folder else None


def build_samples(config: ModelConfig, model_dir: Path, signature: ModelSignature) -> list[WarmupSample]:
    """Every sample of the config, checked; EdgedError with Triton's text for the first one that is wrong."""
    samples: list[WarmupSample] = []
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            log.debug("Skipping batch 0 warmup sample '%s'", setting.name)
            continue
        log.debug("Generating warmup sample data for '%s'", setting.name)
        samples.append(_build_sample(config, model_dir, signature, setting))
    return samples


def _build_sample(
    config: ModelConfig, model_dir: Path, signature: ModelSignature, setting: ModelWarmup
) -> WarmupSample:
    batching = config.max_batch_size > 0
    model_inputs: list[InferInput] = []
    extra_inputs: list[InferInput] = []
    for name, meta in setting.inputs.items():
        dims = tuple(int(d) for d in meta.dims)
        if any(d < 0 for d in dims):
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"warmup setting expects all variable-size dimensions are specified for input '{name}'",
            )
        datatype = WIRE_NAME_BY_CONFIG.get(meta.data_type, "INVALID")
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        raw = _input_bytes(name, meta, datatype, count, model_dir)
        known = name in signature.inputs
        shape = ((1,) if batching and known else ()) + dims
        tensor = InferInput(name, datatype, shape, None, raw)
        if known:
            model_inputs.append(tensor)
        else:
            # Triton's "override" input: not in the config, so not checked against it; batched as the rest are.
            tensor.shape = ((1,) if batching else ()) + dims
            tensor.data = _array(tensor)
            extra_inputs.append(tensor)
    requests: list[InferRequest] = []
    for _ in range(setting.batch_size):
        inputs = [replace(t) for t in model_inputs]
        request = InferRequest(config.name, -1, "", inputs)
        validate_request(signature, request)
        request.inputs.extend(extra_inputs)
        requests.append(request)
    return WarmupSample(setting.name, max(setting.count, 1), setting.batch_size, tuple(requests))


def _input_bytes(name: str, meta: ModelWarmup.Input, datatype: str, count: int, model_dir: Path) -> bytes:
    """The tensor's bytes in the wire form: STRING elements length-prefixed, zeros and random data as Triton
    makes them (random STRING data is zeros, i.e. empty strings)."""
    size = element_size(datatype) if datatype != _STRING else None
    byte_size = count * (size if size else 4)
    kind = meta.WhichOneof("input_data_type")
    if kind == "zero_data" or (kind == "random_data" and datatype == _STRING):
        return bytes(byte_size)
    if kind == "random_data":
        return os.urandom(byte_size)
    if kind == "input_data_file":
        path = warmup_file(model_dir, meta.input_data_file)
        if path is None:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"warmup setting input_data_file '{meta.input_data_file}' for input '{name}' must name a file in "
                f"the model's '{WARMUP_FOLDER}' folder",
            )
        try:
            data = path.read_bytes()
        except OSError as exc:
            reason = os.strerror(exc.errno or errno.EIO)
            raise EdgedError(
                ErrorCode.INTERNAL,
                f"failed to open text file for read {model_dir / WARMUP_FOLDER / meta.input_data_file}: {reason}",
            ) from None
        if datatype == _STRING:
            return data
        if byte_size > len(data):
            # Triton's text, the missing space after the file name included.
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{_NO_ID}warmup setting expects {byte_size} bytes, but the data provided from "
                f"{meta.input_data_file}only has {len(data)} bytes",
            )
        return data[:byte_size]
    raise EdgedError(
        ErrorCode.INVALID_ARG, f"{_NO_ID}warmup setting expects input '{name}' to have input_data_type set"
    )


def _array(tensor: InferInput) -> np.ndarray[Any, Any]:
    raw = tensor.raw if tensor.raw is not None else b""
    if tensor.datatype == _STRING:
        elements = deserialize_bytes_tensor(raw, tensor.name)
        shape = tensor.shape if len(elements) == int(np.prod(tensor.shape, dtype=np.int64)) else (len(elements),)
        return bytes_array(elements, shape)
    dtype = binary_dtype(tensor.datatype)
    if dtype is None:
        raise EdgedError(ErrorCode.INVALID_ARG, f"invalid datatype for input {tensor.name}")
    return np.frombuffer(raw, dtype=dtype).reshape(tensor.shape)


def run_warmup(config: ModelConfig, model_dir: Path, signature: ModelSignature, model: BackendModel) -> None:
    """Build the samples and run each ``count`` times on every instance, the instances at the same time as Triton
    warms them (each in its own thread: an instance runs one batch at a time); from the load thread. EdgedError
    (Triton's "failed to run warmup sample ..." for a failed run) of the first instance that failed."""
    samples = build_samples(config, model_dir, signature)
    if not samples:
        return
    each_instance = getattr(model, "each_instance", None)
    instances: list[BackendInstance] = list(each_instance() if each_instance is not None else model.instances)

    def warm(instance: BackendInstance) -> EdgedError | None:
        try:
            for sample in samples:
                _run_on(config, instance, sample)
        except EdgedError as exc:
            return exc
        return None

    with ThreadPoolExecutor(max(len(instances), 1), thread_name_prefix="warmup") as pool:
        failures = [error for error in pool.map(warm, instances) if error is not None]
    if failures:
        raise failures[0]
    runs = sum(s.count for s in samples)
    log.info(
        "model '%s' ran %d warmup sample(s) (%d run(s)) on each of %d instance(s)",
        config.name,
        len(samples),
        runs,
        len(instances),
    )


def _run_on(config: ModelConfig, instance: BackendInstance, sample: WarmupSample) -> None:
    limit = config.max_batch_size
    for iteration in range(1, sample.count + 1):
        log.debug(
            "model '%s' instance %s is running warmup sample '%s' for iteration %d",
            config.name,
            instance.name,
            sample.name,
            iteration,
        )
        if sample.batch_size > max(limit, 1):
            # Too big a batch for the model: each row's request is refused, as a backend refuses it.
            messages = [f"batch size {sample.batch_size} for '{instance.name}', max allowed is {limit}"]
            raise _failed(sample, messages * sample.batch_size)
        results = _execute(instance, sample.fresh_requests())
        errors = [r.message for r in results if isinstance(r, EdgedError)]
        if errors:
            log.debug(
                "model '%s' instance %s failed to run warmup sample '%s'", config.name, instance.name, sample.name
            )
            raise _failed(sample, errors)


def _execute(instance: BackendInstance, requests: Sequence[InferRequest]) -> Sequence[object]:
    try:
        return instance.execute(requests, ExecutionTiming())
    except EdgedError as exc:
        return [exc] * len(requests)


def _failed(sample: WarmupSample, messages: list[str]) -> EdgedError:
    return EdgedError(
        ErrorCode.INVALID_ARG, f"failed to run warmup sample '{sample.name}': " + "".join(f"{m}; " for m in messages)
    )
