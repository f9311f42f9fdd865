"""The shipped configs by name: a config file anywhere imports ``lazytrain.conf.*`` and ``lazytrain.recipes.*``
as config files (executed afresh, like relative imports), and ``lazytrain://NAME`` names a shipped config on the
command line (README "Your own project"; tests/program/test_own_project.py runs them from an installed wheel)."""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from lazytrain.config import ConfigError, LazyConfig
from lazytrain.config.loading import get_shipped_config_dir
from lazytrain.config.shipped_configs import get_config_file, list_shipped_configs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_the_shipped_packages_are_the_repository_folders():
    assert get_shipped_config_dir("lazytrain.conf") == os.path.join(REPO, "conf")
    assert get_shipped_config_dir("lazytrain.recipes") == os.path.join(REPO, "recipes")


def test_a_config_anywhere_imports_shipped_configs_by_name_each_import_afresh(tmp_path, monkeypatch):
    mine = write(
        tmp_path / "mine.py",
        """
        from lazytrain.conf.rfs_maskrcnn_demo import model, train
        from lazytrain.recipes.models.mask_rcnn_fpn import model as r50

        model.roi_heads.score_thresh = 0.5
        train.max_iter = 7
        """,
    )
    cfg = LazyConfig.load(mine)
    assert (cfg.train.max_iter, cfg.model.roi_heads.score_thresh) == (7, 0.5)
    # The demo's ResNet-18 came from the same recipe file as r50, whose depth the demo's import did not change.
    assert (cfg.model.backbone.depth, cfg.r50.backbone.depth) == (18, 50)
    demo = LazyConfig.load("lazytrain://rfs_maskrcnn_demo")  # as from a notebook: the short name
    assert demo == LazyConfig.load(get_config_file("lazytrain://rfs_maskrcnn_demo"))
    assert (demo.train.max_iter, demo.model.roi_heads.score_thresh) == (400, 0.001)
    with pytest.raises(
        ConfigError, match=r"ships no config 'rfs_maskrcnn_dem'\. Did you mean lazytrain://rfs_"
    ):
        LazyConfig.load("lazytrain://rfs_maskrcnn_dem")
    # A Path collapses the scheme's '//': one line with the string to pass, not "file not found".
    with pytest.raises(ConfigError, match=r"not a path .* pass 'lazytrain://rfs_maskrcnn_demo'\.$"):
        LazyConfig.load(pathlib.Path("lazytrain://rfs_maskrcnn_demo"))
    # A real folder named "lazytrain:" is a path like any other.
    (tmp_path / "lazytrain:").mkdir()
    (tmp_path / "lazytrain:" / "mine.py").write_text("train = dict(max_iter=3)\n")
    monkeypatch.chdir(tmp_path)
    assert LazyConfig.load("lazytrain:/mine.py").train.max_iter == 3


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "import lazytrain.recipes.train",
            "import names from the file: 'from lazytrain.recipes.train import",
        ),
        ("from lazytrain.recipes.models import mask_rcnn_fpn", "is a folder: import from a file in it"),
        (
            "from lazytrain.recipes.nope import model",
            "nope.py, which does not exist. lazytrain.recipes is the folder",
        ),
    ],
)
def test_a_wrong_import_of_a_shipped_config_says_how_to_write_it(tmp_path, line, message):
    with pytest.raises(ConfigError, match="mine.py: ") as error:
        LazyConfig.load(write(tmp_path / "mine.py", line))
    assert message in str(error.value)


def test_short_names_are_the_shipped_configs():
    names = [name for name, _ in list_shipped_configs()]
    assert names == sorted(
        f[:-3] for f in os.listdir(os.path.join(REPO, "conf")) if f.endswith(".py") and f[0] != "_"
    )
    assert dict(list_shipped_configs())["rfs_maskrcnn_demo"].startswith(
        "The RFS Mask R-CNN recipe on the embedded"
    )
    for name in ("lazytrain://rfs_maskrcnn_demo", "lazytrain://rfs_maskrcnn_demo.py"):
        assert get_config_file(name) == os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")
    assert get_config_file("conf/x.py") == "conf/x.py"
    with pytest.raises(
        ConfigError, match="ships no config 'rfs_maskrcnn_dem'. Did you mean lazytrain://rfs_maskrcnn_demo"
    ):
        get_config_file("lazytrain://rfs_maskrcnn_dem")


def test_help_lists_the_shipped_configs_and_an_unknown_name_stops_at_once(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lazytrain", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "python -m lazytrain lazytrain://NAME" in result.stdout
    for name, _ in list_shipped_configs():
        assert f"\n  {name} " in result.stdout
    result = subprocess.run(
        [sys.executable, "-m", "lazytrain", "lazytrain://nope", "train.max_iter=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "lazytrain ships no config 'nope'" in result.stderr
    assert os.listdir(tmp_path) == []  # no run folder


def test_another_clone_on_the_path_gets_its_own_configs_not_the_installed_checkout(tmp_path):
    # An editable install's finder is pinned to the installed checkout: with another clone on PYTHONPATH,
    # lazytrain's code came from the clone and its configs from the installed checkout (failed before).
    clone = tmp_path / "clone"
    shutil.copytree(
        os.path.join(REPO, "lazytrain"), clone / "lazytrain", ignore=shutil.ignore_patterns("__pycache__")
    )
    for folder in ("conf", "recipes"):
        (clone / folder).mkdir()
    write(clone / "conf" / "clone_only.py", '"""Only in the clone."""\ntrain = dict(max_iter=3)\n')
    write(clone / "recipes" / "schedule.py", "steps = [1, 2]\n")
    write(tmp_path / "mine.py", "from lazytrain.recipes.schedule import steps\n")
    code = (
        "import lazytrain; from lazytrain.config import LazyConfig\n"
        "from lazytrain.config.shipped_configs import get_config_file, list_shipped_configs\n"
        "print(lazytrain.__file__); print(get_config_file('lazytrain://clone_only'))\n"
        "print([name for name, _ in list_shipped_configs()]); print(list(LazyConfig.load('mine.py').steps))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(clone)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        str(clone / "lazytrain" / "__init__.py"),
        str(clone / "conf" / "clone_only.py"),
        "['clone_only']",
        "[1, 2]",
    ]


def test_help_without_the_shipped_configs_prints_the_usage_and_one_line(monkeypatch, capsys):
    # A clone without an install, or an editable install older than the configs: --help ended in a traceback
    # (failed before).
    from lazytrain.config import shipped_configs
    from lazytrain.program import entrypoint

    def missing(package):
        raise ConfigError(f"{package} is not installed with this lazytrain; reinstall lazytrain.")

    monkeypatch.setattr(shipped_configs, "get_shipped_config_dir", missing)
    entrypoint.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m lazytrain CONFIG.py|CONFIG.yaml|lazytrain://NAME")
    assert out.splitlines()[-1] == (
        "Shipped configs: none found (lazytrain.conf is not installed with this lazytrain; reinstall lazytrain.)"
    )
