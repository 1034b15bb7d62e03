"""Worker side of oomguard (issue 3): `dask worker --preload-nanny oomguard.worker_plugin`."""
