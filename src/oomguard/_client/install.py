"""Install oomguard on a running cluster, and remove it: `install(client)`,
`uninstall(client)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigError
from . import filters as _filters

if TYPE_CHECKING:
    from distributed import Client


def install(client: Client, **config: Any) -> dict[str, tuple[Any, Any]]:
    """Install oomguard on a running cluster: the scheduler plugin, which installs the
    nanny and worker plugins on every current and future worker.

    ``config`` takes the keys of ``oomguard.scheduler.*`` (dashes or underscores), e.g.
    ``oomguard.install(client, max_shard_infra_failures=2)``. A bad key or value raises
    ConfigError before anything is sent. Where oomguard already runs (a scheduler
    ``--preload``, or an earlier install), the settings apply to it and the ones that
    changed come back as ``{key: (old, new)}``; a setting fixed while it runs (the store,
    the pod lookup) is refused with ConfigError, and nothing changes.

    >>> client = Client(LocalCluster())                          # doctest: +SKIP
    >>> oomguard.install(client)                                 # doctest: +SKIP
    {}
    >>> oomguard.install(client, max_shard_infra_failures=2)     # doctest: +SKIP
    {'max-shard-infra-failures': (3, 2)}
    """
    from ..scheduler_plugin import OomguardSchedulerPlugin

    _filters.client(client)
    plugin = OomguardSchedulerPlugin(**config)  # validates the given settings
    changed = client.run_on_scheduler(_apply_settings, config=plugin.config)
    if changed is None:
        client.register_plugin(plugin)
        return {}
    if _REFUSED in changed:
        raise ConfigError(changed[_REFUSED])
    return {k: tuple(v) for k, v in changed.items()}


_REFUSED = "refused"  # never a setting's name


def _apply_settings(config: dict[str, Any], dask_scheduler=None):
    """On the scheduler: the running oomguard takes `config`; None where none runs. A
    refusal comes back as {"refused": message}: raised here, Dask would log "Run Failed"
    with a traceback in the scheduler's log for what is the caller's mistake."""
    plugin = dask_scheduler.plugins.get("oomguard")
    if plugin is None or getattr(plugin, "core", None) is None:
        return None
    try:
        return plugin.apply_settings(config)
    except ConfigError as e:
        return {_REFUSED: str(e)}


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
    from ..worker_plugin import OomguardNannyPlugin, OomguardWorkerPlugin

    for name, nanny in ((OomguardWorkerPlugin.name, False), (OomguardNannyPlugin.name, True)):
        try:
            client.unregister_worker_plugin(name, nanny=nanny)
        except ValueError:
            pass  # never registered there (e.g. loaded by preload only)
