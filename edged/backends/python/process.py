"""The daemon's handle on one stub process: starting it, talking to it, and noticing when it is gone.

A stub is started without a shell (``Popen`` with an argument list) and gets one end of a socket pair as its
only extra descriptor. The handle talks in two modes:

* blocking, on a worker thread, while the stub starts (auto-complete, initialize) and while it stops (finalize);
* on the event loop once attached: the loop reads the socket as messages arrive and hands each to the owner's
  callback, and sends never block (a full socket queues until it drains). Nothing else touches the socket then.

Tensors the stub sends are copied out of its ring as each message is read, so its ring never waits on the
daemon's clients; tensors the daemon sends go through the daemon's own ring (edged.backends.python.wire.shm).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from edged.backends.python.wire import ipc, shm

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Mapping

log = logging.getLogger("edged.backends.python")

STUB_SCRIPT = Path(__file__).parent / "stub" / "main.py"
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_Packet = list[bytes | memoryview]
# Messages read in one turn of the event loop at most, so that one busy stub cannot hold the loop.
_READ_BURST = 16


class StubGone(Exception):
    """The stub closed its end: it exited, crashed or was killed."""


class StubProcess:
    def __init__(self, name: str, interpreter: str, env: Mapping[str, str], shm_size: int) -> None:
        self.name = name
        parent, child = ipc.socket_pair()
        self._sock = parent
        self._receiver = ipc.Receiver(parent)
        self.producer = shm.Producer(shm_size)
        self.consumer = shm.Consumer()
        try:
            self.process = subprocess.Popen(
                [interpreter, str(STUB_SCRIPT), str(child.fileno())],
                pass_fds=(child.fileno(),),
                close_fds=True,
                stdin=subprocess.DEVNULL,
                env=dict(env),
            )
        except OSError as exc:
            parent.close()
            raise StubGone(f"unable to start '{interpreter}': {exc.strerror}") from None
        finally:
            child.close()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_message: Callable[[dict[str, Any], memoryview | None], None] | None = None
        self._on_gone: Callable[[], None] | None = None
        self._expecting: Callable[[], bool] | None = None
        self._queued: deque[tuple[_Packet, list[int] | None]] = deque()
        self._gone = False
        self.kill_reason = ""

    # --- both modes -------------------------------------------------------------------------------------------

    def encode(self, message: dict[str, Any], tensors: ipc.TensorWriter | None) -> tuple[_Packet, list[int] | None]:
        """The packet for a message and the descriptors that go with it (see ipc.pack)."""
        return ipc.pack(message, tensors, self.producer, _encode)

    def decode(self, data: bytes | memoryview, fds: list[int]) -> dict[str, Any]:
        try:
            message: dict[str, Any] = _decode(data)
            if not isinstance(message, dict) or not isinstance(message.get("t"), str):
                raise ValueError("malformed message")
            size = message.get("region")
            if size is not None:
                if not fds:
                    raise ValueError("a new region came without its descriptor")
                self.consumer.attach(fds.pop(0), int(size))
        finally:
            for fd in fds:
                os.close(fd)
        return message

    def exit_description(self) -> str:
        """Why the process ended, for errors and the log (it must have ended)."""
        if self.kill_reason:
            return self.kill_reason
        code = self.process.poll()
        if code is None:
            return "closed its connection"
        if code < 0:
            try:
                signame = signal.Signals(-code).name
            except ValueError:
                signame = str(-code)
            return f"was killed by signal {-code} ({signame})"
        return f"exited with status {code}"

    def kill(self, reason: str = "") -> None:
        if reason and not self.kill_reason:
            self.kill_reason = reason
        if self.process.poll() is None:
            self.process.kill()

    # --- blocking mode ----------------------------------------------------------------------------------------

    def send_blocking(self, message: dict[str, Any], tensors: ipc.TensorWriter | None = None) -> None:
        data, fds = self.encode(message, tensors)
        try:
            ipc.send(self._sock, data, fds)
        except OSError:
            raise StubGone(self.exit_description()) from None
        finally:
            for fd in fds or ():
                os.close(fd)

    def receive_blocking(self, timeout: float | None) -> dict[str, Any]:
        self._sock.settimeout(timeout)
        data: bytes | memoryview
        try:
            data, _payload, fds = self._receiver.receive()
        except TimeoutError:
            raise
        except OSError:
            data, fds = b"", []
        if not data:
            self._wait(2.0)
            raise StubGone(self.exit_description())
        return self.decode(data, fds)

    def request_blocking(
        self,
        message: dict[str, Any],
        reply_kind: str,
        on_other: Callable[[dict[str, Any]], None],
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send ``message`` and read until the reply of ``reply_kind``; other messages (logs) go to ``on_other``.
        Raises StubGone, or TimeoutError when ``timeout`` seconds pass (the stub is then killed)."""
        self.send_blocking(message)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                reply = self.receive_blocking(left)
            except TimeoutError:
                self.kill(f"did not answer '{message['t']}' within {timeout:g} s and was killed")
                raise
            if reply["t"] == reply_kind:
                return reply
            on_other(reply)

    def _wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)

    # --- on the event loop ------------------------------------------------------------------------------------

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        on_message: Callable[[dict[str, Any], memoryview | None], None],
        on_gone: Callable[[], None],
        expecting: Callable[[], bool] | None = None,
    ) -> None:
        """From now on the loop reads the socket (call on the loop's thread). ``expecting``: whether the owner
        still waits for answers; once it does not, a turn of the loop stops reading after a message instead of
        trying the socket once more (a read that finds nothing costs a system call and an exception; whatever
        the stub sends later wakes the loop again)."""
        self._loop = loop
        self._on_message = on_message
        self._on_gone = on_gone
        self._expecting = expecting
        self._sock.setblocking(False)
        loop.add_reader(self._sock.fileno(), self._readable)

    def detach(self) -> None:
        """Back to blocking mode (call on the loop's thread)."""
        if self._loop is not None and not socket_closed(self._sock):
            self._loop.remove_reader(self._sock.fileno())
            self._loop.remove_writer(self._sock.fileno())
        self._loop = None
        self._sock.setblocking(True)
        # Whatever could not be sent yet goes now, in order.
        while self._queued:
            data, fds = self._queued.popleft()
            try:
                ipc.send(self._sock, data, fds)
            except OSError:
                break
            finally:
                for fd in fds or ():
                    os.close(fd)

    def send(self, message: dict[str, Any], tensors: ipc.TensorWriter | None = None) -> None:
        """Send without blocking (on the loop's thread); a stub that is gone is noticed by the reader."""
        if self._gone:
            return
        data, fds = self.encode(message, tensors)
        if self._queued:
            self._queued.append((data, fds))
            return
        try:
            ipc.send(self._sock, data, fds)
        except BlockingIOError:
            self._queued.append((data, fds))
            assert self._loop is not None
            self._loop.add_writer(self._sock.fileno(), self._writable)
            return
        except OSError:
            pass  # the reader sees the end
        for fd in fds or ():
            os.close(fd)

    def _writable(self) -> None:
        while self._queued:
            data, fds = self._queued[0]
            try:
                ipc.send(self._sock, data, fds)
            except BlockingIOError:
                return
            except OSError:
                pass
            self._queued.popleft()
            for fd in fds or ():
                os.close(fd)
        if self._loop is not None:
            self._loop.remove_writer(self._sock.fileno())

    def _readable(self) -> None:
        """Every message waiting, so that the answers of several batches are handled in one turn of the loop (and
        the requests they free go to the stub together). A message's payload is only valid until the next read:
        whatever is kept of it is copied by the handler."""
        assert self._on_message is not None
        data: bytes | memoryview
        payload: memoryview | None = None
        for _ in range(_READ_BURST):
            try:
                data, payload, fds = self._receiver.receive()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            except ValueError as exc:  # over the size limit
                self._broken(exc)
                return
            if not data:
                self._lost()
                return
            try:
                message = self.decode(data, fds)
                self._on_message(message, payload)
            except Exception as exc:
                self._broken(exc)
                return
            if self._gone or self._loop is None or (self._expecting is not None and not self._expecting()):
                return

    def _broken(self, exc: Exception) -> None:
        """A stub that breaks the protocol is not trusted any further."""
        log.error("stub of model instance '%s' sent a message the daemon cannot use: %r", self.name, exc)
        self.kill("broke the message protocol and was killed")
        self._lost()

    def _lost(self) -> None:
        if self._gone:
            return
        self._gone = True
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop.remove_writer(self._sock.fileno())
        if self._on_gone is not None:
            self._on_gone()

    @property
    def gone(self) -> bool:
        return self._gone

    # --- the end ----------------------------------------------------------------------------------------------

    def close(self, wait: float = 5.0) -> None:
        """Release everything; a process still running after ``wait`` seconds is killed."""
        self._gone = True
        with contextlib.suppress(OSError):
            self._sock.close()
        for _data, fds in self._queued:
            for fd in fds or ():
                os.close(fd)
        self._queued.clear()
        self._wait(wait)
        if self.process.poll() is None:
            self.process.kill()
            self._wait(5.0)
        self.producer.close()
        self.consumer.close()


def stub_environment(base: Mapping[str, str], interpreter: str, own: str) -> dict[str, str]:
    """The stub's environment: the daemon's, less what would point another interpreter at the wrong library."""
    env = dict(base)
    if interpreter != own:
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONPATH", None)
        bin_dir = os.path.dirname(interpreter)
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = env.get("PYTHONUNBUFFERED", "1")
    env.pop("PYTHONSTARTUP", None)
    return env


def socket_closed(sock: socket.socket) -> bool:
    return sock.fileno() < 0
