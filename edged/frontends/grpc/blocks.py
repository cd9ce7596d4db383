"""Request header blocks of one HTTP/2 connection (RFC 7541), decoded with ``hpack`` (the HPACK library of the
python-hyper project) within edged.frontends.grpc.bounds, and checked against RFC 9113 section 8
(edged.frontends.grpc.fields).

Decoded blocks are remembered while the decoder's table is unchanged: a client's calls repeat byte-identical blocks
once its own table is warm, and the HPACK decoder in Python is a large part of a small call's cost. What is
remembered is bounded by bytes (the block and its header list), so distinct large blocks cost a connection at most
``DECODED_CACHE_BYTES``.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple, cast

import hpack

from edged.frontends.grpc.bounds import DECODED_CACHE_BYTES, HEADER_TABLE, MAX_HEADER_LIST, MAX_TABLE_SIZE_UPDATES
from edged.frontends.grpc.fields import check_request, check_trailers
from edged.frontends.grpc.frames import COMPRESSION_ERROR, ENHANCE_YOUR_CALM, ProtocolError

# RFC 7541 4.1: each header list entry counts its name, its value and 32 bytes.
_ENTRY_OVERHEAD: Final = 32


class Block(NamedTuple):
    """A decoded request header block: its fields, the ``content-length`` it declares, and what makes it malformed
    as a request (RFC 9113 section 8; None when nothing)."""

    headers: list[tuple[bytes, bytes]]
    content_length: int | None
    malformed: str | None


class BlockDecoder:
    """The connection's HPACK decoder, and the blocks it remembers."""

    __slots__ = ("_blocks", "_cached_bytes", "_decoder", "_table_state")

    def __init__(self) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._decoder.max_allowed_table_size = HEADER_TABLE
        self._blocks: dict[bytes, Block] = {}
        self._cached_bytes = 0
        self._table_state: tuple[int, int, int, int] = self._state()

    def request(self, block: bytes) -> Block:
        """A request's header block; ProtocolError (a connection error) when it cannot be decoded."""
        cached = self._blocks.get(block)
        if cached is not None:
            return cached
        headers, changed = self._decode(block)
        length, malformed = check_request(headers)
        decoded = Block(headers, length, malformed)
        if not changed:
            self._remember(block, decoded)
        return decoded

    def trailers(self, block: bytes) -> str | None:
        """Decodes a request's trailers (the table must see them); what makes them malformed, or None."""
        return check_trailers(self._decode(block)[0])

    def _decode(self, block: bytes) -> tuple[list[tuple[bytes, bytes]], bool]:
        """The block's fields, and whether it changed the decoder's table."""
        _check_table_size_updates(block)
        try:
            headers = cast("list[tuple[bytes, bytes]]", self._decoder.decode(block, raw=True))
        except hpack.OversizedHeaderListError:
            raise ProtocolError(ENHANCE_YOUR_CALM, "header list too large") from None
        except hpack.HPACKError as exc:
            raise ProtocolError(COMPRESSION_ERROR, f"bad header block: {exc}") from None
        state = self._state()
        if state == self._table_state:
            return headers, False
        # The block changed the table: decoding it again would change it again, and every block remembered may now
        # mean something else.
        self._table_state = state
        self._blocks.clear()
        self._cached_bytes = 0
        return headers, True

    def _remember(self, block: bytes, decoded: Block) -> None:
        cost = len(block) + sum(len(n) + len(v) + _ENTRY_OVERHEAD for n, v in decoded.headers)
        if cost > DECODED_CACHE_BYTES // 4:
            return  # a block this large is not a client's repeated call
        if self._cached_bytes + cost > DECODED_CACHE_BYTES:
            self._blocks.clear()
            self._cached_bytes = 0
        self._blocks[block] = decoded
        self._cached_bytes += cost

    def _state(self) -> tuple[int, int, int, int]:
        table: Any = self._decoder.header_table
        entries = table.dynamic_entries
        # An entry added makes a new tuple at the front, even when the table is full and its length stays.
        return len(entries), id(entries[0]) if entries else 0, table.maxsize, table._current_size


def _check_table_size_updates(block: bytes) -> None:
    """RFC 7541 4.2: table size updates come only at the start of a block, at most two (hpack refuses one after a
    field, but not a thousand before the first: each costs the decoder time and counts toward nothing)."""
    position = 0
    updates = 0
    size = len(block)
    while position < size and block[position] & 0xE0 == 0x20:
        updates += 1
        if updates > MAX_TABLE_SIZE_UPDATES:
            raise ProtocolError(COMPRESSION_ERROR, "more than two table size updates in a header block")
        if block[position] & 0x1F == 0x1F:  # the integer goes on in the bytes that have the high bit set
            position += 1
            while position < size and block[position] & 0x80:
                position += 1
        position += 1
