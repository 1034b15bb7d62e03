"""Events only a worker may send: its hostname and SLURM job (`HOST_TOPIC`), and its
tasks' waits for host memory (`ADMISSION_TOPIC`).

Dask hands a plugin's `log_event` hook every event, a client's too (`Client.log_event`),
and a client may put any `worker` in its message: through the hook, a client could name
another worker's SLURM job (whose stderr the scheduler then reads) or its host. A worker's
own events come over its batched stream to the scheduler's "log-event" stream handler,
which Dask calls with the worker that stream belongs to (`handle_stream`'s `extra`), never
a name the message gives. So these topics are taken there, where the sender is known, as
`_trust.py` takes a death report only from the worker's nanny; the same topics reaching the
hook are ignored. A client's stream calls the handler with its `client` beside: not a worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._protocol import ADMISSION_TOPIC, HOST_TOPIC

#: The topics taken from workers' streams only.
TOPICS = frozenset({HOST_TOPIC, ADMISSION_TOPIC})
#: Dask's stream handler for a worker's `log_event` (`Scheduler.log_worker_event`).
HANDLER = "log-event"


class WorkerEvents:
    """Wraps the scheduler's "log-event" stream handler: `on_event(worker, topic, msg)` for
    each message of `TOPICS` a worker's stream carries, then Dask's handler as before."""

    def __init__(self, on_event: Callable[[str, str, dict], None]) -> None:
        self.on_event = on_event
        self._original: Callable[..., Any] | None = None

    def install(self, scheduler: Any) -> bool:
        """False where this Dask has no such handler (`_compat` said so at start)."""
        original = scheduler.stream_handlers.get(HANDLER)
        if original is None:
            return False
        if original == self.handle:
            return True  # installed already: wrapping itself would recurse
        self._original = original
        scheduler.stream_handlers[HANDLER] = self.handle
        return True

    def uninstall(self, scheduler: Any) -> None:
        if self._original is not None and scheduler.stream_handlers.get(HANDLER) == self.handle:
            scheduler.stream_handlers[HANDLER] = self._original
        self._original = None

    def handle(self, worker: Any = None, topic: Any = None, msg: Any = None, **extra: Any):
        # `extra` holds `client` on a client's stream: then `worker` is the message's word.
        if not extra and type(topic) is str and topic in TOPICS and isinstance(msg, dict):
            if isinstance(worker, str):
                self.on_event(worker, topic, msg)
        return self._original(worker=worker, topic=topic, msg=msg, **extra)
