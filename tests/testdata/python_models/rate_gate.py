"""For the rate limiter's tests: an execution appends the model's name to the file of the request parameter
``order`` as it begins, then, with a parameter ``hold`` (a file's path), keeps its instance (and the rate limiter
resources it was given) until that file exists, however slow the machine."""

import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        parameters = [json.loads(request.parameters()) for request in requests]
        for p in parameters:
            if p.get("order"):
                with open(p["order"], "a", encoding="utf-8") as order:
                    order.write(self.name + "\n")
        for hold in sorted({p["hold"] for p in parameters if p.get("hold")}):
            # The deadline only ends a test that failed.
            deadline = time.monotonic() + 120
            while not os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
