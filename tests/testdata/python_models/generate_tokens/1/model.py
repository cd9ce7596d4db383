"""A decoupled text model for the generate extension, after Triton's own test model (qa/L0_http mock_llm): with
STREAM true it sends the words of PROMPT one response each (a token at a time), then a flag-only final response;
with STREAM false one response holding PROMPT, final. Request parameters: REPETITION (sends the whole prompt that
many times instead of its words), FAIL_LAST (the final response is an error, of the code FAIL_CODE names),
wait_cancel_after (a number n: before its response n the model logs that it waits, and waits for its cancellation,
so that a test disconnects at a known point however slow the machine) and cancel_file: once the model sees its
request cancelled it stops sending, logs it and writes "cancelled: True after <n> responses" to that file.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _text(value):
    return pb_utils.Tensor("TEXT", np.array([[value]], dtype=np.object_))


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().flatten()[0]
            if isinstance(prompt, bytes):
                prompt = prompt.decode()
            stream = bool(pb_utils.get_input_tensor_by_name(request, "STREAM").as_numpy().flatten()[0])
            if not stream:
                sender.send(
                    pb_utils.InferenceResponse([_text(prompt)]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
                continue
            tokens = [prompt] * params["REPETITION"] if "REPETITION" in params else prompt.split(" ")
            wait = params.get("wait_cancel_after")
            for index, token in enumerate(tokens):
                if index == wait:
                    self._wait_for_cancellation(sender, index)
                if sender.is_cancelled():
                    self._record_cancellation(params.get("cancel_file"), index)
                    break
                sender.send(pb_utils.InferenceResponse([_text(token)]))
            final = None
            if params.get("FAIL_LAST", False):
                code = getattr(pb_utils.TritonError, params.get("FAIL_CODE", "INTERNAL"))
                final = pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred", code))
            sender.send(final, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _wait_for_cancellation(self, sender, index):
        pb_utils.Logger.log_info(f"generate_tokens waits for its cancellation before response {index}")
        deadline = time.monotonic() + 60  # only ends a test that failed
        while not sender.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _record_cancellation(self, cancel_file, index):
        seen = f"cancelled: True after {index} responses"
        pb_utils.Logger.log_info(f"generate_tokens {seen}")
        if cancel_file:
            # Written aside and renamed, so that a test waiting for the file never reads it half written.
            with open(cancel_file + ".part", "w") as out:
                out.write(seen)
            os.replace(cancel_file + ".part", cancel_file)
