"""Our .proto schemas against the ones tritonclient was built with.

Clients decode our replies with their own copy of Triton's schema, so every name, number, type, label, oneof,
map and RPC must be identical; the comparison walks every message, nested message, map entry and enum.
"""

from __future__ import annotations

from typing import Any

import tritonclient.grpc.model_config_pb2 as triton_model_config
import tritonclient.grpc.service_pb2 as triton_service
from google.protobuf import descriptor_pool

from edged.proto import _pool, grpc_service_pb2, grpc_service_pb2_grpc, health_pb2, model_config_pb2


def _type_name(descriptor: Any) -> str | None:
    return None if descriptor is None else str(descriptor.full_name)


def _field_signature(field: Any) -> tuple[object, ...]:
    oneof = field.containing_oneof
    return (
        field.name,
        field.number,
        field.type,
        field.cpp_type,
        field.is_repeated,
        field.is_required,
        field.has_presence,
        _type_name(field.message_type),
        _type_name(field.enum_type),
        None if oneof is None else oneof.name,
    )


def _diff_enum(ours: Any, theirs: Any, diffs: list[str]) -> None:
    where = theirs.full_name
    if ours.full_name != theirs.full_name:
        diffs.append(f"{where}: enum named {ours.full_name}")
    our_values = [(value.name, value.number) for value in ours.values]
    their_values = [(value.name, value.number) for value in theirs.values]
    if our_values != their_values:
        diffs.append(f"{where}: values {our_values} != {their_values}")


def _diff_message(ours: Any, theirs: Any, diffs: list[str]) -> None:
    where = theirs.full_name
    if ours.full_name != theirs.full_name:
        diffs.append(f"{where}: message named {ours.full_name}")
    if ours.GetOptions().map_entry != theirs.GetOptions().map_entry:
        diffs.append(f"{where}: map_entry differs")

    our_fields = [_field_signature(field) for field in ours.fields]
    their_fields = [_field_signature(field) for field in theirs.fields]
    if our_fields != their_fields:
        for ours_field, theirs_field in zip(our_fields, their_fields, strict=False):
            if ours_field != theirs_field:
                diffs.append(f"{where}: field {ours_field} != {theirs_field}")
        if len(our_fields) != len(their_fields):
            diffs.append(f"{where}: {len(our_fields)} fields != {len(their_fields)}")

    our_oneofs = [(oneof.name, [field.name for field in oneof.fields]) for oneof in ours.oneofs]
    their_oneofs = [(oneof.name, [field.name for field in oneof.fields]) for oneof in theirs.oneofs]
    if our_oneofs != their_oneofs:
        diffs.append(f"{where}: oneofs {our_oneofs} != {their_oneofs}")

    _diff_children(ours.enum_types_by_name, theirs.enum_types_by_name, _diff_enum, diffs, where=where, kind="enum")
    _diff_children(
        ours.nested_types_by_name,
        theirs.nested_types_by_name,
        _diff_message,
        diffs,
        where=where,
        kind="message",
    )


def _diff_children(ours: Any, theirs: Any, diff: Any, diffs: list[str], *, where: str, kind: str) -> None:
    our_names, their_names = set(ours), set(theirs)
    for name in sorted(their_names - our_names):
        diffs.append(f"{where}: missing {kind} {name}")
    for name in sorted(our_names - their_names):
        diffs.append(f"{where}: extra {kind} {name}")
    for name in sorted(our_names & their_names):
        diff(ours[name], theirs[name], diffs)


def _diff_service(ours: Any, theirs: Any, diffs: list[str]) -> None:
    def methods(service: Any) -> list[tuple[object, ...]]:
        return [
            (
                method.name,
                method.input_type.full_name,
                method.output_type.full_name,
                method.client_streaming,
                method.server_streaming,
            )
            for method in service.methods
        ]

    if ours.full_name != theirs.full_name:
        diffs.append(f"{theirs.full_name}: service named {ours.full_name}")
    our_methods, their_methods = methods(ours), methods(theirs)
    if our_methods != their_methods:
        for ours_method, theirs_method in zip(our_methods, their_methods, strict=False):
            if ours_method != theirs_method:
                diffs.append(f"{theirs.full_name}: rpc {ours_method} != {theirs_method}")
        if len(our_methods) != len(their_methods):
            diffs.append(f"{theirs.full_name}: {len(our_methods)} rpcs != {len(their_methods)}")


def _diff_file(ours: Any, theirs: Any) -> list[str]:
    diffs: list[str] = []
    where = theirs.name
    if ours.package != theirs.package:
        diffs.append(f"{where}: package {ours.package} != {theirs.package}")
    our_deps = sorted(dep.name for dep in ours.dependencies)
    their_deps = sorted(dep.name for dep in theirs.dependencies)
    if our_deps != their_deps:
        diffs.append(f"{where}: imports {our_deps} != {their_deps}")
    _diff_children(ours.enum_types_by_name, theirs.enum_types_by_name, _diff_enum, diffs, where=where, kind="enum")
    _diff_children(
        ours.message_types_by_name,
        theirs.message_types_by_name,
        _diff_message,
        diffs,
        where=where,
        kind="message",
    )
    _diff_children(ours.services_by_name, theirs.services_by_name, _diff_service, diffs, where=where, kind="service")
    return diffs


def test_model_config_matches_triton() -> None:
    assert _diff_file(model_config_pb2.DESCRIPTOR, triton_model_config.DESCRIPTOR) == []


def test_grpc_service_matches_triton() -> None:
    assert _diff_file(grpc_service_pb2.DESCRIPTOR, triton_service.DESCRIPTOR) == []


def test_comparison_catches_a_renumbered_field() -> None:
    # Guards the comparison itself: a schema that differs in one field number must not pass.
    from google.protobuf import descriptor_pb2

    changed = descriptor_pb2.FileDescriptorProto()
    model_config_pb2.DESCRIPTOR.CopyToProto(changed)
    message = next(m for m in changed.message_type if m.name == "ModelInput")
    next(f for f in message.field if f.name == "optional").number = 99
    renumbered = descriptor_pool.DescriptorPool().AddSerializedFile(changed.SerializeToString())

    diffs = _diff_file(renumbered, triton_model_config.DESCRIPTOR)

    assert len(diffs) == 1
    assert "inference.ModelInput" in diffs[0]
    assert "99" in diffs[0]


def test_generated_modules_use_the_private_pool() -> None:
    default = descriptor_pool.Default()
    for module in (model_config_pb2, grpc_service_pb2, health_pb2):
        assert module.DESCRIPTOR.pool is _pool.POOL
    theirs = triton_model_config.ModelConfig.DESCRIPTOR
    assert default.FindMessageTypeByName("inference.ModelConfig") is theirs


def test_messages_are_wire_compatible_with_tritonclient() -> None:
    ours = grpc_service_pb2.ModelConfigResponse()
    ours.config.name = "add_sub"
    ours.config.max_batch_size = 8
    ours.config.input.add(name="INPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[-1, 4])
    ours.config.dynamic_batching.priority_queue_policy[2].default_timeout_microseconds = 2**40
    ours.config.parameters["EXECUTION_ENV_PATH"].string_value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"

    theirs = triton_service.ModelConfigResponse.FromString(ours.SerializeToString())

    assert theirs.config.name == "add_sub"
    assert list(theirs.config.input[0].dims) == [-1, 4]
    assert theirs.config.input[0].data_type == triton_model_config.TYPE_FP32
    assert theirs.config.dynamic_batching.priority_queue_policy[2].default_timeout_microseconds == 2**40
    assert theirs.SerializeToString(deterministic=True) == ours.SerializeToString(deterministic=True)


def test_inference_service_stubs_exist() -> None:
    service = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    rpcs = {method.name for method in service.methods}
    servicer = grpc_service_pb2_grpc.GRPCInferenceServiceServicer
    assert all(callable(getattr(servicer, rpc)) for rpc in rpcs)
    assert callable(grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server)


def test_health_service() -> None:
    service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    assert service.full_name == "grpc.health.v1.Health"
    check = service.methods_by_name["Check"]
    assert check.input_type.full_name == "grpc.health.v1.HealthCheckRequest"
    assert check.output_type.full_name == "grpc.health.v1.HealthCheckResponse"
    assert not check.client_streaming
    assert not check.server_streaming
    status = health_pb2.HealthCheckResponse.ServingStatus
    assert status.items() == [
        ("UNKNOWN", 0),
        ("SERVING", 1),
        ("NOT_SERVING", 2),
        ("SERVICE_UNKNOWN", 3),
    ]
    assert health_pb2.HealthCheckRequest.DESCRIPTOR.fields_by_name["service"].number == 1
    assert health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"].number == 1
