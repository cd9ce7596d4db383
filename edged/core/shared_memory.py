"""The shared-memory extension: tensors in POSIX shared memory regions that clients register by name.

A region is a window (offset, byte_size) of a POSIX shared memory object the client created (`/dev/shm/<key>`).
Inputs are read as views over the mapping (no copy); outputs are written into it. Every offset and size a client
sends is checked against the registered window before any access, with Python's unbounded integers, so no sum can
wrap. Regions in use by a request cannot be unregistered until the request is done.

Threads: registration and lookups happen on the event loop; a request holds its regions until its response is
written.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.core.inference import InferOutput, InferRequest

SHM_DIRECTORY = "/dev/shm"
# Keys edged creates for itself (the Python backend's tensors): a client can never register them.
INTERNAL_KEY_PREFIX = "/edged-"
_MAX_SIZE = 2**63 - 1  # byte sizes and offsets travel as int64/uint64; anything larger is not a region
# Each region is an open mapping of the daemon's; a client must not be able to exhaust the process's map count.
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
    mapping: mmap.mmap
    users: int = 0

    def close(self) -> None:
        # numpy arrays of a finished request may still view the mapping; then it unmaps when the last one goes.
        with contextlib.suppress(BufferError):
            self.mapping.close()


def _disabled() -> EdgedError:
    return EdgedError(
        ErrorCode.UNSUPPORTED,
        "shared memory support is disabled: start edged with --allow-client-shm=true to use shared memory regions",
    )


def _invalid(message: str) -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, message)


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
        if not (0 <= offset <= _MAX_SIZE and 0 < byte_size <= _MAX_SIZE):
            raise _invalid(
                f"failed to register shared memory region '{name}': invalid args (offset {offset}, byte size "
                f"{byte_size})"
            )
        path = _key_path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise EdgedError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'") from None
        if len(self._regions) >= MAX_REGIONS:
            os.close(fd)
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                f"failed to register shared memory region '{name}': {MAX_REGIONS} regions are registered already",
            )
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise _invalid(
                    f"failed to register shared memory region '{name}': invalid args (offset {offset} + byte size "
                    f"{byte_size} is past the {size} bytes of '{key}')"
                )
            try:
                mapping = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except (OSError, ValueError, OverflowError) as exc:
                raise EdgedError(
                    ErrorCode.INTERNAL, f"failed to map shared memory region '{name}': {getattr(exc, 'strerror', exc)}"
                ) from None
        finally:
            os.close(fd)
        self._regions[name] = _Region(name, key, offset, byte_size, mapping)

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
                tensor.raw = memoryview(region.mapping)[start : start + size]
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
            region.mapping[start : start + len(data)] = data
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
        if size < 0 or offset + size > region.byte_size:
            raise _invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region, region.offset + offset, size


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
