"""The client side: `oomguard.install`, `oomguard.Failures` and the lists it returns."""
