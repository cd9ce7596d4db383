"""The shared-memory extension: tensors in POSIX shared memory regions that clients register by name.

A region is a window (offset, byte_size) of a POSIX shared memory object the client created (`/dev/shm/<key>`).
Every offset and size a client sends is checked against the registered window before any access, with Python's
unbounded integers, so no sum can wrap. Regions in use by a request cannot be unregistered until the request is
done.

The object belongs to the client, who may shrink or truncate it at any moment. A memory mapping of it would then
kill the daemon with SIGBUS on the next access past the new end, and no check made before the access can close that
race. So edged never maps a client's object: it keeps the file descriptor opened at registration and moves each
tensor with one ``preadv`` into a buffer of its own (inputs) or one ``pwrite`` (outputs). A read past the end is a
short read, answered as an error for that request; the registration stays, so a client that restores the size can
go on. Unlinking the object changes nothing: the descriptor keeps it alive, as the client's own mapping does. The
cost is one copy of each input, which the mapping avoided (the backends copy inputs into their own buffers anyway
when they batch or send them to a Python stub).

Threads: registration and lookups happen on the event loop; a request holds its regions until its response is
written.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from edged.core.access import ACTOR
from edged.errors import EdgedError, ErrorCode

log = logging.getLogger("edged.shared_memory")

if TYPE_CHECKING:
    from edged.core.request.inference import InferOutput, InferRequest

SHM_DIRECTORY = "/dev/shm"
# Keys edged creates for itself (the Python backend's tensors): a client can never register them.
INTERNAL_KEY_PREFIX = "/edged-"
# Key prefixes no client may register (leading slashes aside): edged's own, and the one Triton reserves for its
# Python backend, which a client moving from Triton must find refused the same way.
_RESERVED_PREFIXES = (INTERNAL_KEY_PREFIX.lstrip("/"), "triton_python_backend_shm_region_")
_MAX_SIZE = 2**63 - 1  # byte sizes and offsets travel as int64/uint64; anything larger is not a region
# Each region holds a file descriptor of the daemon's; a client must not be able to exhaust them.
MAX_REGIONS = 1024
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"


@dataclass(frozen=True, slots=True)
class SystemRegionStatus:
    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(slots=True)
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int  # the client's object, opened at registration; never mapped (see the module's docstring)
    users: int = 0

    def read(self, start: int, size: int) -> memoryview:
        """``size`` bytes at ``start`` of the object, in a buffer of the daemon's own."""
        # np.empty, not bytearray: the kernel fills every byte, so zeroing them first would be a wasted pass.
        view = np.empty(size, dtype=np.uint8).data
        done = os.preadv(self.fd, [view], start)
        while done < size:  # a short read: the object ends early, or (rarely) the kernel stopped part way
            count = os.preadv(self.fd, [view[done:]], start + done)
            if count == 0:
                raise self._shrunk(start + size)
            done += count
        return view

    def write(self, start: int, data: memoryview) -> None:
        # Checked first so that a shrunk object gets an error instead of being grown back by the write.
        if os.fstat(self.fd).st_size < start + len(data):
            raise self._shrunk(start + len(data))
        done = 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], start + done)

    def _shrunk(self, end: int) -> EdgedError:
        size = os.fstat(self.fd).st_size
        return _invalid(
            f"shared memory region '{self.name}' no longer holds its registered window: its object '{self.key}' is "
            f"{size} bytes now, the window reaches byte {end}; restore its size or register the region again"
        )

    def close(self) -> None:
        os.close(self.fd)


def _disabled() -> EdgedError:
    # Triton's words since it, too, has client shared memory off unless --allow-client-shm is given.
    return EdgedError(
        ErrorCode.UNSUPPORTED,
        "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.",
    )


def _invalid(message: str) -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, message)


def _unreadable(name: str, exc: OSError) -> EdgedError:
    return EdgedError(ErrorCode.INTERNAL, f"shared memory region '{name}' cannot be accessed: {exc.strerror or exc}")


class SharedMemoryManager:
    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed
        self._regions: dict[str, _Region] = {}

    # --- the extension's API ------------------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not self.allowed:
            raise _disabled()
        if not name:
            raise _invalid("shared memory region name must not be empty")
        if name in self._regions:
            raise EdgedError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        _check_key(name, key)
        path = _key_path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            # As Triton: a key that opens nothing is named before the sizes are looked at.
            raise EdgedError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'") from None
        if not (0 <= offset <= _MAX_SIZE and 0 < byte_size <= _MAX_SIZE):
            os.close(fd)
            raise _invalid(
                f"failed to register shared memory region '{name}': invalid args (offset {offset}, byte size "
                f"{byte_size})"
            )
        if len(self._regions) >= MAX_REGIONS:
            os.close(fd)
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                f"failed to register shared memory region '{name}': {MAX_REGIONS} regions are registered already",
            )
        try:
            size = os.fstat(fd).st_size
        except OSError:
            os.close(fd)
            raise EdgedError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'") from None
        if offset + byte_size > size:
            os.close(fd)
            raise _invalid(
                f"failed to register shared memory region '{name}': invalid args (offset {offset} + byte size "
                f"{byte_size} is past the {size} bytes of '{key}')"
            )
        self._regions[name] = _Region(name, key, offset, byte_size, fd)
        log.info("shared memory region '%s' registered by %s (%d bytes)", name, ACTOR.get() or "anonymous", byte_size)

    def unregister_system(self, name: str) -> None:
        """Unregister one region, or every region when ``name`` is empty; unknown names are not an error."""
        if not self.allowed:
            raise _disabled()
        if name:
            region = self._regions.get(name)
            if region is not None and region.users:
                raise EdgedError(
                    ErrorCode.INTERNAL, f"Cannot unregister shared memory region '{name}', it is currently in use."
                )
            if region is not None:
                del self._regions[name]
                region.close()
            return
        # All: the idle regions go, the busy ones stay and are named.
        busy = [r.name for r in self._regions.values() if r.users]
        for region in [r for r in self._regions.values() if not r.users]:
            del self._regions[region.name]
            region.close()
        if busy:
            raise EdgedError(
                ErrorCode.INTERNAL,
                "Failed to unregister the following system shared memory regions: "
                + "".join(f"{n} ," for n in sorted(busy)),
            )

    def system_status(self, name: str) -> list[SystemRegionStatus]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise EdgedError(ErrorCode.NOT_FOUND, f"Unable to find system shared memory region: '{name}'")
            regions = [region]
        else:
            regions = list(self._regions.values())
        return [SystemRegionStatus(r.name, r.key, r.offset, r.byte_size) for r in regions]

    def register_cuda(self, name: str) -> None:
        if not self.allowed:
            raise _disabled()
        raise EdgedError(
            ErrorCode.UNSUPPORTED,
            f"CUDA shared memory region '{name}' cannot be registered: this edged has no CUDA device path",
        )

    def unregister_cuda(self, name: str) -> None:
        if not self.allowed:
            raise _disabled()
        del name  # no CUDA region can exist, so there is nothing to remove

    def cuda_status(self, name: str) -> list[Any]:
        if name:
            raise EdgedError(ErrorCode.NOT_FOUND, f"Unable to find cuda shared memory region: '{name}'")
        return []

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()

    # --- use by requests --------------------------------------------------------------------------------

    def bind_inputs(self, request: InferRequest) -> list[_Region]:
        """Point every shared-memory input at its window; the returned regions stay held until ``release``."""
        held: list[_Region] = []
        try:
            for tensor in request.inputs:
                if REGION not in tensor.parameters:
                    continue
                region, start, size = self._window(tensor.parameters, "input", tensor.name)
                region.users += 1
                held.append(region)
                try:
                    tensor.raw = region.read(start, size)
                except OSError as exc:
                    raise _unreadable(region.name, exc) from None
            for output in request.outputs or ():
                if REGION in output.parameters:
                    region, _, _ = self._window(output.parameters, "output", output.name)
                    region.users += 1
                    held.append(region)
        except BaseException:
            self.release(held)
            raise
        return held

    def write_outputs(self, request: InferRequest, outputs: list[InferOutput], encode: Any) -> None:
        """Copy each output that asked for shared memory into its window; ``encode(output)`` gives its bytes."""
        wanted = {o.name: o.parameters for o in request.outputs or () if REGION in o.parameters}
        if not wanted:
            return
        for output in outputs:
            params = wanted.get(output.name)
            if params is None:
                continue
            region, start, size = self._window(params, "output", output.name)
            data = memoryview(encode(output)).cast("B")
            if len(data) > size:
                raise EdgedError(
                    ErrorCode.INTERNAL,
                    f"shared memory size specified with the request for output '{output.name}' ({size} bytes) "
                    f"should be at least {len(data)} bytes to hold the results",
                )
            try:
                region.write(start, data)
            except OSError as exc:
                raise _unreadable(region.name, exc) from None
            output.in_shared_memory = True

    def release(self, held: list[_Region]) -> None:
        for region in held:
            region.users -= 1

    def _window(self, params: dict[str, Any], kind: str, tensor: str) -> tuple[_Region, int, int]:
        if not self.allowed:
            raise _disabled()
        name = params.get(REGION)
        size = params.get(BYTE_SIZE)
        offset = params.get(OFFSET, 0)
        if not isinstance(name, str):
            raise _invalid(f"'{REGION}' of {kind} '{tensor}' must be a string")
        if isinstance(size, bool) or not isinstance(size, int):
            raise _invalid(f"{kind} '{tensor}' must set '{BYTE_SIZE}' with '{REGION}'")
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise _invalid(f"'{OFFSET}' of {kind} '{tensor}' must be an integer")
        region = self._regions.get(name)
        if region is None:
            raise EdgedError(ErrorCode.NOT_FOUND, f"Unable to find shared memory region: '{name}'")
        if offset < 0 or offset >= region.byte_size:
            raise _invalid(f"Invalid offset for shared memory region: '{name}'")
        if size > _SIZE_MAX - offset:  # Triton's check for a sum its size_t cannot hold, in its words
            raise _invalid(
                f"Integer overflow detected: byte_size ({size}) + offset ({offset}) exceeds maximum value "
                f"({_SIZE_MAX}) for region '{name}'"
            )
        if size < 0 or offset + size > region.byte_size:
            raise _invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region, region.offset + offset, size


_SIZE_MAX: Final = 2**64 - 1


def _check_key(name: str, key: str) -> None:
    """INVALID_ARG, in Triton's words, for a key of slashes only or one with a reserved prefix."""
    bare = key.lstrip("/")
    if key and not bare:
        raise _invalid(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
    for prefix in _RESERVED_PREFIXES:
        if bare.startswith(prefix):
            raise _invalid(
                f"cannot register shared memory region '{name}' with key '{key}' as the key contains the reserved "
                f"prefix '{prefix}'"
            )


def _key_path(key: str) -> str:
    """The file behind a POSIX shared memory key, refusing anything that could reach outside /dev/shm."""
    name = key[1:] if key.startswith("/") else key
    if (
        not name
        or "/" in name
        or "\0" in name
        or name in (".", "..")
        or key.startswith(INTERNAL_KEY_PREFIX)
        or ("/" + name).startswith(INTERNAL_KEY_PREFIX)
    ):
        raise EdgedError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'")
    return os.path.join(SHM_DIRECTORY, name)
