"""KServe v2 over gRPC: the services on grpc.aio (service.py) and the protobuf messages to and from the core's
requests and answers (codec.py)."""

from edged.frontends.grpc.service import GrpcOptions, GrpcServer

__all__ = ["GrpcOptions", "GrpcServer"]
