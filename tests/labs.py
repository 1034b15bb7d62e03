"""What the labs that tests start (PostgreSQL, SLURM, Prometheus) share: a free loopback
port, a server stopped by a signal then killed, and start/close as a context manager."""

from __future__ import annotations

import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
