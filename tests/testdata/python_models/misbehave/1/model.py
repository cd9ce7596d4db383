"""Does what MODE says, mostly something a model must not do, so that the tests can see the daemon survive it:
raise, answer wrongly (count, None, names, dtypes, types), exit, crash, hang, or set its own readiness.

Two things wait for what a test does, so that the test does not depend on how fast the machine is: MODE
"os_exit_when:<path>" exits once that file exists, and while a file "hold_initialize" is in the model's folder,
initialize (a restarted stub's too) waits until it is gone."""

import ctypes
import os
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.ready = True
        self.pid = float(os.getpid())
        hold = os.path.join(args["model_repository"], "hold_initialize")
        if os.path.exists(hold):
            pb_utils.Logger.log_info(f"initialize of stub {os.getpid()} waits until {hold} is gone")
            deadline = time.monotonic() + 120  # only ends a test that failed
            while os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.01)

    def is_ready(self):
        return self.ready

    def execute(self, requests):
        mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0].decode()
        ok = [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.pid], dtype=np.float32))])]
        if mode == "ok":
            return ok * len(requests)
        if mode == "raise":
            raise ValueError("the model refused this request")
        if mode == "error_response":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("no such thing", pb_utils.TritonError.NOT_FOUND))]
        if mode == "wrong_count":
            return ok * (len(requests) + 1)
        if mode == "none":
            return [None] * len(requests)
        if mode == "not_list":
            return ok[0]
        if mode == "bad_name":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("NOT_AN_OUTPUT", np.zeros(1, dtype=np.float32))])]
        if mode == "bad_dtype":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, dtype=np.int64))])]
        if mode == "sys_exit":
            sys.exit(3)
        if mode == "os_exit":
            os._exit(7)
        if mode == "os_exit_later":
            time.sleep(0.5)
            os._exit(7)
        if mode.startswith("os_exit_when:"):
            release = mode.partition(":")[2]
            pb_utils.Logger.log_info(f"stub {os.getpid()} exits with status 7 once {release} exists")
            deadline = time.monotonic() + 120  # only ends a test that failed
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.01)
            os._exit(7)
        if mode == "segfault":
            ctypes.string_at(0)
        if mode == "hang":
            while True:
                time.sleep(0.01)
        if mode == "wait_cancel":
            # The test cancels once it reads this line, so the cancellation reaches a running execution however
            # slow the machine; the deadline only ends a test that failed.
            pb_utils.Logger.log_info(f"request '{requests[0].request_id()}' waits for its cancellation")
            deadline = time.monotonic() + 60
            while not requests[0].is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            pb_utils.Logger.log_info(f"request '{requests[0].request_id()}' cancelled: {requests[0].is_cancelled()}")
            return ok
        if mode == "api":
            # The model-management and metrics API, as a model in a server without explicit model control sees it.
            try:
                pb_utils.load_model("add_sub")
                load_error = ""
            except pb_utils.TritonModelException as exc:
                load_error = exc.message()
            family = pb_utils.MetricFamily("misbehave_calls", "calls of the api mode", pb_utils.MetricFamily.COUNTER)
            counter = family.Metric(labels={"mode": "api"})
            counter.increment(2)
            parameters = {
                "add_sub_ready": pb_utils.is_model_ready("add_sub"),
                "add_sub_v1_ready": pb_utils.is_model_ready("add_sub", "1"),
                "unknown_ready": pb_utils.is_model_ready("no_such_model"),
                "model_dir": pb_utils.get_model_dir(),
                "load_error": load_error,
                "counter": int(counter.value()),
            }
            return [pb_utils.InferenceResponse(ok[0].output_tensors(), parameters=parameters)]
        if mode == "unready":
            self.ready = False
            return ok
        if mode == "ready":
            self.ready = True
            return ok
        if mode == "log":
            pb_utils.Logger.log_warn("misbehave says: careful")
            return ok
        raise pb_utils.TritonModelException(f"unknown mode {mode}")
