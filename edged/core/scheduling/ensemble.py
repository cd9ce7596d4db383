"""Ensembles: ``platform: "ensemble"`` pipelines whose steps are other models of the server.

At load, the steps are checked against the composing models' configs as Triton checks them (every input mapped
once, outputs that exist, one producer per ensemble tensor, consistent data types and shapes, every ensemble output
produced, no step waiting for a tensor nothing produces); a composing model that is not loaded makes the ensemble
UNAVAILABLE with the reason. The ensemble is ready while every composing model is.

A request runs as a graph: a step starts as soon as every ensemble tensor it reads exists, so independent steps run
at once. Each step is an ordinary request to its model through the server (its scheduler, batching and statistics
included), carrying the ensemble request's parameters. A failing step fails the request with an error that names the
step; the steps still running are cancelled. Cancelling the request cancels the steps in flight.

As in Triton, an optional ensemble input the client did not send, or a step output its model did not return, is
"absent" (None among the request's tensors): it counts as there for a step waiting on it, which runs without that
input (its model decides whether it may be missing), and an ensemble output that is absent is left out of the
response. An ensemble that does not batch hands a batching step a tensor of its own rank with a batch dimension of 1
put in front (a zero-element ``[0]`` becomes ``[1,0]``), and takes it off the step's outputs again.

An ensemble with a decoupled step is decoupled itself, as in Triton: each response of that step goes on through the
rest of the graph on its own and becomes one response of the ensemble's stream.

It lives with the other schedulers because that is what it is (its "model" is a graph of other models), and
reaches the core through the backend interface like any backend: the daemon's registry builds it for
``platform: "ensemble"`` with the server its steps call.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edged.core.request.inference import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    StreamResponse,
)
from edged.errors import EdgedError, ErrorCode
from edged.proto.model_config_pb2 import DataType

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from edged.core.backend_api import LoadContext, ServerApi
    from edged.core.stats import ExecutionTiming
    from edged.proto.model_config_pb2 import ModelConfig

# Requests an ensemble runs at once when its config does not bound them (max_inflight_requests).
DEFAULT_IN_FLIGHT = 256
WILDCARD = -1


@dataclass(frozen=True, slots=True)
class _Tensor:
    """What an ensemble tensor is, and which model it was inferred from (for the consistency checks)."""

    data_type: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]
    model: str


@dataclass(frozen=True, slots=True)
class _Step:
    index: int
    model: str
    version: int
    # step model's input name -> ensemble tensor, ensemble tensor <- step model's output name
    inputs: dict[str, str]
    outputs: dict[str, str]
    # A decoupled model's step: each of its responses carries the rest of the graph on its own.
    decoupled: bool = False
    # The step's model batches (max_batch_size > 0); the rank of each of its inputs' dims without the batch.
    batching: bool = False
    ranks: dict[str, int] | None = None


class EnsembleBackend:
    def __init__(self, backend_config: dict[str, str], host: ServerApi | None) -> None:
        del backend_config  # no settings of its own
        self._host = host

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        """An ensemble's config is complete as written: there is no model file to read it from."""

    def load(self, config: ModelConfig, context: LoadContext) -> EnsembleModel:
        server = self._host
        if server is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, "ensembles run only inside the daemon")
        steps = check_ensemble(config, server)
        # Triton's config of an ensemble always holds the policy, not decoupled unless a step is.
        config.model_transaction_policy.SetInParent()
        if any(step.decoupled for step in steps):
            # As Triton: an ensemble with a decoupled step is decoupled itself (its clients stream).
            config.model_transaction_policy.decoupled = True
        return EnsembleModel(config, steps, server)


def _dims(dims: Sequence[int], batching: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = tuple(int(d) for d in dims)
    return shape, ((WILDCARD, *shape) if batching else shape)


def _same_dims(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or WILDCARD in (x, y) for x, y in zip(a, b, strict=True))


def _shape_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _consistent(name: str, ensemble: str, known: _Tensor, new: _Tensor) -> None:
    prefix = f"in ensemble {ensemble}, ensemble tensor {name}: "
    if known.data_type != new.data_type:
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"{prefix}inconsistent data type: {DataType.Name(known.data_type)} is inferred from model {known.model} "
            f"while {DataType.Name(new.data_type)} is inferred from model {new.model}",
        )
    if not _same_dims(known.dims, new.dims) and not _same_dims(known.full_dims, new.full_dims):
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"{prefix}inconsistent shape: {_shape_text(known.full_dims)} is inferred from model {known.model} while "
            f"{_shape_text(new.full_dims)} is inferred from model {new.model}",
        )


def check_ensemble(config: ModelConfig, server: ServerApi) -> list[_Step]:
    """Triton's checks of an ensemble against its composing models; the steps, ready to run."""
    if not config.ensemble_scheduling.step:
        raise EdgedError(ErrorCode.INVALID_ARG, f"must specify one or more 'step's for ensemble {config.name}")
    check = _EnsembleCheck(config)
    steps = [check.step(index, step, server) for index, step in enumerate(config.ensemble_scheduling.step)]
    check.data_flow(steps)
    return steps


class _EnsembleCheck:
    """The tensors of one ensemble as its steps are checked in turn: every tensor's type and shape as first seen
    (consistent wherever else it appears), and which step produces each."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.name = config.name
        batching = config.max_batch_size > 0
        self.tensors: dict[str, _Tensor] = {}
        for tensor in config.input:
            dims, full = _dims(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims, batching)
            self.tensors[tensor.name] = _Tensor(tensor.data_type, dims, full, self.name)
        self.outputs: dict[str, _Tensor] = {}
        for tensor in config.output:
            dims, full = _dims(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims, batching)
            self.outputs[tensor.name] = _Tensor(tensor.data_type, dims, full, self.name)
        self.producers: dict[str, int] = {}

    def step(self, index: int, step: Any, server: ServerApi) -> _Step:
        name = self.name
        for member in ("model_name", "input_map", "output_map"):
            if not getattr(step, member):
                raise EdgedError(ErrorCode.INVALID_ARG, f"must specify '{member}' in step {index} of ensemble {name}")
        model = step.model_name
        try:
            member_config = server.model_config(model, int(step.model_version))
        except EdgedError as exc:
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                f"ensemble {name} depends on model {model}, which is not available: {exc.message}",
            ) from None
        if member_config.max_batch_size != 0 and member_config.max_batch_size < self.config.max_batch_size:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"ensemble {name} allows maximum batch size {self.config.max_batch_size}, but it contains model "
                f"{model} which only allows maximum batch size to be {member_config.max_batch_size}",
            )
        self._inputs(step, member_config)
        self._outputs(index, step, member_config)
        decoupled = bool(member_config.model_transaction_policy.decoupled)
        ranks = {tensor.name: len(tensor.dims) for tensor in member_config.input}
        return _Step(
            index,
            model,
            int(step.model_version),
            dict(step.input_map),
            dict(step.output_map),
            decoupled,
            member_config.max_batch_size > 0,
            ranks,
        )

    def _inputs(self, step: Any, member: ModelConfig) -> None:
        name, model = self.name, step.model_name
        inputs = {i.name: i for i in member.input}
        for key, value in step.input_map.items():
            if key not in inputs:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"in ensemble {name}, ensemble tensor {value} is mapping to non-existing input {key} in model "
                    f"{model}",
                )
        for input_name, tensor in inputs.items():
            if input_name not in step.input_map:
                if tensor.optional:
                    continue
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"in ensemble {name}, input {input_name} in model {model} is not mapped to any ensemble tensors",
                )
            dims, full = _dims(tensor.dims, member.max_batch_size > 0)
            self._seen(step.input_map[input_name], _Tensor(tensor.data_type, dims, full, model))

    def _outputs(self, index: int, step: Any, member: ModelConfig) -> None:
        name, model = self.name, step.model_name
        member_outputs = {o.name: o for o in member.output}
        for key, value in step.output_map.items():
            if key not in member_outputs:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"in ensemble {name}, ensemble tensor {value} is mapped from non-existing output {key} in model "
                    f"{model}",
                )
            if value in self.producers or value in {t.name for t in self.config.input}:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"ensemble tensor {value} can appear in an output map only once for ensemble {name} step {index}",
                )
            self.producers[value] = index
            tensor = member_outputs[key]
            dims, full = _dims(tensor.dims, member.max_batch_size > 0)
            found = _Tensor(tensor.data_type, dims, full, model)
            self._seen(value, found)
            if value in self.outputs:
                _consistent(value, name, self.outputs[value], found)

    def _seen(self, ensemble_tensor: str, found: _Tensor) -> None:
        if ensemble_tensor in self.tensors:
            _consistent(ensemble_tensor, self.name, self.tensors[ensemble_tensor], found)
        else:
            self.tensors[ensemble_tensor] = found

    def data_flow(self, steps: list[_Step]) -> None:
        """Every step must be reachable from the ensemble's inputs, and every output produced."""
        produced = {t.name for t in self.config.input}
        remaining = list(steps)
        while remaining:
            runnable = [s for s in remaining if all(t in produced for t in s.inputs.values())]
            if not runnable:
                waiting = remaining[0]
                missing = sorted(t for t in waiting.inputs.values() if t not in produced)
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"in ensemble {self.name}, step {waiting.index} (model {waiting.model}) reads ensemble tensor "
                    f"{missing[0]}, which no step before it produces (a missing producer or a cycle)",
                )
            for step in runnable:
                remaining.remove(step)
                produced.update(step.outputs.values())
        for output in self.config.output:
            if output.name not in self.producers:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"ensemble output {output.name} is not produced by any step of ensemble {self.name}",
                )


class EnsembleModel:
    def __init__(self, config: ModelConfig, steps: list[_Step], server: ServerApi) -> None:
        self._steps = steps
        self._server = server
        count = config.ensemble_scheduling.max_inflight_requests or DEFAULT_IN_FLIGHT
        runner = _Runner(config, steps, server)
        self._instances = [runner] * count

    @property
    def instances(self) -> Sequence[_Runner]:
        return self._instances

    def is_ready(self) -> bool:
        """Ready while every composing model is (unloading one makes the ensemble unavailable)."""
        return all(self._server.model_ready(step.model, step.version) for step in self._steps)

    def unload(self) -> None:
        self._instances = []


class _Runner:
    """Runs requests through the steps; stateless, so one object serves every slot the scheduler sees."""

    # An ensemble computes nothing itself: its trace has no compute timestamps (its steps' traces have them).
    traces_compute = False

    def __init__(self, config: ModelConfig, steps: list[_Step], server: ServerApi) -> None:
        self.name = f"{config.name}_0"
        self._config = config
        self._steps = steps
        self._server = server
        self._outputs = [o.name for o in config.output]
        self._optional = [i.name for i in config.input if i.optional]
        self._batching = config.max_batch_size > 0

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[Any]:
        raise EdgedError(ErrorCode.INTERNAL, "an ensemble runs on the event loop only")

    def execute_async(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> asyncio.Future[list[Any]]:
        return asyncio.ensure_future(self._execute(requests, timing))

    async def _execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[Any]:
        started = time.perf_counter_ns()
        run = self._run_streaming if self._config.model_transaction_policy.decoupled else self._run
        results = await asyncio.gather(*(run(request) for request in requests), return_exceptions=True)
        timing.infer_ns = time.perf_counter_ns() - started
        out: list[Any] = []
        for result in results:
            if result is None or isinstance(result, EdgedError | InferResponse):
                out.append(result)
            elif isinstance(result, BaseException):
                out.append(EdgedError(ErrorCode.INTERNAL, f"ensemble '{self._config.name}' failed: {result!r}"))
        return out

    async def _run(self, request: InferRequest) -> InferResponse | EdgedError:
        """An ensemble without decoupled steps: one path through the graph, one response."""
        responses: list[InferResponse] = []
        errors = await self._walk_all(request, responses.append)
        return errors[0] if errors else responses[0]

    async def _run_streaming(self, request: InferRequest) -> EdgedError | None:
        """A decoupled ensemble: every response of a decoupled step goes on through the rest of the graph on its
        own, and each path that reaches the end is one response on the request's stream; a flag-only final
        response follows the last. Returns None (answered through the stream), or the error that ended it."""
        stream = request.stream
        assert stream is not None
        errors = await self._walk_all(request, lambda response: stream.put(StreamResponse(response)))
        stream.put(StreamResponse(None, errors[0] if errors else None, final=True))
        return errors[0] if errors else None

    async def _walk_all(self, request: InferRequest, deliver: Callable[[InferResponse], None]) -> list[EdgedError]:
        """Every path of the request through the graph, each finished one delivered; the errors that ended any.
        Cancelling the request cancels every path and the steps they run."""
        paths: list[asyncio.Task[None]] = []
        errors: list[EdgedError] = []

        def start(tensors: dict[str, InferInput | None], remaining: list[_Step]) -> None:
            paths.append(asyncio.ensure_future(self._walk(request, tensors, remaining, deliver, start, errors)))

        def cancel_paths() -> None:
            for task in paths:
                task.cancel()

        request.on_cancel(cancel_paths)
        given: dict[str, InferInput | None] = {t.name: t for t in request.inputs}
        start({**dict.fromkeys(self._optional), **given}, list(self._steps))
        while not all(task.done() for task in paths):
            await asyncio.gather(*list(paths), return_exceptions=True)
        return errors

    async def _walk(
        self,
        request: InferRequest,
        tensors: dict[str, InferInput | None],
        remaining: list[_Step],
        deliver: Callable[[InferResponse], None],
        fork: Callable[[dict[str, InferInput | None], list[_Step]], None],
        errors: list[EdgedError],
    ) -> None:
        """One path: a step starts as soon as its inputs exist; at a decoupled step (once the steps in flight are
        done) the path ends and each of that step's responses starts a path of its own through what is left."""
        running: dict[asyncio.Task[dict[str, InferInput | None]], _Step] = {}
        try:
            while remaining or running:
                for step in [s for s in remaining if all(t in tensors for t in s.inputs.values())]:
                    if step.decoupled and running:
                        continue
                    remaining.remove(step)
                    if step.decoupled:
                        async for produced in self._stream_step(step, request, tensors):
                            fork({**tensors, **produced}, list(remaining))
                        return
                    running[asyncio.ensure_future(self._step(step, request, tensors))] = step
                if not running:
                    # Nothing in flight and steps left whose inputs never came: the load-time checks make this
                    # impossible, so it is a bug, and the request fails rather than waits forever.
                    raise EdgedError(
                        ErrorCode.INTERNAL,
                        f"in ensemble '{self._config.name}', step {remaining[0].index} (model '{remaining[0].model}') "
                        "cannot run: an ensemble tensor it reads was never produced",
                    )
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    if task.cancelled():
                        raise asyncio.CancelledError
                    exc = task.exception()
                    if exc is not None:
                        raise self._step_error(step, exc)
                    tensors.update(task.result())
            outputs = [_output(name, found) for name in self._outputs if (found := tensors.get(name)) is not None]
            deliver(InferResponse(request.model_name, str(request.model_version), request.id, outputs))
        except EdgedError as error:
            errors.append(error)
        except asyncio.CancelledError:
            errors.append(EdgedError(ErrorCode.CANCELLED, "the request was cancelled"))
        except Exception as exc:  # a bug: the request fails, the ensemble goes on
            errors.append(EdgedError(ErrorCode.INTERNAL, f"ensemble '{self._config.name}' failed: {exc!r}"))
        finally:
            for task in running:
                task.cancel()

    def _step_error(self, step: _Step, exc: BaseException) -> EdgedError:
        message = exc.message if isinstance(exc, EdgedError) else repr(exc)
        code = exc.code if isinstance(exc, EdgedError) else ErrorCode.INTERNAL
        return EdgedError(
            code, f"in ensemble '{self._config.name}', step {step.index} (model '{step.model}') failed: {message}"
        )

    async def _stream_step(
        self, step: _Step, request: InferRequest, tensors: dict[str, InferInput | None]
    ) -> AsyncIterator[dict[str, InferInput | None]]:
        """Each response of a decoupled step, as the ensemble tensors it produces."""
        sub, batched = self._sub_request(step, request, tensors)
        try:
            async for item in self._server.infer_stream(sub):
                if item.error is not None:
                    raise self._step_error(step, item.error)
                if item.response is not None:
                    yield self._produced(step, item.response, batched)
        finally:
            if sub.trace is not None:
                sub.trace.close()

    def _sub_request(
        self, step: _Step, request: InferRequest, tensors: dict[str, InferInput | None]
    ) -> tuple[InferRequest, bool]:
        """The step's request, and whether a batch dimension was put in front of its inputs (to take off again)."""
        inputs = []
        batched = False
        for model_input, ensemble_tensor in step.inputs.items():
            source = tensors[ensemble_tensor]
            if source is None:
                continue  # absent: the step runs without it
            shape, data = source.shape, source.data
            if step.batching and not self._batching and step.ranks and len(shape) == step.ranks.get(model_input):
                shape = (1, *shape)
                data = None if data is None else data.reshape(shape)
                batched = True
            inputs.append(InferInput(model_input, source.datatype, shape, data))
        sub = InferRequest(
            model_name=step.model,
            model_version=step.version,
            id=request.id,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in step.outputs],
            parameters=request.parameters,
            # A traced ensemble traces its steps, as Triton does: child traces that name the ensemble's.
            trace=request.trace.child() if request.trace is not None else None,
        )
        return sub, batched

    @staticmethod
    def _produced(step: _Step, response: InferResponse, batched: bool) -> dict[str, InferInput | None]:
        """The ensemble tensors a step's response gives: absent (None) for an output the model did not return."""
        produced: dict[str, InferInput | None] = dict.fromkeys(step.outputs.values())
        for output in response.outputs:
            target = step.outputs.get(output.name)
            if target is not None:
                shape, data = output.shape, output.data
                if batched and shape[:1] == (1,):
                    shape = shape[1:]
                    data = data.reshape(shape)
                produced[target] = InferInput(target, output.datatype, shape, data)
        return produced

    async def _step(
        self, step: _Step, request: InferRequest, tensors: dict[str, InferInput | None]
    ) -> dict[str, InferInput | None]:
        sub, batched = self._sub_request(step, request, tensors)
        try:
            response = await self._server.infer(sub)
        finally:
            if sub.trace is not None:
                sub.trace.close()
        return self._produced(step, response, batched)


def _output(name: str, tensor: InferInput) -> InferOutput:
    assert tensor.data is not None
    return InferOutput(name, tensor.datatype, tensor.shape, tensor.data)
