"""KServe v2 over gRPC: the servicers (service.py) on edged's own HTTP/2 (server.py, calls.py, http2.py), the
protobuf messages to and from the core's requests and answers (codec.py), and grpc's core imported with the settings
the frontend workers' relay uses (core.py): the daemon itself never imports grpc."""

from edged.frontends.grpc.server import GrpcServer, inference_methods
from edged.frontends.grpc.service import GrpcOptions

__all__ = ["GrpcOptions", "GrpcServer", "inference_methods"]
