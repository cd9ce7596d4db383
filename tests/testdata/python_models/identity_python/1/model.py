"""Every input comes back as the output of the same suffix (INPUT_FP32 -> OUTPUT_FP32, ...). numpy cannot hold
BF16, so that one goes through Tensor.from_dlpack, as a Triton model has to do it."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                name = "OUTPUT" + tensor.name()[len("INPUT"):]
                if tensor.triton_dtype() == 14:  # TRITONSERVER_TYPE_BF16
                    outputs.append(pb_utils.Tensor.from_dlpack(name, tensor))
                else:
                    outputs.append(pb_utils.Tensor(name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
