"""systemd sd_notify without libsystemd: one datagram to ``$NOTIFY_SOCKET``.

``@name`` addresses are abstract-namespace sockets. Every call is a no-op outside
systemd (no ``NOTIFY_SOCKET``) and never raises: notification is advisory.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(state: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Send e.g. ``READY=1``; True when a datagram went out."""
    address = environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when the
    watchdog is off or meant for another process (WATCHDOG_PID)."""
    usec = environ.get("WATCHDOG_USEC")
    pid = environ.get("WATCHDOG_PID")
    if not usec:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None


class Notifier:
    """READY/WATCHDOG/STOPPING for the agent's main loop."""

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        self.environ = dict(environ)
        self.watchdog_s = watchdog_interval(self.environ)
        self._next_ping = 0.0

    def ready(self) -> bool:
        return notify("READY=1", self.environ)

    def stopping(self) -> bool:
        return notify("STOPPING=1", self.environ)

    def status(self, text: str) -> bool:
        return notify(f"STATUS={text}", self.environ)

    def next_ping_in(self, now: float) -> float | None:
        if self.watchdog_s is None:
            return None
        return max(0.0, self._next_ping - now)

    def ping_if_due(self, now: float) -> bool:
        if self.watchdog_s is None or now < self._next_ping:
            return False
        self._next_ping = now + self.watchdog_s
        return notify("WATCHDOG=1", self.environ)
