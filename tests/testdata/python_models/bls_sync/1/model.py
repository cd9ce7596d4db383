"""Business logic scripting, as Triton's bls example: forwards INPUT0/INPUT1 to the model named by MODEL_NAME
(an add_sub model, ONNX or Python) and answers with its outputs. "repeat_decoupled" is called decoupled and its
responses are summed; a model that fails makes this request fail with its message. A name "bytes:<model>" makes
the call with bytes wherever Triton's binding takes a string (model name, output names, request id, log message,
error message, tensor names), as a model passing ``as_numpy()[0]`` on does."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            model_name = raw_name.decode()
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            if raw_name.startswith(b"bytes:"):
                responses.append(self.in_bytes(raw_name[len(b"bytes:") :], in_0, in_1))
                continue
            if model_name == "repeat_decoupled":
                responses.append(self.decoupled(in_0.as_numpy()))
                continue
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            output0 = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT0")
            output1 = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT1")
            responses.append(pb_utils.InferenceResponse(output_tensors=[output0, output1]))
        return responses

    def in_bytes(self, model_name, in_0, in_1):
        pb_utils.Logger.log_info(b"bls_sync calls " + model_name + b" with bytes")
        infer_request = pb_utils.InferenceRequest(
            request_id=b"bls-bytes",
            model_name=model_name,
            requested_output_names=[b"OUTPUT0", b"OUTPUT1"],
            inputs=[in_0, in_1],
        )
        infer_response = infer_request.exec()
        if infer_response.has_error():
            message = infer_response.error().message().encode()
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(b"in bytes: " + message))
        outputs = [
            pb_utils.Tensor(name, pb_utils.get_output_tensor_by_name(infer_response, name.decode()).as_numpy())
            for name in (b"OUTPUT0", b"OUTPUT1")
        ]
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def decoupled(self, values):
        repeat = pb_utils.InferenceRequest(
            model_name="repeat_decoupled",
            requested_output_names=["OUT", "IDX"],
            inputs=[pb_utils.Tensor("IN", values.reshape(-1).astype(np.int32))],
        )
        total = np.zeros((1, 16), dtype=np.float32)
        count = 0
        for response in repeat.exec(decoupled=True):
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            if out is not None:  # the last, flag-only response has no outputs
                total += out.as_numpy()[0]
                count += 1
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("OUTPUT0", total),
                pb_utils.Tensor("OUTPUT1", np.full((1, 16), count, dtype=np.float32)),
            ]
        )
