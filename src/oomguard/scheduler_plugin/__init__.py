"""Scheduler side of oomguard (issue 4): `dask scheduler --preload oomguard.scheduler_plugin`."""
