"""The layers of docs/architecture.md stay apart. Every import statement counts, also one inside a function."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module_files(package: str) -> dict[str, str]:
    """Dotted module name -> file, for `package` (``lazytrain.data``) and everything under it."""
    modules = {}
    for folder, _, names in os.walk(os.path.join(REPO, *package.split("."))):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, REPO)[: -len(".py")].split(os.sep)
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_names(module: str, path: str) -> set[str]:
    """What `module` imports: ``from a import b`` gives ``a.b`` (when b is a module) and ``a``."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _imports_within(package: str) -> dict[str, set[str]]:
    """Import graph of the modules of `package`, edges only to its own modules. A module's implicit import
    of its parent package is no edge: a package's ``__init__`` may import its modules to wire them together."""
    files = _module_files(package)
    return {module: _imported_names(module, path) & set(files) - {module} for module, path in files.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_data_package_has_no_import_cycle():
    cycle = _find_cycle(_imports_within("lazytrain.data"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("lazytrain.config", "lazytrain.data"),
        ("lazytrain.modeling", "lazytrain.engine"),
        ("lazytrain.utils", "lazytrain.data"),
        ("lazytrain.utils", "lazytrain.engine"),
        ("lazytrain.utils", "lazytrain.modeling"),
    ],
)
def test_lower_layer_does_not_import_higher_one(lower, higher):
    offending = {}
    for module, path in _module_files(lower).items():
        names = [name for name in _imported_names(module, path) if name.split(".")[:2] == higher.split(".")]
        if names:
            offending[module] = sorted(names)
    assert offending == {}
