"""The batch input tensors of a ragged batch, kind by kind, and a batch output split back into the requests."""

from __future__ import annotations

import numpy as np
import pytest

from edged.backends.ragged import batch_inputs, scatter
from edged.core.config.model_config import parse_model_config
from edged.core.request.inference import InferInput, InferRequest


def _request(shape: tuple[int, ...]) -> InferRequest:
    data = np.zeros(shape, dtype=np.float32)
    return InferRequest("m", -1, "", [InferInput("IN", "FP32", shape, data)], batch_size=shape[0])


# Two requests: one item of 3 x 2 elements, then two items of 1 x 2 (counts include the batch dimension).
REQUESTS = [_request((1, 3, 2)), _request((2, 1, 2))]


@pytest.mark.parametrize(
    ("kind", "data_type", "expected"),
    [
        ("BATCH_ELEMENT_COUNT", "TYPE_INT32", np.array([6, 4], dtype=np.int32)),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", "TYPE_INT32", np.array([6, 10], dtype=np.int32)),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "TYPE_FP32", np.array([0, 6, 10], dtype=np.float32)),
        ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "TYPE_INT32", np.zeros(6, dtype=np.int32)),
        ("BATCH_ITEM_SHAPE", "TYPE_INT32", np.array([[3, 2], [1, 2], [1, 2]], dtype=np.int32)),
        ("BATCH_ITEM_SHAPE_FLATTEN", "TYPE_FP32", np.array([3, 2, 1, 2, 1, 2], dtype=np.float32)),
    ],
)
def test_each_kind_of_batch_input(kind: str, data_type: str, expected: np.ndarray) -> None:
    config = parse_model_config(
        f'name: "m" max_batch_size: 4 batch_input [ {{ kind: {kind} target_name: "B" data_type: {data_type} '
        'source_input: "IN" } ]',
        "config.pbtxt",
    )
    (tensor,) = batch_inputs(config, REQUESTS).values()
    assert tensor.dtype == expected.dtype
    np.testing.assert_array_equal(tensor, expected)


def test_a_batch_output_is_split_in_each_request_shape() -> None:
    parts = scatter(np.arange(10, dtype=np.float32), REQUESTS, "IN")
    assert [part.shape for part in parts] == [(1, 3, 2), (2, 1, 2)]
    np.testing.assert_array_equal(parts[1].reshape(-1), [6, 7, 8, 9])
