"""The schedulers in-process, on the real ONNX Runtime backend: the repository manager loads add_sub from a
repository in a temporary folder, and requests go to the InferenceService as the frontends send them, without a
daemon or a socket in between."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import modelgen
import numpy as np

from edged.backends import BackendRegistry
from edged.core.repository.manager import ManagerOptions, ModelRepositoryManager
from edged.core.request.inference import InferInput, InferRequest, InferResponse
from edged.core.service import InferenceService
from edged.errors import EdgedError


def _repository(root: Path, scheduling: str) -> Path:
    modelgen.write_add_sub(root / "add_sub", max_batch_size=8)
    config = root / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text(encoding="utf-8") + scheduling, encoding="utf-8")
    return root


def _request(value: float, rows: int = 1) -> InferRequest:
    data = np.full((rows, 16), value, dtype=np.float32)
    inputs = [InferInput("INPUT0", "FP32", (rows, 16), data), InferInput("INPUT1", "FP32", (rows, 16), data)]
    return InferRequest("add_sub", -1, str(value), inputs)


async def _serve(root: Path, requests: list[InferRequest]) -> tuple[list[Any], Any]:
    with ThreadPoolExecutor(4) as executor:
        manager = ModelRepositoryManager(ManagerOptions([root]), executor, BackendRegistry({}))
        await manager.load_all()
        service = InferenceService(manager, server_id="edged", strict_readiness=True)
        try:
            results = await asyncio.gather(*(service.infer(r) for r in requests), return_exceptions=True)
            return list(results), manager.statistics("add_sub", -1)[0]
        finally:
            await manager.unload_all()


def test_the_dynamic_batcher_joins_requests_that_wait_together(tmp_path: Path) -> None:
    # A long queue delay and a preferred size of 8: eight requests sent at once run as one batch.
    root = _repository(
        tmp_path, "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 500000 }"
    )
    results, stats = asyncio.run(_serve(root, [_request(float(v)) for v in range(8)]))
    for value, result in enumerate(results):
        assert isinstance(result, InferResponse), result
        np.testing.assert_array_equal(result.outputs[0].data, np.full((1, 16), 2.0 * value, dtype=np.float32))
    assert (stats.inference_count, stats.execution_count) == (8, 1)
    assert list(stats.batch_stats) == [8]


def test_the_direct_scheduler_runs_each_request_alone(tmp_path: Path) -> None:
    root = _repository(tmp_path, "")
    results, stats = asyncio.run(_serve(root, [_request(1.0, rows=3), _request(2.0)]))
    assert all(isinstance(r, InferResponse) for r in results)
    assert (stats.inference_count, stats.execution_count) == (4, 2)
    assert sorted(stats.batch_stats) == [1, 3]


def test_a_request_that_does_not_fit_is_refused_before_it_is_queued(tmp_path: Path) -> None:
    root = _repository(tmp_path, "dynamic_batching { }")
    results, stats = asyncio.run(_serve(root, [_request(1.0, rows=9), _request(2.0)]))
    assert isinstance(results[0], EdgedError) and "batch-size must be <= 8" in results[0].message
    assert isinstance(results[1], InferResponse)
    assert (stats.inference_count, stats.execution_count) == (1, 1)  # refused requests are not counted, as in Triton


def test_two_cpu_instances_that_each_take_every_core_run_one_batch_at_a_time(tmp_path: Path) -> None:
    # Eight requests at once on two instances: the first runs alone; the second instance, which would share the
    # cores with it, waits, and the seven others meet in one batch when the first ends.
    root = _repository(tmp_path, "dynamic_batching { }\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n")
    results, stats = asyncio.run(_serve(root, [_request(float(v)) for v in range(8)]))
    assert all(isinstance(r, InferResponse) for r in results)
    assert (stats.inference_count, stats.execution_count) == (8, 2)
    assert sorted(stats.batch_stats) == [1, 7]


def test_cpu_instances_given_their_share_of_the_cores_run_side_by_side(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // 2)
    root = _repository(
        tmp_path,
        "dynamic_batching { }\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n"
        f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{threads}" }} }}\n',
    )
    results, stats = asyncio.run(_serve(root, [_request(float(v)) for v in range(8)]))
    assert all(isinstance(r, InferResponse) for r in results)
    if threads * 2 <= cores:
        # Two batches of one start at once, the six others wait for the first instance that ends.
        assert (stats.inference_count, stats.execution_count) == (8, 3)
        assert sorted(stats.batch_stats) == [1, 6]
    else:  # one core: each instance's one thread is the whole device
        assert sorted(stats.batch_stats) == [1, 7]
