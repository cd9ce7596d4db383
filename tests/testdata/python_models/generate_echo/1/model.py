"""A model that is not decoupled, for the generate extension: TEXT_OUT is TEXT_IN upper-cased, COUNT_OUT is
COUNT + 1, SCALE_OUT is SCALE doubled (empty without SCALE), PARAMS the request's parameters as JSON with keys
sorted, so that a test sees how each JSON field of a generate request reached the model. A request whose COUNT
is negative fails with an error of the model's."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            if count[0] < 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("COUNT must not be negative")))
                continue
            text = pb_utils.get_input_tensor_by_name(request, "TEXT_IN").as_numpy()
            scale = pb_utils.get_input_tensor_by_name(request, "SCALE")
            scaled = scale.as_numpy() * 2 if scale is not None else np.zeros(0, dtype=np.float32)
            upper = np.array([(t.decode() if isinstance(t, bytes) else t).upper() for t in text], dtype=np.object_)
            params = json.dumps(json.loads(request.parameters()), sort_keys=True)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("TEXT_OUT", upper),
                        pb_utils.Tensor("COUNT_OUT", (count + 1).astype(np.int32)),
                        pb_utils.Tensor("SCALE_OUT", scaled.astype(np.float32)),
                        pb_utils.Tensor("PARAMS", np.array([params], dtype=np.object_)),
                    ]
                )
            )
        return responses
