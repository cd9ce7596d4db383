"""What Triton's own qa models do inside execute, one MODE per request, the answer in OUT as text: run a unittest
suite with ``unittest.main("model", exit=False)`` (the stub's argv must not reach it), send BLS requests with a
timeout or to a model that does not exist, use the response sender of a model that is not decoupled, and cancel a
decoupled BLS stream."""

import os
import sys
import tempfile
import threading
import time
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class ArgvTest(unittest.TestCase):
    def test_argv_is_the_embedded_interpreters(self):
        self.assertEqual(sys.argv, [""])


def _text(value):
    return pb_utils.Tensor("OUT", np.array([str(value).encode()], dtype=np.object_))


def _callee_inputs(text, batched=True):
    array = np.array([text.encode()], dtype=np.object_)
    return [pb_utils.Tensor("IN", array.reshape(1, 1) if batched else array)]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            if mode.startswith("sender_"):
                responses.append(self.sender(request, mode))
                continue
            responses.append(pb_utils.InferenceResponse([_text(self.run(mode))]))
        return responses

    def run(self, mode):
        if mode == "unittest":
            return unittest.main("model", exit=False).result.wasSuccessful()
        if mode == "bls_timeout":
            request = pb_utils.InferenceRequest(
                model_name="qa_queue_callee",
                inputs=_callee_inputs(""),
                requested_output_names=["OUT"],
                timeout=123456,
            )
            response = request.exec()
            return response.error().message() if response.has_error() else response.output_tensors()[0].as_numpy()[0][0].decode()
        if mode == "bls_timeout_expires":
            return self.timeout_expires()
        if mode == "bls_cancel_stream":
            return self.cancel_stream()
        if mode == "bls_unknown":
            request = pb_utils.InferenceRequest(model_name="no_such_model", inputs=[], requested_output_names=[])
            sync = request.exec().error().message()
            streamed = [r.error().message() for r in request.exec(decoupled=True) if r.has_error()]
            return "\n".join([sync, *streamed])
        raise ValueError(f"unknown mode {mode}")

    def timeout_expires(self):
        """One request holds the callee's only instance; a second one, with a timeout of 1 ms, waits behind it in
        the queue until its timeout passes. The first is let go only then, so no timing decides anything."""
        folder = tempfile.mkdtemp()
        held, release = os.path.join(folder, "held"), os.path.join(folder, "release")
        holding = pb_utils.InferenceRequest(
            model_name="qa_queue_callee", inputs=_callee_inputs(f"hold:{held}:{release}"), requested_output_names=["OUT"]
        )
        first = []
        thread = threading.Thread(target=lambda: first.append(holding.exec()))
        thread.start()
        deadline = time.monotonic() + 60  # only ends a test that failed
        while not os.path.exists(held) and time.monotonic() < deadline:
            time.sleep(0.01)
        queued = pb_utils.InferenceRequest(
            model_name="qa_queue_callee", inputs=_callee_inputs(""), requested_output_names=["OUT"], timeout=1000
        )
        response = queued.exec()
        open(release, "w").close()
        thread.join()
        return response.error().message() if response.has_error() else "answered"

    def sender(self, request, mode):
        sender = request.get_response_sender()
        if mode == "sender_final_only":
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        if mode == "sender_sent_and_returned":
            sender.send(pb_utils.InferenceResponse([_text("sent")]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return pb_utils.InferenceResponse([_text("returned")])
        if mode == "sender_two":
            sender.send(pb_utils.InferenceResponse([_text("first")]))
            sender.send(pb_utils.InferenceResponse([_text("second")]))  # raises: one response only
            return None
        if mode == "sender_sent":
            sender.send(pb_utils.InferenceResponse([_text("sent")]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        raise ValueError(f"unknown mode {mode}")

    def cancel_stream(self):
        """Cancels a decoupled BLS stream after its first response: the callee is told (is_cancelled) and what it
        sends afterwards still arrives."""
        request = pb_utils.InferenceRequest(
            model_name="qa_probe_decoupled", inputs=_callee_inputs("ignore_cancel", batched=False), requested_output_names=["OUT"]
        )
        stream = request.exec(decoupled=True)
        seen = []
        for response in stream:
            if response.has_error():
                seen.append(f"error: {response.error().message()}")
                continue
            if response.output_tensors():
                seen.append(response.output_tensors()[0].as_numpy()[0].decode())
            if len(seen) == 1:
                stream.cancel()
        return ",".join(seen)
