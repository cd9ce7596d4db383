"""The access policy (edged.core.access) at the door of the gRPC endpoint: every RPC placed in its API category, as
Triton groups them for ``--grpc-restricted-protocol``, and checked before the servicer runs.

A refusal is answered as Triton answers its restricted protocols (UNAVAILABLE "This protocol is restricted,
expecting header 'triton-grpc-protocol-<key>'") or, for edged's tokens, UNAUTHENTICATED without valid credentials
and PERMISSION_DENIED when the token's role does not grant the category. Credentials travel as metadata:
``authorization: Bearer <token>``, which tritonclient sends from its ``headers=`` argument. A load with overrides
brings code (edged.core.access.load_brings_code): the guard reads that from the request before the servicer runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from edged.core.access import ACTOR, AccessDenied, AccessPolicy, Caller, Category, Refusal, load_brings_code, open_actor
from edged.frontends.grpc.status import StatusCode
from edged.frontends.tls import peer_identity_grpc

if TYPE_CHECKING:
    from edged.frontends.grpc.calls import Call

INFERENCE_SERVICE: Final[Mapping[str, Category]] = {
    "ServerLive": Category.HEALTH,
    "ServerReady": Category.HEALTH,
    "ModelReady": Category.HEALTH,
    "ServerMetadata": Category.METADATA,
    "ModelMetadata": Category.METADATA,
    "ModelInfer": Category.INFERENCE,
    "ModelStreamInfer": Category.INFERENCE,
    "ModelConfig": Category.MODEL_CONFIG,
    "ModelStatistics": Category.STATISTICS,
    "RepositoryIndex": Category.MODEL_REPOSITORY,
    "RepositoryModelLoad": Category.MODEL_REPOSITORY,
    "RepositoryModelUnload": Category.MODEL_REPOSITORY,
    "SystemSharedMemoryStatus": Category.SHARED_MEMORY,
    "SystemSharedMemoryRegister": Category.SHARED_MEMORY,
    "SystemSharedMemoryUnregister": Category.SHARED_MEMORY,
    "CudaSharedMemoryStatus": Category.SHARED_MEMORY,
    "CudaSharedMemoryRegister": Category.SHARED_MEMORY,
    "CudaSharedMemoryUnregister": Category.SHARED_MEMORY,
    "TraceSetting": Category.TRACE,
    "LogSettings": Category.LOGGING,
}
HEALTH_SERVICE: Final[Mapping[str, Category]] = {"Check": Category.HEALTH, "Watch": Category.HEALTH}
# The RPCs whose request may bring code (see edged.core.access.AccessPolicy.check): whether this one does.
BRINGS_CODE: Final[Mapping[str, Callable[[Any], bool]]] = {
    "RepositoryModelLoad": lambda request: load_brings_code(request.parameters),
}

_CODES: Final = {
    Refusal.RESTRICTED: StatusCode.UNAVAILABLE,
    Refusal.UNAUTHENTICATED: StatusCode.UNAUTHENTICATED,
    Refusal.FORBIDDEN: StatusCode.PERMISSION_DENIED,
}


def guard(servicer: object, policy: AccessPolicy, methods: Mapping[str, Category]) -> None:
    """Puts the policy in front of each of ``servicer``'s ``methods`` (an RPC not listed would not be guarded:
    a test holds the lists equal to the services' descriptors)."""
    for name, category in methods.items():
        method = getattr(servicer, name)
        if policy.is_open(category, "grpc"):
            # Nothing to check. An inference (unary or streamed) changes nothing a history records, so the hot
            # path is left as it is; any other open RPC only notes who asked, from the peer's address.
            if category is not Category.INFERENCE and not inspect.isasyncgenfunction(method):
                setattr(servicer, name, _noting_actor(method))
            continue
        if inspect.isasyncgenfunction(method):
            setattr(servicer, name, _guard_stream(method, category, policy))
        else:
            setattr(servicer, name, _guard_unary(method, category, policy, BRINGS_CODE.get(name)))


# The client's peer, as a frontend worker relaying a call saw it (edged.frontends.grpc.relay). Believed only from
# the daemon's Unix socket, which only the daemon's workers can reach: over TCP it is any client's word.
RELAYED_PEER: Final = "edged-relayed-peer"


def caller(context: Call) -> Caller:
    headers = {str(key).lower(): str(value) for key, value in context.invocation_metadata() or ()}
    peer = context.peer()
    if peer.startswith("unix:") and RELAYED_PEER in headers:
        peer = headers.pop(RELAYED_PEER)
    return Caller("grpc", peer_address(peer), headers, peer_identity_grpc(context))


def client_address(context: Call) -> str | None:
    """The client's IP address, a relayed call's included."""
    peer = context.peer()
    if peer.startswith("unix:"):
        for key, value in context.invocation_metadata() or ():
            if key == RELAYED_PEER:
                return peer_address(str(value))
    return peer_address(peer)


def peer_address(peer: str | None) -> str | None:
    """The IP address of grpc's peer string: ``ipv4:127.0.0.1:5000`` or ``ipv6:[::1]:5000``."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None


def _noting_actor(method: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    @functools.wraps(method)
    async def noted(request: Any, context: Call) -> Any:
        token = ACTOR.set(open_actor(client_address(context)))
        try:
            return await method(request, context)
        finally:
            ACTOR.reset(token)

    return noted


def _guard_unary(
    method: Callable[[Any, Any], Any],
    category: Category,
    policy: AccessPolicy,
    brings_code: Callable[[Any], bool] | None = None,
) -> Callable[[Any, Any], Any]:
    @functools.wraps(method)
    async def guarded(request: Any, context: Call) -> Any:
        try:
            code = brings_code is not None and brings_code(request)
            actor = policy.check(category, caller(context), code=code)
        except AccessDenied as denied:
            await context.abort(_CODES[denied.refusal], denied.message)
        token = ACTOR.set(actor)
        try:
            return await method(request, context)
        finally:
            ACTOR.reset(token)

    return guarded


def _guard_stream(
    method: Callable[[Any, Any], AsyncIterator[Any]], category: Category, policy: AccessPolicy
) -> Callable[[Any, Any], AsyncIterator[Any]]:
    @functools.wraps(method)
    async def guarded(requests: Any, context: Call) -> AsyncIterator[Any]:
        try:
            actor = policy.check(category, caller(context))
        except AccessDenied as denied:
            await context.abort(_CODES[denied.refusal], denied.message)
        # Who asked is not kept (ACTOR): a stream of inferences changes no model, and an async generator may be
        # finished in another context than the one it set a variable in.
        del actor
        async for reply in method(requests, context):
            yield reply

    return guarded
