import oomguard


def test_all_is_exactly_the_public_names():
    public = {name for name in dir(oomguard) if not name.startswith("_")}
    # Subpackages bound as attributes by an import are not part of the surface.
    public -= {"scheduler_plugin", "worker_plugin"}
    assert set(oomguard.__all__) - {"__version__"} == public
    assert oomguard.__all__ == sorted(oomguard.__all__)


def test_public_names_say_oomguard():
    # Tracebacks read `oomguard.PipelineAborted`, never a private module.
    for name in oomguard.__all__:
        if name != "__version__":
            assert getattr(oomguard, name).__module__ == "oomguard", name


def test_every_exception_lives_in_one_module_and_is_exported():
    import ast
    import pathlib

    src = pathlib.Path(oomguard.__file__).parent
    defined = {}
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception"))
                or getattr(b, "id", "") in {"KilledWorker", "TimeoutError", "OSError"}
                for b in node.bases
            ):
                defined[node.name] = path.relative_to(src).as_posix()
    assert defined, "found no exception classes"
    assert set(defined.values()) == {"_exceptions.py"}, defined
    assert {n for n in defined if not n.startswith("_")} <= set(oomguard.__all__)
