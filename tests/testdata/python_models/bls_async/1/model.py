"""BLS with ``async def execute``: the same request goes to the ONNX add_sub and the Python add_sub_python at
once (``async_exec`` and ``asyncio.gather``), and the answer is their sum: 2 * (INPUT0 + INPUT1) and
2 * (INPUT0 - INPUT1). MODEL_NAME, when not empty, is called as a third model, to show failures."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            extra = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0].decode()
            names = ["add_sub", "add_sub_python"] + ([extra] if extra else [])
            awaits = [
                pb_utils.InferenceRequest(
                    model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=[in_0, in_1]
                ).async_exec()
                for name in names
            ]
            results = await asyncio.gather(*awaits)
            failed = [r for r in results if r.has_error()]
            if failed:
                responses.append(pb_utils.InferenceResponse(error=failed[0].error()))
                continue
            out_0 = sum(pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy() for r in results)
            out_1 = sum(pb_utils.get_output_tensor_by_name(r, "OUTPUT1").as_numpy() for r in results)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUTPUT0", out_0), pb_utils.Tensor("OUTPUT1", out_1)]
                )
            )
        return responses
