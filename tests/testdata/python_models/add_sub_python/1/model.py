"""OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, written as Triton's add_sub example is: the Python
twin of the ONNX add_sub model. A request parameter ``hold`` (a file's path) keeps the instance busy until that file
exists, for the tests that need a request running on one instance while they send the next."""

import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])
        self.args = dict(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (in_0.as_numpy() + in_1.as_numpy(), in_0.as_numpy() - in_1.as_numpy())
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            parameters = {}
            hold = json.loads(request.parameters()).get("hold")
            if hold:
                pb_utils.Logger.log_info(f"add_sub_python holds its instance until {hold} exists")
                deadline = time.monotonic() + 120  # only ends a test that failed
                while not os.path.exists(hold) and time.monotonic() < deadline:
                    time.sleep(0.01)
            if json.loads(request.parameters()).get("echo_args"):
                # What initialize received, for the tests that check Triton's args; slowly, so that requests sent
                # together overlap and reach both instances.
                time.sleep(0.05)
                parameters = {key: value for key, value in self.args.items() if key != "model_config"}
            tensors = [out_tensor_0, out_tensor_1]
            # Only with parameters to return: Triton 2.51's InferenceResponse takes no parameters argument.
            if parameters:
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors, parameters=parameters))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub_python finalized")
