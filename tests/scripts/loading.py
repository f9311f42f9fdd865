"""Import a file of scripts/ as a module (scripts/ is not a package), so tests can call its main()."""

import importlib.util
import os
from types import ModuleType

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"_script_{name}", os.path.join(REPO, "scripts", f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
