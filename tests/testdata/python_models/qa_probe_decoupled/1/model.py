"""A decoupled model for Triton's qa cases. IN ``return_response``: execute returns a response, which a decoupled
model may not. IN ``ignore_cancel``: answers "first", waits until the request is cancelled, then answers
"cancelled: <is_cancelled()>" and closes the stream, as a model that ignores cancellation does."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _text(value):
    return pb_utils.Tensor("OUT", np.array([value.encode()], dtype=np.object_))


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0].decode()
            if mode == "return_response":
                return [pb_utils.InferenceResponse([_text("returned")])]
            threading.Thread(target=self.ignore_cancel, args=(request,), daemon=True).start()
        return None

    def ignore_cancel(self, request):
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([_text("first")]))
        deadline = time.monotonic() + 60  # only ends a test that failed
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        sender.send(
            pb_utils.InferenceResponse([_text(f"cancelled: {request.is_cancelled()}")]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )
