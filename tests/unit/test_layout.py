"""The layout docs/architecture.md describes: small modules, families in packages, imports
that only go down the layers, and no import cycle."""

from __future__ import annotations

import ast
import pathlib

import oomguard

SRC = pathlib.Path(oomguard.__file__).parent

#: Each layer may import only from the layers after it (and from itself). The top-level
#: modules (`_exceptions`, `_protocol`, `_models`, ...) are the vocabulary every layer uses.
LAYERS = [
    {"_cli"},
    {"_client", "scheduler_plugin", "worker_plugin"},
    {"_decide", "_store", "_admission", "_host", "_lookups"},
    {"_death"},
    {"_signature"},
]


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(["oomguard", *parts])] = path
    return out


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The oomguard modules `name` imports: at its top, inside its functions and under
    TYPE_CHECKING alike (a type named from another module is a tie to it all the same)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("oomguard"):
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("oomguard"))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {m for m in _imports(name, path) if m in modules and m != name}
        for name, path in modules.items()
    }


def test_no_module_over_500_lines():
    sizes = {
        p.relative_to(SRC).as_posix(): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")
    }
    assert {p: n for p, n in sizes.items() if n > 500} == {}


def test_at_most_16_modules_loose_at_the_top():
    loose = sorted(p.name for p in SRC.glob("*.py"))
    assert len(loose) <= 16, loose


def test_no_import_cycle():
    graph = _graph()
    done: set[str] = set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            raise AssertionError(
                "import cycle: " + " -> ".join(stack[stack.index(node) :] + [node])
            )
        if node in done:
            return
        for nxt in sorted(graph[node]):
            # A package's own __init__ importing its submodules is how packages work.
            if not nxt.startswith(node + "."):
                visit(nxt, [*stack, node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])


def test_imports_only_go_down_the_layers():
    def layer(name: str) -> int | None:
        family = name.split(".")[1] if "." in name else ""
        for i, members in enumerate(LAYERS):
            if family in members:
                return i
        return None  # the top-level vocabulary: below every layer

    wrong = []
    for name, targets in _graph().items():
        if name == "oomguard":
            continue  # the public surface re-exports from every layer
        here = layer(name)
        for target in targets:
            there = layer(target)
            if here is None and there is not None:
                wrong.append(f"{name} -> {target}")
            elif here is not None and there is not None and there < here:
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_every_package_is_listed_for_the_wheel():
    # pyproject lists its packages (the chart is mapped in from charts/); one left out is
    # missing from the wheel, which only tests/release would otherwise notice.
    import tomllib

    pyproject = SRC.parents[1] / "pyproject.toml"
    listed = set(tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(["oomguard", *p.parent.relative_to(SRC).parts]) for p in SRC.rglob("__init__.py")
    }
    assert found - listed == set(), "add these to pyproject.toml's packages"


def test_every_test_module_has_a_basename_of_its_own():
    """pytest imports test modules by basename (no packages under tests/): a second module
    of one name stops the whole run at collection."""
    tests = pathlib.Path(__file__).parents[1]
    seen: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
