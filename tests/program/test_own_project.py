"""README's "Your own project" as a new user meets it, outside the clone: lazytrain's wheel, built offline from
this repository, installed into a fresh environment that sees the packages installed here but not the editable
lazytrain; the section's files written into a folder of their own and its commands run from there."""

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from tests.smoke import FEW_DETECTIONS, TINY_SYNTHETIC_LT, smoke_overrides

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTION = "Your own project"
# What the wheel is built from (the source distribution's contents, not the clone's outputs and caches).
SOURCES = ("pyproject.toml", "README.md", "lazytrain", "conf", "recipes")
SMOKE = [*smoke_overrides(), "train.eval_period=0", FEW_DETECTIONS, "~train.hooks.plots"]


def readme_section(name: str = SECTION) -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        return f.read().split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


def section_files() -> dict[str, str]:
    """The section's files: each ```python block whose first line is ``# my_project/NAME.py``."""
    files = {}
    for block in re.findall(r"```python\n(.*?)```", readme_section(), re.S):
        first = block.splitlines()[0]
        if first.startswith("# my_project/"):
            files[first.removeprefix("# my_project/")] = block
    return files


def section_commands() -> list[str]:
    """The section's ``python -m lazytrain`` commands, in order, comments stripped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", readme_section(), re.S):
        commands += [line.split(" #")[0].strip() for line in block.splitlines()]
    return [c for c in commands if c.startswith("python -m lazytrain")]


def test_pyproject_lists_every_package_and_maps_conf_and_recipes():
    """pyproject.toml names the packages one by one (conf/ and recipes/ install under other names, which
    packages.find cannot give): a package folder missing from the list would be missing from the wheel."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    mapped = {"lazytrain.conf": "conf", "lazytrain.recipes": "recipes"}
    assert setuptools["package-dir"] == mapped
    on_disk = set()
    for top, name in [("lazytrain", "lazytrain"), *((folder, name) for name, folder in mapped.items())]:
        for folder, _, files in os.walk(os.path.join(REPO, top)):
            if "__init__.py" in files:
                relative = os.path.relpath(folder, os.path.join(REPO, top))
                on_disk.add(name if relative == "." else f"{name}.{relative.replace(os.sep, '.')}")
    assert sorted(setuptools["packages"]) == sorted(on_disk)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    """lazytrain's wheel, built offline (no build isolation: this environment's setuptools) from a copy of the
    sources, so the clone gets no build/ folder."""
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    assert major >= 77, (
        f"pyproject.toml's build-system needs setuptools>=77, this environment has {setuptools.__version__}"
    )
    root = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        source = os.path.join(REPO, name)
        if os.path.isdir(source):
            shutil.copytree(source, root / "src" / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            os.makedirs(root / "src", exist_ok=True)
            shutil.copy(source, root / "src" / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", str(root / "dist"), str(root / "src")],
        check=True,
        capture_output=True,
    )
    (path,) = glob.glob(str(root / "dist" / "lazytrain-*.whl"))
    return path


@pytest.fixture(scope="module")
def environment(wheel, tmp_path_factory) -> str:
    """A fresh environment's python with the wheel installed: the packages installed here are visible through a
    .pth line (the editable lazytrain's own .pth is not read there), lazytrain comes from the wheel."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with open(os.path.join(site_packages, "lazytrain_test_base.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        check=True,
        capture_output=True,
    )
    return python


def run(
    python: str, command: str, cwd, env: dict, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """A README command as typed, with `python` for ``python`` and the `extra` overrides replacing its own of
    the same keys."""
    keys = {override.split("=")[0] for override in extra}
    words = [w for w in shlex.split(command) if w.split("=")[0] not in keys] + list(extra)
    result = subprocess.run(
        [python, *words[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_own_project_from_readme_runs_on_the_installed_wheel(wheel, environment, tmp_path):
    """Slow (~2-3 min on 2 busy cores): the wheel is built and installed, each command is a new interpreter in
    the new environment, and the section trains four runs of 2 iterations (the shipped demo, the own config,
    its sweep of two jobs)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("conf", "recipes"):
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            assert f"lazytrain/{folder}/{os.path.relpath(path, os.path.join(REPO, folder))}" in names, path
    project = tmp_path / "my_project"
    project.mkdir()
    files = section_files()
    assert sorted(files) == ["my_config.py", "shapes.py"]
    for name, text in files.items():
        (project / name).write_text(text)
    # The demo's data set, generated on first use into ./datasets: a tiny one there already.
    generate_synthetic_lt(str(tmp_path / "tiny" / "synthetic_lt"), **TINY_SYNTHETIC_LT)
    (project / "datasets").symlink_to(tmp_path / "tiny")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LAZYTRAIN_DATASETS")}
    env["OMP_NUM_THREADS"] = "1"

    where = run(environment, "python -c 'import lazytrain; print(lazytrain.__file__)'", project, env)
    assert where.stdout.startswith(os.path.dirname(os.path.dirname(environment))), where.stdout

    help_command, demo, own, sweep = section_commands()
    assert help_command == "python -m lazytrain --help"
    listing = run(environment, help_command, project, env).stdout
    assert "lazytrain://NAME" in listing and re.search(r"\n  rfs_maskrcnn_demo +The RFS Mask R-CNN", listing)

    assert demo.startswith("python -m lazytrain lazytrain://rfs_maskrcnn_demo")
    result = run(environment, demo, project, env, (*SMOKE, "hydra.run.dir=runs/demo"))
    # The embedded data set is read from ./datasets of the folder it runs in.
    assert f"from {project}/datasets/synthetic_lt/lvis_v1_train.json" in result.stdout + result.stderr
    assert os.path.isfile(project / "runs" / "demo" / "model_final.pth")

    assert own == "python -m lazytrain my_config.py"
    run(environment, own, project, env, (*SMOKE, "hydra.run.dir=runs/mine"))
    with open(project / "runs" / "mine" / "config.yaml") as f:
        saved = f.read()
    assert "_target_: shapes.DropoutBoxHead" in saved and "_target_: shapes.register_shapes" in saved
    assert os.path.isfile(project / "data" / "shapes" / "lvis_v1_train.json")  # the user's data set
    with open(project / "runs" / "mine" / "metrics.json") as f:
        iterations = [json.loads(line).get("iteration") for line in f]
    assert 1 in iterations

    assert sweep.startswith("python -m lazytrain my_config.py -m ")
    run(environment, sweep, project, env, (*SMOKE, "hydra.sweep.dir=runs/sweep"))
    with open(project / "runs" / "sweep" / "summary.csv") as f:
        rows = f.read().splitlines()
    assert len(rows) == 3 and all("box_head.dropout" in row for row in rows[1:]), rows
