"""The classification extension's bound: a tensor past Triton's million elements is refused, never sorted."""

from __future__ import annotations

import numpy as np
import pytest

from edged.core.request.classification import MAX_CLASSIFIED_ELEMENTS, classify
from edged.errors import EdgedError


def test_an_output_past_the_bound_is_refused_in_tritons_words() -> None:
    at_bound = np.zeros(MAX_CLASSIFIED_ELEMENTS, dtype=np.float32)
    assert classify("FP32", at_bound, 1, None, batching=False).shape == (1,)
    with pytest.raises(EdgedError, match=r"^classification output tensor too large$"):
        classify("FP32", np.zeros(MAX_CLASSIFIED_ELEMENTS + 1, dtype=np.float32), 1, None, batching=False)
