"""The client-side API: `install(client)` and `Failures(client)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._models import FailureEvent, PipelineStatus, SignatureRow

if TYPE_CHECKING:
    from distributed import Client


def install(client: Client, **config: Any) -> None:
    """Install oomguard on a running cluster: the scheduler plugin, which installs the
    nanny and worker plugins on every current and future worker.

    ``config`` takes the keys of ``oomguard.scheduler.*`` (dashes or underscores), e.g.
    ``oomguard.install(client, max_shard_infra_failures=2)``.

    >>> client = Client(LocalCluster())            # doctest: +SKIP
    >>> oomguard.install(client)                   # doctest: +SKIP
    """
    from .scheduler_plugin import OomguardSchedulerPlugin

    client.register_plugin(OomguardSchedulerPlugin(**config))


def uninstall(client: Client) -> None:
    """Remove oomguard from a running cluster: its scheduler plugin is closed (Dask's own
    `allowed-failures` and handlers come back), and the nanny and worker plugins are
    torn down on every worker. The failure store file is kept.

    >>> oomguard.uninstall(client)                 # doctest: +SKIP
    """

    async def remove(dask_scheduler):
        plugin = dask_scheduler.plugins.pop("oomguard", None)
        if plugin is not None:
            await plugin.close()

    client.run_on_scheduler(remove)
    from .worker_plugin import OomguardNannyPlugin, OomguardWorkerPlugin

    for name, nanny in ((OomguardWorkerPlugin.name, False), (OomguardNannyPlugin.name, True)):
        try:
            client.unregister_worker_plugin(name, nanny=nanny)
        except ValueError:
            pass  # never registered there (e.g. loaded by preload only)


class Failures:
    """Query the failure history a scheduler keeps.

    >>> failures = oomguard.Failures(client)                  # doctest: +SKIP
    >>> failures.events(cause="oom_kill", limit=10)           # doctest: +SKIP
    >>> failures.pipeline("etl").summary                      # doctest: +SKIP
    'a worker was OOM-killed by the kernel at shard ...'
    """

    def __init__(self, client: Client, *, timeout: float | None = 60.0):
        # A scheduler without oomguard never answers the query: bound every call.
        self.client = client
        self.timeout = timeout

    def _query(self, what: str, **filters: Any) -> Any:
        filters = {k: v for k, v in filters.items() if v is not None}
        return self.client.sync(
            self.client.scheduler.oomguard_query,
            what=what,
            callback_timeout=self.timeout,
            **filters,
        )

    def events(
        self,
        *,
        kind: str | None = None,
        cause: str | None = None,
        pipeline: str | None = None,
        shard: str | None = None,
        signature: str | None = None,
        since: float | None = None,
        limit: int | None = 1000,
    ) -> list[FailureEvent]:
        rows = self._query(
            "events", kind=kind, cause=cause, pipeline=pipeline, shard=shard,
            signature=signature, since=since, limit=limit,
        )
        return [FailureEvent.from_dict(r) for r in rows]

    def signatures(
        self,
        *,
        cause: str | None = None,
        pipeline: str | None = None,
        since: float | None = None,
        limit: int | None = 100,
    ) -> list[SignatureRow]:
        rows = self._query("signatures", cause=cause, pipeline=pipeline, since=since, limit=limit)
        return [SignatureRow.from_dict(r) for r in rows]

    def shard(self, key: Any) -> list[FailureEvent]:
        """The failure history of one shard (task key, or its str)."""
        return [FailureEvent.from_dict(r) for r in self._query("shard", key=str(key))]

    def pipeline(self, name: str) -> PipelineStatus | None:
        row = self._query("pipeline", name=name)
        return PipelineStatus.from_dict(row) if row else None

    def pipelines(self, limit: int | None = 100) -> list[PipelineStatus]:
        return [PipelineStatus.from_dict(r) for r in self._query("pipelines", limit=limit)]
