"""A real network link for the sync tests: a network namespace joined to the test's own by a veth pair, shaped
with ``tc`` (netem for loss and delay, a rate limit for a slow link) and taken down with ``ip link``.

The object store runs inside the namespace; the sync runs outside and reaches it only through the veth pair, so
every byte crosses the shaped link. Needs root and iproute2; ``unavailable`` says why not where it cannot run.
Every namespace and link is named uniquely per use and removed on the way out, whatever the test did.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

STARTUP_S: Final = 20.0


class LinkUnavailable(Exception):
    """This machine cannot build or shape the link (not root, no iproute2, no namespaces, no netem)."""


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr)


def unavailable() -> str | None:
    """Why namespaces joined by veth cannot be built here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 in 10.0.0.0/8 that no interface here uses (random, so that parallel runs do not collide)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for _attempt in range(100):
        subnet = ipaddress.IPv4Network((random.randrange(1 << 22) << 2 | 10 << 24, 30))
        if not any(str(host) in used for host in subnet):
            return subnet
    raise LinkUnavailable("no free /30 in 10.0.0.0/8")


@dataclass(frozen=True)
class Link:
    """The namespace ``namespace`` and the veth pair joining it: ``outside`` (here, ``outside_ip``) and ``inside``
    (in the namespace, ``inside_ip``)."""

    namespace: str
    outside: str
    inside: str
    outside_ip: str
    inside_ip: str

    def shape(self, *netem: str) -> None:
        """Apply a netem discipline (``"loss", "10%"``, ``"delay", "100ms"``) to both directions."""
        for command in (
            ["tc", "qdisc", "replace", "dev", self.outside, "root", "netem", *netem],
            ["tc", "-n", self.namespace, "qdisc", "replace", "dev", self.inside, "root", "netem", *netem],
        ):
            try:
                _run(command)
            except subprocess.CalledProcessError as exc:
                raise LinkUnavailable(f"tc netem {' '.join(netem)}: {exc.stderr.strip()}") from exc

    def limit_rate(self, rate: str) -> None:
        """A slow link towards this side (what a download crosses): netem's rate where the kernel has netem,
        otherwise a token bucket."""
        with contextlib.suppress(LinkUnavailable):
            self.shape_inside("rate", rate)
            return
        base = ["tc", "-n", self.namespace, "qdisc", "replace", "dev", self.inside, "root"]
        try:
            _run([*base, "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"])
        except subprocess.CalledProcessError as exc:
            raise LinkUnavailable(f"tc tbf rate {rate}: {exc.stderr.strip()}") from exc

    def shape_inside(self, *netem: str) -> None:
        command = ["tc", "-n", self.namespace, "qdisc", "replace", "dev", self.inside, "root", "netem", *netem]
        try:
            _run(command)
        except subprocess.CalledProcessError as exc:
            raise LinkUnavailable(f"tc netem {' '.join(netem)}: {exc.stderr.strip()}") from exc

    def down(self) -> None:
        _ip("link", "set", self.outside, "down")

    def up(self) -> None:
        _ip("link", "set", self.outside, "up")
        # The address's route comes back with the link; wait for the carrier so the next connection can succeed.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            state = Path(f"/sys/class/net/{self.outside}/operstate").read_text().strip()
            if state == "up":
                return
            time.sleep(0.05)

    def start(self, command: list[str]) -> subprocess.Popen[bytes]:
        """Run ``command`` inside the namespace."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )


@contextlib.contextmanager
def veth_link() -> Iterator[Link]:
    """A fresh namespace joined by a fresh veth pair; raises LinkUnavailable where the machine cannot build one.
    Removed on exit (deleting the namespace deletes its end of the pair, and the pair with it)."""
    reason = unavailable()
    if reason is not None:
        raise LinkUnavailable(reason)
    tag = f"{os.getpid() % 100000:05d}{random.randrange(1 << 16):04x}"
    subnet = _free_subnet()
    outside_ip, inside_ip = (str(host) for host in subnet.hosts())
    link = Link(f"edged-{tag}", f"eo{tag}", f"ei{tag}", outside_ip, inside_ip)
    try:
        _ip("netns", "add", link.namespace)
    except subprocess.CalledProcessError as exc:
        raise LinkUnavailable(f"ip netns add: {exc.stderr.strip()}") from exc
    try:
        try:
            _ip("link", "add", link.outside, "type", "veth", "peer", "name", link.inside)
        except subprocess.CalledProcessError as exc:
            raise LinkUnavailable(f"ip link add veth: {exc.stderr.strip()}") from exc
        _ip("link", "set", link.inside, "netns", link.namespace)
        _ip("addr", "add", f"{outside_ip}/30", "dev", link.outside)
        _ip("link", "set", link.outside, "up")
        _ip("-n", link.namespace, "addr", "add", f"{inside_ip}/30", "dev", link.inside)
        _ip("-n", link.namespace, "link", "set", link.inside, "up")
        _ip("-n", link.namespace, "link", "set", "lo", "up")
        yield link
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", link.outside)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", link.namespace)


def wait_listening(host: str, port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server in the namespace exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on {host}:{port} within {STARTUP_S} s")
