"""The labs' ports (tests/labs.py): a server started on a port another process took first is
started again on another, and a port is read back from the kernel, never assumed."""

from __future__ import annotations

import os
import socket

import pytest

from labs import PortTaken, listening_ports, on_free_ports


def test_a_clash_starts_the_server_again_on_other_ports():
    tried: list[tuple[int, int]] = []

    def start(a: int, b: int) -> tuple[int, int]:
        tried.append((a, b))
        if len(tried) < 3:
            raise PortTaken("taken")
        return a, b

    got = on_free_ports(start, count=2)
    assert len(tried) == 3 and got == tried[-1]
    assert all(a != b for a, b in tried)  # two different ports each time


def test_it_gives_up_after_the_attempts():
    calls = []

    def start(port: int) -> None:
        calls.append(port)
        raise PortTaken("taken")

    with pytest.raises(PortTaken):
        on_free_ports(start, attempts=3)
    assert len(calls) == 3


def test_listening_ports_are_the_kernels_answer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert port not in listening_ports(os.getpid())  # bound, not listening
        s.listen()
        assert port in listening_ports(os.getpid())
