"""Two network namespaces for the soak's workers, made and torn down by the soak itself.

Each namespace ``i`` gets two veth pairs with private /30 addresses that never leave the
machine: one towards the database (``10.23.(10+i).1`` in the root namespace,
``10.23.(10+i).2`` inside) and one towards the counting services (``10.23.(20+i).1/.2``).
PostgreSQL and the counting services listen on 127.0.0.1 only, so a forwarder of the
soak's own (:mod:`.forward`) binds each root-side address and forwards to loopback.
Separate links let the partition cut one namespace from the database while its workers
still reach the services (a partitioned holder can still send a late effect).

A partition sets the root side of the database link down: the namespace keeps its address
and route (the link has no carrier), so its packets are dropped, not refused: connections
hang as they would behind a broken switch. Healing sets it up again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field

__all__ = ["Namespace", "NetnsLayout", "netns_unavailable_reason", "teardown"]

PREFIX = "ratchet-soak"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    ip = shutil.which("ip") or "ip"
    return subprocess.run([ip, *args], capture_output=True, text=True, check=check, timeout=20)


def netns_unavailable_reason(
    *, euid: int | None = None, ip_path: str | bool | None = True
) -> str | None:
    """Why namespaces cannot be made here, or None when they can.

    Args:
        euid: effective user id (default: this process's).
        ip_path: path of ``ip`` (True: look it up on PATH; None/False: missing).

    Returns:
        A one-line reason (not root, no iproute2, ``ip netns add`` refused), or None.
    """
    uid = os.geteuid() if euid is None else euid
    if uid != 0:
        return f"not root (euid {uid}): ip netns and veth pairs need CAP_NET_ADMIN"
    path = shutil.which("ip") if ip_path is True else ip_path
    if not path:
        return "iproute2's ip(8) is not installed"
    if euid is not None or ip_path is not True:
        return None  # a what-if call: do not probe the kernel
    probe = f"{PREFIX}-probe-{os.getpid()}"
    done = subprocess.run([str(path), "netns", "add", probe], capture_output=True, text=True,
                          check=False, timeout=20)
    if done.returncode != 0:
        return f"ip netns add failed: {(done.stderr or done.stdout).strip()}"
    subprocess.run([str(path), "netns", "del", probe], capture_output=True, check=False,
                   timeout=20)
    return None


@dataclass
class Namespace:
    """One namespace: its name, the links, the addresses its workers connect to."""

    index: int
    name: str
    db_link: str
    """Root-side veth of the database link (set down for a partition)."""
    svc_link: str
    db_host: str
    """The forwarder's database address as seen from inside (root side of the link)."""
    svc_host: str
    partitioned: bool = False

    def command(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside this namespace (``ip netns exec`` execs it: same pid)."""
        return [shutil.which("ip") or "ip", "netns", "exec", self.name, *cmd]

    def partition(self) -> None:
        """Cut this namespace from the database (root side of the link down)."""
        _ip("link", "set", "dev", self.db_link, "down")
        self.partitioned = True

    def heal(self) -> None:
        """Undo :meth:`partition`."""
        _ip("link", "set", "dev", self.db_link, "up")
        self.partitioned = False


@dataclass
class NetnsLayout:
    """The namespaces of one soak run (``tag`` keeps concurrent runs apart)."""

    tag: str
    namespaces: list[Namespace] = field(default_factory=list)

    @classmethod
    def create(cls, tag: str, count: int = 2) -> NetnsLayout:
        """Make ``count`` namespaces with their links (torn down again on any error).

        Raises:
            subprocess.CalledProcessError: an ``ip`` command failed.
        """
        layout = cls(tag)
        try:
            for i in range(count):
                layout.namespaces.append(_make(tag, i))
        except BaseException:
            layout.teardown()
            raise
        return layout

    def teardown(self) -> None:
        """Kill what still runs inside, delete the namespaces (their veth pairs go too)."""
        for ns in self.namespaces:
            teardown(ns.name, [ns.db_link, ns.svc_link])
        self.namespaces.clear()


def _make(tag: str, i: int) -> Namespace:
    name = f"{PREFIX}-{tag}-{i}"
    _ip("netns", "add", name)
    ns = Namespace(i, name, f"rs{tag}d{i}", f"rs{tag}s{i}", f"10.23.{10 + i}.1",
                   f"10.23.{20 + i}.1")
    _ip("-n", name, "link", "set", "lo", "up")
    for root_if, net in ((ns.db_link, 10 + i), (ns.svc_link, 20 + i)):
        inner = root_if + "n"
        _ip("link", "add", root_if, "type", "veth", "peer", "name", inner, "netns", name)
        _ip("addr", "add", f"10.23.{net}.1/30", "dev", root_if)
        _ip("link", "set", "dev", root_if, "up")
        _ip("-n", name, "addr", "add", f"10.23.{net}.2/30", "dev", inner)
        _ip("-n", name, "link", "set", "dev", inner, "up")
    return ns


def teardown(name: str, links: list[str]) -> None:
    """SIGKILL every process left in namespace ``name``, delete it and the root-side links
    (idempotent; errors are ignored: this runs in ``finally``)."""
    done = _ip("netns", "pids", name, check=False)
    for pid in done.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), 9)
    _ip("netns", "del", name, check=False)
    for link in links:
        _ip("link", "del", link, check=False)
