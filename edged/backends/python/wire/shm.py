"""Shared memory between the daemon and one stub: a ring of bytes per direction, each in its own memfd.

Ownership: the side that writes a ring (the producer) creates it with ``os.memfd_create`` and hands the file
descriptor to the other side over the Unix socket. Nothing has a name under /dev/shm, so a kill -9 of either
process leaks nothing: the kernel frees the memory when the last descriptor and mapping are gone.

Positions are virtual byte counts that only grow; the physical offset is ``position % capacity``. The consumer
publishes how far it has finished reading in the region's header, so the producer learns what it may reuse without
a message. A block never wraps: when it does not fit before the end, the producer skips to the start. When the
ring is too small or still full, the producer moves to a new, larger region and sends it along with the message
that first uses it; the consumer drops the old one once that message arrives, and a mapping still in use (numpy
views over inputs) stays valid until its last view is gone, because the mmap object lives as long as they do.

This module is imported by the stub too, so it uses the standard library only.
"""

from __future__ import annotations

import collections
import mmap
import os
import struct
import threading

HEADER_SIZE = 64  # the consumer's position, padded to a cache line
ALIGNMENT = 64
DEFAULT_SIZE = 1 << 20
_POSITION = struct.Struct("<Q")


def align(size: int) -> int:
    return (size + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


class RingFull(Exception):
    """The producer may not grow past its limit."""


class Region:
    """One mapped memfd: a header holding the consumer's position, then ``capacity`` bytes of ring."""

    __slots__ = ("capacity", "mm", "size", "view")

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.capacity = size - HEADER_SIZE
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self.mm)

    def consumed(self) -> int:
        return int(_POSITION.unpack_from(self.mm, 0)[0])

    def set_consumed(self, position: int) -> None:
        _POSITION.pack_into(self.mm, 0, position)

    def span(self, position: int, length: int) -> memoryview:
        start = HEADER_SIZE + position % self.capacity
        return self.view[start : start + length]

    def close(self) -> None:
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            pass  # numpy views still use it; the mapping goes when they do


class Producer:
    """The writing end of a ring. Not thread-safe: the caller serialises ``reserve`` with sending the message."""

    def __init__(self, initial_size: int = DEFAULT_SIZE, max_size: int = 1 << 34) -> None:
        self._initial = max(initial_size, HEADER_SIZE + ALIGNMENT)
        self._max = max_size
        self._region: Region | None = None
        self._position = 0
        self._consumed = 0  # the consumer's position as last read from the region's header
        # A region the consumer has not been given yet: its fd goes with the next message sent.
        self._unsent_fd: int | None = None

    def reserve(self, length: int) -> tuple[int, memoryview]:
        """Room for ``length`` bytes: their position and a writable view. The message that names the position
        must be the next one sent, with ``pending_region()`` when there is one."""
        region = self._region
        if region is None:
            region = self._grow(length)
        elif length == 0:
            return self._position, region.view[0:0]
        else:
            capacity = region.capacity
            physical = self._position % capacity
            end = self._position + length + (capacity - physical if physical + length > capacity else 0)
            # The consumer's position is read from shared memory only when the last one seen leaves no room.
            if end - self._consumed > capacity:
                self._consumed = region.consumed()
                if end - self._consumed > capacity:
                    region = self._grow(length)
        physical = self._position % region.capacity
        if physical + length > region.capacity:
            self._position += region.capacity - physical
        start = self._position
        self._position += length
        return start, region.span(start, length)

    def _grow(self, length: int) -> Region:
        size = self._initial
        if self._region is not None:
            size = self._region.size * 2
        while size - HEADER_SIZE < 2 * length:
            size *= 2
        if size > self._max:
            raise RingFull(f"a message of {length} bytes needs more shared memory than the limit of {self._max}")
        fd = os.memfd_create("edged-python-backend", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            region = Region(fd, size)
        except OSError:
            os.close(fd)
            raise
        if self._unsent_fd is not None:
            os.close(self._unsent_fd)  # never sent: the consumer never used it
        if self._region is not None:
            self._region.close()
        self._region = region
        self._position = 0
        self._consumed = 0
        self._unsent_fd = fd
        return region

    def pending_region(self) -> tuple[int, int] | None:
        """The (fd, size) of a region the consumer must map before reading the next message, if there is one: the
        caller sends the fd with that message, then calls ``region_sent``."""
        if self._unsent_fd is None or self._region is None:
            return None
        return self._unsent_fd, self._region.size

    def region_sent(self) -> None:
        if self._unsent_fd is not None:
            os.close(self._unsent_fd)
            self._unsent_fd = None

    def close(self) -> None:
        if self._unsent_fd is not None:
            os.close(self._unsent_fd)
            self._unsent_fd = None
        if self._region is not None:
            self._region.close()
            self._region = None


class Block:
    """A span the consumer holds until ``release``; releases may come in any order and from any thread."""

    __slots__ = ("_consumer", "_end", "_region", "_released")

    def __init__(self, consumer: Consumer, region: Region, end: int) -> None:
        self._consumer = consumer
        self._region = region
        self._end = end
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._consumer._advance(self)


class Consumer:
    """The reading end of a ring: maps regions as they arrive and publishes how far it is done."""

    def __init__(self) -> None:
        self._region: Region | None = None
        self._held: collections.deque[Block] = collections.deque()
        self._lock = threading.Lock()

    def attach(self, fd: int, size: int) -> None:
        """Map a new region (the fd is closed); blocks of the old one need no more releasing."""
        try:
            region = Region(fd, size)
        finally:
            os.close(fd)
        with self._lock:
            old, self._region = self._region, region
            self._held.clear()
        if old is not None:
            old.close()

    def read(self, position: int, length: int) -> memoryview:
        if length == 0:
            return memoryview(b"")
        region = self._region
        if region is None:
            raise ValueError("no shared memory region has been received")
        if length > region.capacity or length < 0 or position < 0:
            raise ValueError(f"span of {length} bytes at {position} is outside the shared memory region")
        return region.span(position, length)

    def hold(self, end: int) -> Block:
        """Keep the ring up to ``end`` until the returned block is released."""
        region = self._region
        if region is None:
            raise ValueError("no shared memory region has been received")
        block = Block(self, region, end)
        with self._lock:
            self._held.append(block)
        return block

    def _advance(self, block: Block) -> None:
        with self._lock:
            if block._region is not self._region:
                return
            position = -1
            while self._held and self._held[0]._released:
                position = self._held.popleft()._end
            if position >= 0:
                block._region.set_consumed(position)

    def close(self) -> None:
        with self._lock:
            region, self._region = self._region, None
            self._held.clear()
        if region is not None:
            region.close()
