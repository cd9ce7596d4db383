"""KServe v2 over gRPC: the services on grpc.aio (service.py), the protobuf messages to and from the core's
requests and answers (codec.py), and grpc's core imported with the settings edged serves with (core.py)."""

from edged.frontends.grpc.core import import_core

import_core()  # before anything below imports grpc

from edged.frontends.grpc.service import GrpcOptions, GrpcServer  # noqa: E402

__all__ = ["GrpcOptions", "GrpcServer"]
