"""What the labs that tests start (PostgreSQL, SLURM, Prometheus) share: a port no other
process can take from them, a server stopped by a signal then killed, and start/close as a
context manager.

Ports. A port picked free and closed again can be taken by any process on the machine
before the server binds it (other tests, other clusters beside this suite): the server then
fails to start, or worse, the test talks to that other process. So a server either binds
port 0 and the test reads back the port it got (`listening_ports`: the kernel's answer for
that process), or it is started on a candidate port and started again on another when it
reports the clash (`on_free_ports`), and the test checks it reached its own server.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it after it was picked."""


def on_free_ports(start: Callable[..., T], count: int = 1, attempts: int = 5) -> T:
    """`start(port, ...)` on `count` ports free on 127.0.0.1 now; when it raises PortTaken
    (another process took one before the server bound it), again on others, up to
    `attempts` times."""
    for attempt in range(1, attempts + 1):
        try:
            return start(*_candidates(count))
        except PortTaken:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def _candidates(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:  # held together: `count` different ports
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on, as the kernel has them (psutil)."""
    import psutil

    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def stop_process(
    proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 30
) -> None:
    """`sig` to a server still running, then SIGKILL if it has not exited in `timeout`."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Lab:
    """`with Lab():` starts it and closes it after; a start that fails closes what it
    started. Subclasses define `start` and `close`."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
