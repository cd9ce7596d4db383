"""The callee of qa_probe's BLS requests: answers with the timeout its request carries (request.timeout()). IN
``hold:<held>:<release>`` creates the file <held>, then keeps the only instance busy until <release> exists."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0][0].decode()
            if text.startswith("hold:"):
                _, held, release = text.split(":")
                open(held, "w").close()
                deadline = time.monotonic() + 60  # only ends a test that failed
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.01)
            out = np.array([[str(request.timeout()).encode()]], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
