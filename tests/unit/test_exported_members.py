import oomguard


def test_all_is_exactly_the_public_names():
    public = {name for name in dir(oomguard) if not name.startswith("_")}
    # Subpackages bound as attributes by an import are not part of the surface.
    public -= {"scheduler_plugin", "worker_plugin"}
    assert set(oomguard.__all__) - {"__version__"} == public
    assert oomguard.__all__ == sorted(oomguard.__all__)
