"""The parts of the Python backend that need no daemon: triton_python_backend_utils as a model sees it outside a
stub, and the shared-memory rings (growth, reuse, releases out of order)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest

import edged.backends.python.stub.triton_python_backend_utils as pb_utils
from edged.backends.python.wire import ipc, shm


def _config(**extra: Any) -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0, "input": [], "output": [], **extra}))


def test_model_config_adds_and_merges_tensors() -> None:
    config = _config(input=[{"name": "A", "data_type": "TYPE_INVALID", "dims": [], "optional": False}])
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "B", "data_type": "TYPE_INT8", "dims": [2], "optional": True})
    config.add_output({"name": "C", "data_type": "TYPE_STRING", "dims": [-1]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    data = config.as_dict()
    assert data["input"][0] == {"name": "A", "data_type": "TYPE_FP32", "dims": [4], "optional": False}
    assert data["input"][1]["optional"] is True
    assert data["max_batch_size"] == 8 and data["dynamic_batching"] == {}
    assert pb_utils.using_decoupled_model_transaction_policy(data)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.add_input({"name": "X", "dims": [1]}), "is missing 'data_type' property"),
        (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "shape": 1}), "contains property"),
        (lambda c: c.add_output({"name": "A", "data_type": "TYPE_FP32", "dims": [1], "optional": True}), "contains"),
        (lambda c: c.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]}), "expects datatype TYPE_FP32"),
        (lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [5]}), "expects dims [5]"),
        (lambda c: c.set_max_batch_size(2), "configuration specified max_batch_size 4"),
        (lambda c: c.set_model_transaction_policy({"decoupled": True, "x": 1}), "other than 'decoupled'"),
    ],
)
def test_model_config_refuses_conflicts(call: Any, message: str) -> None:
    config = _config(max_batch_size=4, input=[{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}])
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call(config)


def test_type_helpers_follow_triton() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.triton_to_numpy_type(1) is np.bool_
    elements = np.array([b"ab", "c", b""], dtype=np.object_)
    serialized = pb_utils.serialize_byte_tensor(elements)
    assert serialized == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x00\x00\x00\x00"
    assert list(pb_utils.deserialize_bytes_tensor(serialized)) == [b"ab", b"c", b""]
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.zeros(2)) is None


def test_tensor_dlpack_round_trip_and_errors() -> None:
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    tensor = pb_utils.Tensor("T", array)
    assert tensor.triton_dtype() == 7 and tensor.shape() == [2, 3] and tensor.is_cpu()
    again = pb_utils.Tensor.from_dlpack("U", tensor.to_dlpack())
    np.testing.assert_array_equal(again.as_numpy(), array)
    assert pb_utils.Tensor.from_dlpack("V", array).name() == "V"
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("S", np.array([b"x"], dtype=np.object_)).to_dlpack()
    strings = pb_utils.Tensor("W", np.array(["text"]))
    assert strings.triton_dtype() == 13


def test_errors_responses_and_requests() -> None:
    error = pb_utils.TritonError("gone", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code()) == ("gone", 2)
    assert pb_utils.TritonError.CANCELLED == 7
    response = pb_utils.InferenceResponse(error=error, parameters={"a": 1})
    assert response.has_error() and json.loads(response.parameters()) == {"a": 1}
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=pb_utils.Tensor("x", np.zeros(1)))  # type: ignore[arg-type]
    request = pb_utils.InferenceRequest(
        model_name="m", inputs=[], requested_output_names=["O"], correlation_id="seq", parameters={"k": True}
    )
    assert request.correlation_id() == "seq" and json.loads(request.parameters()) == {"k": True}
    assert not request.is_cancelled()
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(model_name="m", inputs=[])
    with pytest.raises(pb_utils.TritonModelException, match="only available inside a model"):
        request.exec()


def test_bytes_are_taken_where_tritons_binding_takes_a_string() -> None:
    """pybind11 converts bytes to the std::string Triton's binding declares; parameters it checks by type."""
    assert pb_utils.TritonError(b"broken").message() == "broken"
    assert pb_utils.Tensor(b"OUT", np.zeros(1)).name() == "OUT"
    request = pb_utils.InferenceRequest(
        request_id=b"r-1", model_name=b"add_sub", inputs=[], requested_output_names=[b"OUTPUT0", "OUTPUT1"]
    )
    assert (request.request_id(), request.requested_output_names()) == ("r-1", ["OUTPUT0", "OUTPUT1"])
    assert pb_utils.MetricFamily(b"family", b"what it counts", pb_utils.MetricFamily.COUNTER).name == "family"
    with pytest.raises(pb_utils.TritonModelException, match="must be UTF-8 text"):
        pb_utils.Tensor(b"\xff", np.zeros(1))
    with pytest.raises(TypeError, match="must be str or bytes, not int"):
        pb_utils.InferenceRequest(model_name=7, inputs=[], requested_output_names=[])  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="keys to have type str, found type <class 'bytes'>"):
        pb_utils.InferenceResponse(parameters={b"k": 1})  # type: ignore[dict-item]
    with pytest.raises(pb_utils.TritonModelException, match="values to have type bool/int/str, found type <class"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters={"k": b"v"})


def test_metrics_keep_their_values_outside_a_stub() -> None:
    family = pb_utils.MetricFamily("requests_total", "requests", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m"})
    metric.increment(2)
    metric.increment(3)
    assert metric.value() == 5
    with pytest.raises(pb_utils.TritonModelException):
        metric.increment(-1)
    depth = pb_utils.MetricFamily("depth", "queue depth", pb_utils.MetricFamily.GAUGE)
    gauge = depth.Metric()
    gauge.set(7)
    assert gauge.value() == 7
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.MetricFamily("h", "h", pb_utils.MetricFamily.HISTOGRAM).Metric()


def test_rings_grow_reuse_and_release_out_of_order() -> None:
    producer = shm.Producer(initial_size=4096)
    consumer = shm.Consumer()
    blocks = []
    for round_number in range(40):
        writer = ipc.TensorWriter()
        data = np.full(300 + round_number * 50, round_number, dtype=np.int32)
        desc = writer.add("T", "INT32", [data.size], data)
        span = writer.commit(producer)
        assert span is not None
        region = producer.pending_region()
        if region is not None:
            fd, size = region
            consumer.attach(os.dup(fd), size)
            producer.region_sent()
        block = consumer.hold(span[1])
        np.testing.assert_array_equal(ipc.read_tensor(consumer, desc, copy=False), data)
        blocks.append(block)
        if len(blocks) == 3:
            # Released newest first: the ring only moves on once the oldest is released too.
            for held in reversed(blocks):
                held.release()
            blocks.clear()
    producer.close()
    consumer.close()


def test_bytes_tensors_travel_in_their_binary_form() -> None:
    elements = np.array([[b"a", b"\x00\x01"], [b"", b"long" * 100]], dtype=np.object_)
    producer = shm.Producer(initial_size=4096)
    consumer = shm.Consumer()
    writer = ipc.TensorWriter()
    desc = writer.add("B", "BYTES", [2, 2], elements)
    writer.commit(producer)
    region = producer.pending_region()
    assert region is not None
    consumer.attach(os.dup(region[0]), region[1])
    producer.region_sent()
    np.testing.assert_array_equal(ipc.read_tensor(consumer, desc, copy=False), elements)
    producer.close()
    consumer.close()


def test_an_empty_tensor_after_another_travels_inline() -> None:
    """A zero-element tensor last in a message: its aligned offset lies past the payload's end, and reading it must
    not fail (a stub that failed here died with "outside the message's payload")."""
    writer = ipc.TensorWriter()
    first = writer.add("INPUT", "FP32", [1], np.ones(1, dtype=np.float32))
    empty = writer.add("DELAY", "UINT32", [0], np.zeros(0, dtype=np.uint32))
    inline = writer.inline()
    assert inline is not None
    payload = memoryview(b"".join(bytes(part) for part in inline[0]))
    consumer = shm.Consumer()
    np.testing.assert_array_equal(ipc.read_tensor(consumer, first, copy=True, payload=payload), [1.0])
    assert ipc.read_tensor(consumer, empty, copy=True, payload=payload).shape == (0,)
    consumer.close()


@pytest.mark.parametrize("fast", [True, False], ids=["msgspec", "json module"])
def test_stub_messages_read_the_same_with_or_without_msgspec(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's own interpreter may lack msgspec: the stub then speaks the same JSON through the json module."""
    if not fast:
        monkeypatch.setattr(ipc, "_fast_encode", None)
        monkeypatch.setattr(ipc, "_fast_decode", None)
    else:
        assert ipc._fast_encode is not None and ipc._fast_decode is not None
    output = {"n": "OUT\u00e9", "d": "FP32", "s": [1, 16], "p": 0, "b": 64}
    messages: list[dict[str, Any]] = [
        {"t": "execute_done", "batch": 7, "responses": [{"outputs": [output]}, {}], "again": [1], "blk": [0, 64]},
        {"t": "execute_done", "batch": 8, "responses": [{"outputs": [], "parameters": {"p": 1.5, "q": "x"}}]},
        {"t": "execute_done", "batch": 9, "error": {"msg": 'a "quoted"\nline', "code": "INTERNAL"}},
        {"t": "log", "level": 1, "msg": "\u2603 snow"},
    ]
    for message in messages:
        data = ipc.encode(message)
        assert json.loads(data) == message
        assert ipc.decode(data) == message
        assert ipc.decode(memoryview(data)) == message
    # The json module refuses what is not finite; so does the stub's encoder on either path.
    with pytest.raises(ValueError):
        ipc.encode({"t": "execute_done", "batch": 1, "responses": [{"outputs": [], "parameters": {"p": float("nan")}}]})
    for malformed in (b"[1, 2]", b'{"t": "log"} trailing', b"{not json", b"\xff"):
        with pytest.raises(ValueError):
            ipc.decode(malformed)


def test_arguments_are_refused_as_tritons_binding_refuses_them() -> None:
    """pybind11 raises TypeError for an argument of the wrong type or a missing one; the binding's own checks raise
    TritonModelException with Triton's texts (qa/L0_backend_python argument_validation and parameters)."""
    tensor = pb_utils.Tensor("INPUT0", np.zeros(2, dtype=np.int32))
    none: Any = None  # what the model passes, typed as anything
    one: Any = 1
    no_dict: Any = []
    with pytest.raises(pb_utils.TritonModelException, match=r"^Expect N8pybind114dictE, got <class 'list'>$"):
        pb_utils.InferenceResponse(parameters=no_dict)
    with pytest.raises(
        pb_utils.TritonModelException,
        match=r"^Input tensor for request with id '' and model name 'm' should not be empty\.$",
    ):
        pb_utils.InferenceRequest(inputs=[none], model_name="m", requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match=r"^Output tensor for inference response should not be"):
        pb_utils.InferenceResponse(output_tensors=[none])
    refused: list[Any] = [
        lambda: pb_utils.InferenceResponse(output_tensors=none),
        lambda: pb_utils.InferenceRequest(model_name="m", requested_output_names=[]),
        lambda: pb_utils.InferenceRequest(inputs=[tensor], requested_output_names=[]),
        lambda: pb_utils.InferenceRequest(model_name="m", inputs=[tensor]),
        lambda: pb_utils.InferenceRequest(inputs=none, model_name="m", requested_output_names=[]),
        lambda: pb_utils.InferenceRequest(model_name="m", inputs=[tensor], requested_output_names=[none]),
        lambda: pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id=none),
        lambda: pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], model_version=none),
        lambda: pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], flags=none),
        lambda: pb_utils.Tensor("O", none),
        lambda: pb_utils.Tensor(none, np.zeros(1)),
        lambda: pb_utils.Logger.log("x", none),
        lambda: pb_utils.Logger.log("x", one),
        lambda: pb_utils.Logger.log_info(none),
        lambda: pb_utils.Logger.log_warn(none),
        lambda: pb_utils.Logger.log_error(none),
        lambda: pb_utils.Logger.log_verbose(none),
    ]
    for name in ("OUTPUT0", ""):
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.Tensor.from_dlpack(name, none)
    for index, call in enumerate(refused):
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"call {index} was accepted")
    # What Triton accepts stays accepted.
    pb_utils.Logger.log("level unspecified")
    pb_utils.Logger.log("at a level", pb_utils.Logger.WARNING)
    pb_utils.InferenceResponse(output_tensors=[])
    pb_utils.InferenceResponse([tensor], parameters={"k": "v"})
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id="s-5")
    assert request.correlation_id() == "s-5"


def test_metrics_follow_tritons_rules() -> None:
    """Texts and rules of Triton 2.51's custom metrics (qa/L0_backend_python custom_metrics), checked against it."""
    family = pb_utils.MetricFamily("shared_total", "shared", pb_utils.MetricFamily.COUNTER)
    # Metrics with the same family name and labels are one series: they share their value.
    first, second = family.Metric(labels={"a": "1"}), family.Metric(labels={"a": "1"})
    first.increment(7.5)
    assert second.value() == 7.5
    again = pb_utils.MetricFamily("shared_total", "the same family again", pb_utils.MetricFamily.COUNTER)
    empty = [family.Metric(labels={}), again.Metric()]
    empty[0].increment(2)
    assert empty[1].value() == 2
    with pytest.raises(pb_utils.TritonModelException, match=r"Family name already exists with different type$"):
        pb_utils.MetricFamily("shared_total", "shared", pb_utils.MetricFamily.GAUGE)
    histograms = pb_utils.MetricFamily("latency", "latency", pb_utils.MetricFamily.HISTOGRAM)
    for buckets in ([2.5, 0.1, 1.0], [1.0, 1.0, 2.0, 5.0, 5.0]):
        with pytest.raises(pb_utils.TritonModelException, match=r"Bucket Boundaries must be strictly sorted$"):
            histograms.Metric(labels={"b": str(buckets)}, buckets=buckets)
    with pytest.raises(pb_utils.TritonModelException, match=r"^Failed to create metric\. Missing required buckets\.$"):
        histograms.Metric(labels={})
    with pytest.raises(pb_utils.TritonModelException, match=r"^Failed to create metric\. Unexpected buckets found\.$"):
        family.Metric(labels={}, buckets=[1.0])
    histograms.Metric(labels={"e": "1"}, buckets=[])
    histogram = histograms.Metric(labels={"v": "1"}, buckets=[1.0, 2.0])
    histogram.observe(1.5)
    with pytest.raises(
        pb_utils.TritonModelException, match=r"^Failed to get metric value: .*HISTOGRAM does not support"
    ):
        histogram.value()
    with pytest.raises(
        pb_utils.TritonModelException, match=r"^Failed to set metric value: .*COUNTER does not support Set"
    ):
        first.set(1)
    gauges = pb_utils.MetricFamily("gone", "gone", pb_utils.MetricFamily.GAUGE)
    orphan = gauges.Metric(labels={"x": "1"})
    del gauges
    with pytest.raises(
        pb_utils.TritonModelException,
        match=r"^Failed to set metric value: Invalid metric operation as the corresponding 'MetricFamily' has been "
        r"deleted\. The 'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been "
        r"deleted\.$",
    ):
        orphan.set(3)


def test_a_bls_response_iterator_can_be_read_again() -> None:
    # As Triton's: the responses are kept, and a second loop over the iterator starts from the first one.
    iterator = pb_utils.ResponseIterator(1)
    for n in range(3):
        iterator._put(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))]), n == 2)
    first = [int(r.output_tensors()[0].as_numpy()[0]) for r in iterator]
    assert first == [0, 1, 2]
    assert [int(r.output_tensors()[0].as_numpy()[0]) for r in iterator] == first
