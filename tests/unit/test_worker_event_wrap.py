"""`WorkerEvents` wraps Dask's "log-event" stream handler once, however often installed."""

from __future__ import annotations

from types import SimpleNamespace

from oomguard._protocol import HOST_TOPIC
from oomguard.scheduler_plugin._worker_events import HANDLER, WorkerEvents


def test_installed_twice_it_wraps_once_and_gives_dask_its_handler_back():
    seen, dask = [], []
    scheduler = SimpleNamespace(stream_handlers={HANDLER: lambda **kw: dask.append(kw)})
    original = scheduler.stream_handlers[HANDLER]
    events = WorkerEvents(lambda *a: seen.append(a))
    assert events.install(scheduler) and events.install(scheduler)  # start() ran again
    scheduler.stream_handlers[HANDLER](worker="tcp://w:1", topic=HOST_TOPIC, msg={"host": "h"})
    assert seen == [("tcp://w:1", HOST_TOPIC, {"host": "h"})] and len(dask) == 1
    # A client's stream: its `client` beside, the message's `worker` is only its word.
    scheduler.stream_handlers[HANDLER](worker="tcp://w:1", topic=HOST_TOPIC, msg={}, client="c")
    assert len(seen) == 1 and len(dask) == 2
    events.uninstall(scheduler)
    assert scheduler.stream_handlers[HANDLER] is original
