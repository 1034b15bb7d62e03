"""A long-lived process named `chaos-monkey` that sends signals where the test says.

Renamed with prctl(PR_SET_NAME) (what /proc/PID/comm shows; no setproctitle), and started
with the argument `--chaos` so its command line can be recognised. Used by the native
recorder's tests (tests/unit/test_sigrec.py) and the cluster tests of signal senders.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap

_MONKEY = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(15, b"chaos-monkey", 0, 0, 0)  # PR_SET_NAME: /proc/PID/comm
print("ready", flush=True)
for line in sys.stdin:  # one "PID SIGNO" per line
    pid, signo = map(int, line.split())
    os.kill(pid, signo)
    print("sent", flush=True)
"""
#: The monkey's argv after the interpreter: its command line ends with "--chaos".
ARGS = ("-c", textwrap.dedent(_MONKEY), "--chaos")


@contextlib.contextmanager
def chaos_monkey():
    """Yields `send(pid, signo=15)`: the monkey signals `pid` and waits until it has;
    `send.pid` is the monkey's pid, `send.argv` its argv."""
    proc = subprocess.Popen(
        [sys.executable, *ARGS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"

        def send(pid: int, signo: int = 15) -> None:
            proc.stdin.write(f"{pid} {int(signo)}\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "sent"

        send.pid = proc.pid
        send.argv = [sys.executable, *ARGS]
        yield send
    finally:
        proc.kill()
        proc.wait()
