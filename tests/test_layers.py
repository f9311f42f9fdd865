"""The layers of docs/architecture.md, enforced: a module imports only its own package and the packages of
lower layers (imports inside functions count too), and no modules import each other in a circle."""

import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "lazytrain")

# Lowest first. Packages of one layer do not import each other.
LAYERS = [
    ("errors",),
    ("utils",),
    ("config",),
    ("data", "modeling", "launch"),
    ("evaluation", "engine"),
    ("program",),
    ("__main__",),
]


def module_files() -> dict[str, str]:
    """Dotted module name -> file, for every module of the package."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, REPO)[: -len(".py")].replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__")] = path
    return modules


def imported_modules(path: str, modules: dict[str, str]) -> set[str]:
    """The lazytrain modules `path` imports, at module level or inside functions (``from pkg import name``
    counts as importing ``pkg.name`` when that is a module, else ``pkg``)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("lazytrain")}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("lazytrain")
        ):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(package: str) -> int:
    if package == "":  # lazytrain/__init__.py, the package's face (lazytrain.Predictor): above every layer
        return len(LAYERS)
    return next(index for index, names in enumerate(LAYERS) if package in names)


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {module: imported_modules(path, modules) for module, path in modules.items()}


def test_every_package_has_a_layer():
    packages = {package_of(module) for module in module_files()} - {""}
    assert packages == {name for layer in LAYERS for name in layer}


def test_modules_import_only_their_own_package_and_lower_layers():
    upward = []
    for module, imports in sorted(import_graph().items()):
        for target in sorted(imports):
            source_package, target_package = package_of(module), package_of(target)
            if target_package == source_package:
                continue
            if layer_of(target_package) >= layer_of(source_package):
                upward.append(f"{module} imports {target}")
    assert upward == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (modules, the first repeated at the end), or None."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def test_no_modules_import_each_other_in_a_circle():
    assert find_cycle(import_graph()) is None


def test_find_cycle_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_an_upward_import_is_reported(tmp_path):
    module = tmp_path / "example.py"
    module.write_text("def f():\n    from lazytrain.program.default import run\n")
    modules = module_files()
    assert imported_modules(str(module), modules) == {"lazytrain.program.default"}
    assert layer_of(package_of("lazytrain.program.default")) > layer_of("engine")


def test_the_architecture_page_lists_the_same_layers():
    text = open(os.path.join(REPO, "docs", "architecture.md")).read()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [row for row in section.splitlines() if re.match(r"\|\s*\d+\s*\|", row)]
    documented = {int(row.split("|")[1]): sorted(re.findall(r"`(\w+)/?`", row.split("|")[2])) for row in rows}
    assert documented == {index: sorted(layer) for index, layer in enumerate(LAYERS)}
