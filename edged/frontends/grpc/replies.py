"""The replies of one ModelStreamInfer call (``StreamReplies``), as its requests produce them.

One queue holds them and the call's writer drains it in the order they were put, so that a decoupled model's
responses go out as they come, whichever request of the stream they answer, as Triton writes them: a request that
streams slowly never holds back the responses of the requests read after it. The replies of models that are not
decoupled keep the order their requests came in, as Triton keeps it: each such request waits for its ``Turn``, which
the request read before it passes on once its own reply is put (a decoupled request passes it on at once).

Bounds, per call:

- the requests running at once (``in_flight``): past it, or while the replies held are over ``limit``, the reader
  stops reading, and HTTP/2 flow control pushes back on the client;
- the bytes of replies produced and not yet written (``limit``): a decoupled model may answer without end while a
  client reads nothing, so a request whose next reply finds the call over it is cancelled with an error;
- with a response pool (``pool``, Triton's --grpc-max-response-pool-size), the count of those replies: a decoupled
  request past it waits for the client to read before its next reply is encoded, and what its model sends
  meanwhile, which waits in the core's response stream, still counts against ``limit``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from edged.errors import EdgedError, unavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from edged.core.request.inference import ResponseStream

# What a queued reply holds beyond its encoded size (the message object, its queue entry), so that a flood of empty
# replies is bounded too.
REPLY_OVERHEAD: Final = 512


class Turn:
    """A request's place among the requests of its call whose replies keep request order."""

    __slots__ = ("_before", "mine", "passed")

    def __init__(self, before: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
        self._before = before
        self.mine = mine
        self.passed = False

    async def wait(self) -> None:
        """Until the requests read before this one have put their ordered replies (at once once passed on)."""
        if not self.passed and self._before is not None and not self._before.done():
            # Shielded: a request cancelled while it waits must not cancel the turn of the one before it.
            await asyncio.shield(self._before)

    def pass_on(self) -> None:
        """The next request's turn comes once this one's has (and this one has put what it waits to put)."""
        if self.passed:
            return
        self.passed = True
        before = self._before
        if before is None or before.done():
            self._open(before)
        else:
            before.add_done_callback(self._open)

    def _open(self, _: object) -> None:
        if not self.mine.done():
            self.mine.set_result(None)


class StreamReplies:
    """The replies of one call's requests, in the order they are produced; None, once every request read has
    ended and the reader is done, ends the call."""

    def __init__(self, limit: int, pool: int, in_flight: int) -> None:
        self.limit = limit
        self.pool = pool
        self.queued = 0
        self.held = 0
        self._queue: asyncio.Queue[tuple[Any, EdgedError | None, int] | None] = asyncio.Queue()
        self._moved = asyncio.Event()
        self._slots = asyncio.Semaphore(in_flight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = 0
        self._reading = True
        self._last_turn: asyncio.Future[None] | None = None

    # --- the reader's side ------------------------------------------------------------------------------------

    async def start(self, run: Callable[[Turn], Coroutine[Any, Any, None]]) -> None:
        """Run one request read from the call, once fewer than ``in_flight`` are running and the client has read
        enough of what was answered (a client that sends and never reads is not answered without bound)."""
        await self._slots.acquire()
        while self.queued >= self.limit:
            self._moved.clear()
            await self._moved.wait()
        turn = Turn(self._last_turn, asyncio.get_running_loop().create_future())
        self._last_turn = turn.mine
        self._running += 1
        task = asyncio.create_task(self._run(run, turn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, run: Callable[[Turn], Coroutine[Any, Any, None]], turn: Turn) -> None:
        try:
            await run(turn)
        finally:
            turn.pass_on()
            self._slots.release()
            self._running -= 1
            self._end_if_done()

    def reading_done(self) -> None:
        """The reader read its last request: the call ends once the requests running have."""
        self._reading = False
        self._end_if_done()

    def _end_if_done(self) -> None:
        if not self._reading and self._running == 0:
            self._queue.put_nowait(None)

    def cancel(self) -> None:
        """The call is over (its client went away, or it ended): nothing still running for it is wanted."""
        for task in list(self._tasks):
            task.cancel()

    # --- a request's side -------------------------------------------------------------------------------------

    def put(self, reply: Any, error: EdgedError | None) -> None:
        # Never refused here: a request's last reply (its error included) must reach the client. What is bounded
        # is what a decoupled model adds (backlog_full); past the bound each request adds at most its error.
        size = reply.ByteSize() + REPLY_OVERHEAD
        self.queued += size
        self.held += 1
        self._queue.put_nowait((reply, error, size))

    def backlog_full(self) -> bool:
        return self.queued >= self.limit

    def overflow(self, request_id: str) -> EdgedError:
        who = f"request '{request_id}'" if request_id else "the request"
        return unavailable(
            f"{who} was cancelled: its stream holds more than {self.limit} bytes of responses that the client has "
            "not read"
        )

    def pool_full(self) -> bool:
        """Whether a response pool holds as many replies as it may: room() then waits for the client to read."""
        return self.pool > 0 and self.held >= self.pool

    async def room(self, stream: ResponseStream | None) -> bool:
        """Wait until the pool has room for one more reply; False when what the model sent meanwhile, waiting in
        ``stream``, passes the byte bound, as a model that never waits would."""
        if stream is not None:
            stream.on_put = self._wake
        try:
            while self.pool_full():
                if stream is not None and self.queued + stream.nbytes >= self.limit:
                    return False
                self._moved.clear()
                await self._moved.wait()
            return True
        finally:
            if stream is not None:
                stream.on_put = None

    def _wake(self) -> None:
        self._moved.set()

    # --- the writer's side ------------------------------------------------------------------------------------

    async def get(self) -> tuple[Any, EdgedError | None] | None:
        item = await self._queue.get()
        if item is None:
            return None
        reply, error, size = item
        self.queued -= size
        self.held -= 1
        self._wake()
        return reply, error
