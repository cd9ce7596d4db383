"""Records what the dynamic batcher gives it: every request's answer says how many requests and batch items the
execution held, which execution of this process it was, the process, and when it ran. A request parameter
``hold`` (a file's path) keeps the instance busy until that file exists: the model logs "execution holds its
instance until <path> exists" when it begins to wait, so that a test knows the instance is busy, makes requests queue
behind it, and lets it go when it wants to, however slow the machine."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0
        self.pid = os.getpid()

    def execute(self, requests):
        started = time.monotonic()
        self.executions += 1
        parameters = [json.loads(request.parameters()) for request in requests]
        for hold in sorted({p["hold"] for p in parameters if p.get("hold")}):
            pb_utils.Logger.log_info(f"execution holds its instance until {hold} exists")
            # The deadline only ends a test that failed.
            deadline = time.monotonic() + 120
            while not os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.01)
        inputs = [pb_utils.get_input_tensor_by_name(request, "IN").as_numpy() for request in requests]
        items = sum(array.shape[0] for array in inputs)
        same_shapes = len({array.shape[1:] for array in inputs}) == 1
        ended = time.monotonic()
        responses = []
        for array in inputs:
            rows = array.shape[0]

            def column(value, dtype, rows=rows):
                return np.full((rows, 1), value, dtype=dtype)

            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", array),
                        pb_utils.Tensor("ITEMS", column(items, np.int32)),
                        pb_utils.Tensor("REQUESTS", column(len(requests), np.int32)),
                        pb_utils.Tensor("SAME_SHAPES", column(same_shapes, np.bool_)),
                        pb_utils.Tensor("EXECUTION", column(self.executions, np.int64)),
                        pb_utils.Tensor("PID", column(self.pid, np.int64)),
                        pb_utils.Tensor("START", column(started, np.float64)),
                        pb_utils.Tensor("END", column(ended, np.float64)),
                    ]
                )
            )
        return responses
