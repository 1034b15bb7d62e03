"""What the scheduler plugin sets up around Dask once, at start: the worker side on every
nanny and worker, the process's /metrics, the Kubernetes pod lookup, the signature gauges.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import pickle
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed.core import Status

from .._exceptions import StoreError
from ._resolve import regressions

if TYPE_CHECKING:
    from distributed import Scheduler

    from .._guard import Guard
    from .._metrics import OomguardMetrics
    from .._store import FailureStore

logger = logging.getLogger("oomguard.scheduler")

SHUTTING_DOWN = (Status.closing, Status.closed, Status.closing_gracefully)
_metrics_holder: Any = None  # the plugin whose collector this process's /metrics serves


def register_metrics(plugin: Any) -> None:
    """Serve `plugin.metrics` on this process's /metrics, unless a live oomguard does."""
    global _metrics_holder
    holder = _metrics_holder
    if (
        holder is not None
        and holder is not plugin
        and (holder.scheduler is None or holder.scheduler.status in SHUTTING_DOWN)
    ):
        # A plugin whose scheduler went away without closing it (its start() was cut
        # short) must not keep the process's /metrics.
        holder.metrics.unregister()
    if plugin.metrics.register():
        _metrics_holder = plugin
    else:
        logger.warning("oomguard: another oomguard in this process holds the metrics")


def on_stop(scheduler: Scheduler, callback: Callable[[], None]) -> Callable[[], None]:
    """Run `callback` when `scheduler.stop()` runs, before Dask's own stop; returns the undo.

    `Server.stop()` is synchronous and calls no plugin hook: `Scheduler.close()` calls it
    last, after every plugin's close(), but some of Dask's own tests call it alone, and a
    plugin's threads then outlive the scheduler. The method is shadowed on the instance
    (as the nanny plugin does `_on_worker_exit_sync`); Dask's runs whatever the callback
    does (which should not raise: guard it).
    """
    original = scheduler.stop

    def stop(*args: Any, **kwargs: Any) -> Any:
        try:
            callback()
        finally:
            return_value = original(*args, **kwargs)
        return return_value

    scheduler.stop = stop  # type: ignore[method-assign]

    def undo() -> None:
        if scheduler.__dict__.get("stop") is stop:
            del scheduler.stop

    return undo


async def install_worker_side(scheduler: Scheduler) -> None:
    from ..worker_plugin import OomguardNannyPlugin, OomguardWorkerPlugin

    await _broadcast(scheduler.register_nanny_plugin, OomguardNannyPlugin())
    # Workers already running get the worker plugin now, and Dask gives it to every worker
    # that registers later (replacing its nanny's). Its crash dir must be the nanny's, not
    # this scheduler's: sent without one, each worker reads its own config.
    await _broadcast(scheduler.register_worker_plugin, OomguardWorkerPlugin())


async def _broadcast(register, plugin) -> None:
    # Dask keeps the plugin for nannies and workers that (re)start later, then sends it to
    # those running now; one dying meanwhile (a cluster that oomguard is installed on to
    # stop its crashes) must not fail the install.
    for attempt in (1, 2):
        try:
            await register(
                comm=None, plugin=pickle.dumps(plugin), name=plugin.name, idempotent=True
            )
            return
        except OSError as e:  # CommClosedError, connection resets
            if attempt == 2:
                logger.warning(
                    "oomguard: %s reached only some of the running processes "
                    "(%s); processes starting later get it",
                    plugin.name,
                    e,
                )
            await asyncio.sleep(0.5)


def pod_lookup(settings: dict[str, Any], guard: Guard):
    """oomguard._lookups.kubernetes.PodLookup where `kubernetes.enabled`, else None."""
    if not settings["kubernetes.enabled"]:
        return None
    try:
        from .._lookups.kubernetes import PodLookup

        return PodLookup.in_cluster(
            settings["kubernetes.namespace"],
            label_selector=settings["kubernetes.label-selector"],
            container=settings["kubernetes.container"],
        )
    except ImportError as e:
        logger.warning("oomguard: %s", e)
    except Exception:
        guard.error("pod_lookup")
    return None


async def open_store(
    settings: dict[str, Any], metrics: OomguardMetrics, cluster: str
) -> FailureStore:
    """The started failure store: `settings["store"]`, or this cluster's default history
    (`default_path`). One that cannot be opened gives way to a fresh one (see
    `oomguard._store.recover`), with one WARNING and a count in oomguard_store_errors_total,
    unless `store-errors` is "fail": then its error stops the start, as it always did."""
    from .._store.recover import open_store
    from .._urls import is_postgres

    url = settings["store"] if is_postgres(settings["store"]) else None
    path = settings["spool"] if url else settings["store"]
    if not path:
        path = await asyncio.to_thread(default_path, cluster, spool=url is not None)
    store, problem = await asyncio.to_thread(
        open_store,
        path,
        on_error=settings["store-errors"],
        max_events=settings["max-events"],
        max_signatures=settings["max-signatures"],
        queue_bytes=settings["store-queue-limit"],
    )
    if problem is not None:
        logger.warning("%s", problem.message())
        metrics.store_error(problem.kind)
    if url is not None:
        attach_history(store, url, cluster, settings, metrics)
    return store


def default_path(cluster: str, spool: bool) -> str:
    """This cluster's default history file (with a PostgreSQL store: its spool), one per
    cluster name in this user's state directory, so a scheduler restarted with the same
    name continues it (`oomguard._store.home`); elsewhere, with one WARNING, where that
    directory cannot be written."""
    from .._store import home

    directory, why_not = home.writable_dir()
    if why_not is not None:
        logger.warning(
            "oomguard: the failure history cannot be kept in %s, so it is kept in %s, "
            "which a reboot or a cleaned temporary directory removes; set "
            "oomguard.scheduler.store (a file on a volume that lasts, or a postgresql:// "
            "history), or XDG_STATE_HOME, to keep it",
            why_not,
            directory,
        )
    return (home.spool_path if spool else home.history_path)(directory, cluster)


def attach_history(
    store: FailureStore, url: str, cluster: str, settings: dict[str, Any], metrics: OomguardMetrics
) -> None:
    """Make `store` the spool of the PostgreSQL history at `url`. Without the driver: one
    WARNING naming the extra (or the error, with store-errors: fail) and the spool alone."""
    from .._urls import driver_missing, redact

    missing = driver_missing()
    if missing is not None:
        if settings["store-errors"] == "fail":
            raise StoreError(f"oomguard.scheduler.store {redact(url)}: {missing}")
        logger.warning(
            "oomguard: oomguard.scheduler.store %s: %s; events are kept in %s only",
            redact(url),
            missing,
            store.path,
        )
        metrics.store_error("history_unusable")
        return
    from .._store.pg.history import History

    history = History(
        store,
        url,
        cluster,
        max_events=settings["max-events"],
        max_signatures=settings["max-signatures"],
        max_age=settings["max-age"],
    )
    history.start()
    store.history = history
    metrics.set_history(False, 0)
    logger.info(
        "oomguard: cluster %r records into the history %s, spooled in %s",
        cluster,
        history.path,
        store.path,
    )


def core(settings: dict[str, Any]) -> dict[str, Any]:
    """The decision core's settings that `install(client, ...)` may change while running."""
    return {
        "max_shard_infra_failures": settings["max-shard-infra-failures"],
        "abort_on_repeat_signature": settings["abort-on-repeat-signature"],
        "larger_only": settings["memory-retry-larger-only"],
        "run_alone_timeout": settings["run-alone-timeout"],
    }


def configure_store(store: FailureStore, settings: dict[str, Any]) -> None:
    """Take the store's live settings (`install(client, max_events=...)` while running)."""
    store.max_events = settings["max-events"]
    store.max_signatures = settings["max-signatures"]


class _StoreCounts:
    """The store's own counters (bumped on its writer thread and in add()) carried into
    oomguard_store_errors_total by the gauge loop, as increments since the last look."""

    def __init__(self) -> None:
        self.seen = {"queue_full": 0, "disk_full": 0, "write_failed": 0, "history_away": 0}
        self.aside: dict[str, int] = {}
        self.regressions = 0  # signatures found regressed (`_resolve.regressions`)

    def sync(self, store: FailureStore, metrics: OomguardMetrics) -> None:
        now = {
            "queue_full": store.overflow,
            "disk_full": store.disk_full,
            "write_failed": store.write_errors,
        }
        if store.history is not None:
            now["history_away"] = store.history.shipper.outages
        for kind, n in now.items():
            if n > self.seen[kind]:
                metrics.store_error(kind, n - self.seen[kind])
                self.seen[kind] = n
        if (n := regressions(store)) > self.regressions:
            metrics.signature_regressed(n - self.regressions)
            self.regressions = n
        if store.history is not None:  # rows the history refused, set aside (pg/aside.py)
            for kind, n in store.history.shipper.aside.counts.items():
                if n > self.aside.get(kind, 0):
                    metrics.set_aside(kind, n - self.aside.get(kind, 0))
                    self.aside[kind] = n


async def gauge_loop(
    store: FailureStore, metrics: OomguardMetrics, guard: Guard, interval: float
) -> None:
    """Keep the signature gauges current, recounting only after new writes (two
    aggregates in SQL, off the event loop: `FailureStore.totals`)."""
    seen = None
    counts = _StoreCounts()
    while True:
        with guard("store"):
            counts.sync(store, metrics)
            if store.history is not None:
                shipper = store.history.shipper
                metrics.set_history(bool(shipper.up), shipper.backlog)
            if store.written != seen:
                seen = store.written
                n, hosts = await asyncio.to_thread(store.totals)
                metrics.set_signatures(n)
                metrics.set_signature_max_hosts(hosts)
        await asyncio.sleep(interval)


@functools.cache
def own_hostname() -> str:
    """This machine's name, as a worker plugin on it sends it (`socket.gethostname`)."""
    return socket.gethostname()


def is_loopback(host: str) -> bool:
    """Whether an address's host is a loopback IP: a worker there runs on this machine.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("10.0.0.2"), is_loopback("h")
    (True, True, False, False)
    """
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address_host(address: str) -> str:
    """The host part of a worker's address ("10.0.0.5"); "" when it has none."""
    from distributed.comm import get_address_host

    try:
        return get_address_host(address)
    except Exception:
        return ""


def prefix_path(scheduler: Scheduler, keys, steps: int = 64):
    """Task prefixes from the first output key down its first dependencies to a root."""
    ts = scheduler.tasks.get(next(iter(keys), None))
    for _ in range(steps):
        if ts is None:
            return
        yield ts.prefix.name
        ts = next(iter(ts.dependencies), None)


def same_file(a: str, b: str) -> bool:
    """Whether two store settings name the same history (a path, however spelt)."""
    from .._urls import is_postgres

    if is_postgres(a) or is_postgres(b):
        return a == b
    return os.path.abspath(os.path.expanduser(a)) == os.path.abspath(os.path.expanduser(b))


def settings_change(
    settings: dict[str, Any], config: dict[str, Any], store: FailureStore | None
) -> dict[str, tuple[Any, Any]]:
    """{key: (old, new)} of the `config` (oomguard.scheduler.* keys, with dashes) that
    differ from the running `settings`. ConfigError for a bad value, or for a change of a
    setting fixed while running (the store, the pod lookup): nothing changes then."""
    from .. import _config
    from .._exceptions import ConfigError
    from .._urls import redact

    new = _config.scheduler_settings(config, only=frozenset(config))
    current = dict(settings)
    if "store" in new and store is not None:
        # The file in use, not the setting (None: the default path), so a refusal
        # names it and the same file, however spelt, is no change.
        current["store"] = getattr(store.history, "url", store.path)
        if new["store"] is not None and same_file(new["store"], current["store"]):
            new["store"] = current["store"]
    changed = {k: (current[k], v) for k, v in new.items() if current[k] != v}
    fixed = sorted(set(changed) - _config.LIVE_SCHEDULER_KEYS)
    if fixed:
        old, value = (redact(v) if isinstance(v, str) else v for v in changed[fixed[0]])
        raise ConfigError(
            f"oomguard.scheduler.{fixed[0]} is {old!r} on this running scheduler and "
            f"cannot change to {value!r} while oomguard runs; use "
            "oomguard.uninstall(client) first, or set it where the scheduler starts."
        )
    return changed


def dashboard(scheduler: Scheduler, guard: Guard) -> str:
    """The path of oomguard's page on the scheduler's dashboard, "" without one."""
    try:
        from ._dashboard import register_dashboard

        return register_dashboard(scheduler)
    except ImportError:
        logger.info("oomguard: no dashboard page (bokeh is not installed)")
    except Exception:
        guard.error("dashboard")
    return ""
