"""Triton's decoupled "repeat" example: one response per element of IN (OUT = the element, IDX = its index),
sent from a thread after execute has returned, each after DELAY[i] milliseconds, then a flag-only final response.
A request whose client cancels stops early with a CANCELLED error. With the request parameter ``wait_cancel_after``
(a number n), the model logs that it waits, and waits for the cancellation before its response n, so that a test
cancels at a known point however slow the machine."""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
            delays = delay.as_numpy() if delay is not None else np.zeros(len(values), dtype=np.uint32)
            wait = json.loads(request.parameters()).get("wait_cancel_after")
            thread = threading.Thread(
                target=self.respond, args=(request, values.copy(), delays.copy(), wait), daemon=True
            )
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, request, values, delays, wait_cancel_after=None):
        sender = request.get_response_sender()
        for index, value in enumerate(values):
            time.sleep(float(delays[index]) / 1000.0 if index < len(delays) else 0.0)
            if index == wait_cancel_after:
                pb_utils.Logger.log_info(f"request '{request.request_id()}' waits for its cancellation")
                deadline = time.monotonic() + 60  # only ends a test that failed
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.01)
            if request.is_cancelled():
                pb_utils.Logger.log_info(f"request '{request.request_id()}' was cancelled after {index} responses")
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                return
            sender.send(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                        pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
