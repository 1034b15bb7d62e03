"""A worker's death, shared by the nanny and the scheduler (pure: no Dask, no I/O): its
records (`record`), its wire form (`wire`), the rules that name its cause (`cause`) and its
killer (`killer`), the evidence they rest on (`facts`), and the nanny's assembly of one
report from what it read (`build`)."""
