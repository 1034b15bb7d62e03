"""Asking a cluster manager about a worker: the Kubernetes pod of a worker lost with its
nanny (`kubernetes`, the scheduler's pod lookup) and a SLURM job (`slurm_job`: the
scheduler about a lost worker, the nanny about its worker's job)."""
