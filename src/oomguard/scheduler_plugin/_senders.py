"""Per-sender bounds for death reports, before one is decoded (O(1) each, event loop).

A sender is the host a report came from. Each gets a token bucket: `burst` reports at
once (every nanny of a host reporting one death together), then `rate` a second. A
report the scheduler is waiting for (its worker's removal is pending: `peek_worker`
names it) is taken before any limit, so a flood from the same host never crowds out a
real death's report.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgpack

#: Reports one host may send at once, then per second.
BURST = 256
RATE = 32.0
#: Senders remembered (least recently heard from forgotten first).
SENDERS_MAX = 4096
#: How much of a report is read to find its worker: the nanny writes it second.
PEEK_BYTES = 1024


class SenderLimit:
    """Token buckets by sender, bounded in number.

    >>> limit = SenderLimit(burst=2, rate=1.0)
    >>> [limit.take("tcp://10.0.0.5:4001", now=0.0) for _ in range(3)]
    [True, True, False]
    >>> limit.take("tcp://10.0.0.5:4999", now=1.0), limit.take("tcp://10.0.0.6:1", now=1.0)
    (True, True)
    """

    def __init__(
        self, burst: int = BURST, rate: float = RATE, max_senders: int = SENDERS_MAX
    ) -> None:
        self.burst = burst
        self.rate = rate
        self.max_senders = max_senders
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # host -> [tokens, t]
        self.limited: dict[str, int] = {}  # host -> reports refused over its rate

    def take(self, peer: Any, now: float) -> bool:
        host = sender(peer)
        bucket = self._buckets.pop(host, None)
        if bucket is None:
            bucket = [float(self.burst), now]
        else:
            tokens, since = bucket
            bucket = [min(float(self.burst), tokens + (now - since) * self.rate), now]
        self._buckets[host] = bucket
        if len(self._buckets) > self.max_senders:
            self._buckets.popitem(last=False)
        if bucket[0] >= 1.0:
            bucket[0] -= 1.0
            return True
        if host in self.limited or len(self.limited) < self.max_senders:
            self.limited[host] = self.limited.get(host, 0) + 1
        return False


def sender(peer: Any) -> str:
    """The host part of a peer address ("tcp://10.0.0.5:53122" -> "tcp://10.0.0.5").

    >>> sender("tcp://[::1]:53122"), sender(None)
    ('tcp://[::1]', '')
    """
    if not isinstance(peer, str):
        return ""
    host, _, port = peer.rpartition(":")
    return host if host and port.isdigit() and not host.endswith(":/") else peer


def peek_worker(data: bytes) -> str | None:
    """The `worker` a report names, read from its first `PEEK_BYTES` only (None when not
    found there, or not a report at all); the full check comes later, off the loop.

    >>> peek_worker(msgpack.packb({"schema": 1, "worker": "tcp://a:1", "x": "y" * 5000}))
    'tcp://a:1'
    >>> peek_worker(b"not msgpack") is None
    True
    """
    try:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=PEEK_BYTES)
        unpacker.feed(data[:PEEK_BYTES])
        for _ in range(min(unpacker.read_map_header(), 4)):
            key = unpacker.unpack()
            if key == "worker":
                value = unpacker.unpack()
                return value if isinstance(value, str) else None
            unpacker.skip()
    except Exception:
        return None
    return None
