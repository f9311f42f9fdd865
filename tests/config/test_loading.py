import textwrap

import pytest
from omegaconf import OmegaConf

from lazytrain.config import ConfigError, L, LazyConfig, instantiate
from tests.config import helpers


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def config_tree(tmp_path):
    write(
        tmp_path / "recipes" / "models" / "toy.py",
        """
        from lazytrain.config import LazyCall as L
        from tests.config.helpers import add
        model = L(add)(1, b=2)
        layers = [1, 2, 3]
        """,
    )
    write(
        tmp_path / "conf" / "base.py",
        """
        from ..recipes.models.toy import model
        train = dict(max_iter=10, lr=0.1)
        """,
    )
    write(
        tmp_path / "conf" / "child.py",
        """
        from .base import model, train
        train.max_iter = 20
        model.b = 5
        seeds = [0, 1]
        num_classes = 7
        _private = 1
        import os
        def helper():
            return 1
        """,
    )
    write(
        tmp_path / "conf" / "sibling.py",
        """
        from .base import model, train
        """,
    )
    return tmp_path


def test_relative_imports_across_nested_dirs(config_tree):
    cfg = LazyConfig.load(str(config_tree / "conf" / "child.py"))
    assert cfg.train.max_iter == 20
    assert cfg.model.b == 5
    assert instantiate(cfg.model) == 6


def test_each_import_is_a_fresh_execution(config_tree):
    LazyConfig.load(str(config_tree / "conf" / "child.py"))
    sibling = LazyConfig.load(str(config_tree / "conf" / "sibling.py"))
    assert sibling.train.max_iter == 10
    assert sibling.model.b == 2


def test_load_keeps_lists_and_ints_and_drops_private_modules_functions(config_tree):
    cfg = LazyConfig.load(str(config_tree / "conf" / "child.py"))
    assert list(cfg.seeds) == [0, 1]
    assert cfg.num_classes == 7
    assert set(cfg.keys()) == {"model", "train", "seeds", "num_classes"}


def test_missing_imported_file_is_named(tmp_path):
    path = write(tmp_path / "a.py", "from .nothere import model\n")
    with pytest.raises(ConfigError, match=r"nothere\.py, which does not exist"):
        LazyConfig.load(str(path))


def test_from_dot_import_is_rejected(tmp_path):
    write(tmp_path / "b.py", "x = 1\n")
    path = write(tmp_path / "a.py", "from . import b\n")
    with pytest.raises(ConfigError, match=r"'from \. import x' is not supported"):
        LazyConfig.load(str(path))


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.py", "x = 1\ny = (\n")
    with pytest.raises(ConfigError, match=r"bad\.py, line 2"):
        LazyConfig.load(str(path))


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        LazyConfig.load(str(tmp_path / "none.py"))


def build_rich_config():
    dataset = L(helpers.make_dataset)(size=5)
    return OmegaConf.create(
        {
            "dataloader": {
                "train": L(helpers.Loader)(
                    dataset=dataset,
                    sampler=L(helpers.Sampler)(dataset_dicts="${..dataset}", repeat_thresh=0.1),
                    batch_size="${train.batch}",
                )
            },
            "points": [L(helpers.Point)(x=1), L(helpers.Point)(y=2)],
            "origin": L(helpers.record)(point=helpers.Point(3, 4)),
            "train": {"batch": 4, "name": "run", "maybe": None},
        }
    )


def test_save_load_round_trip(tmp_path):
    cfg = build_rich_config()
    path = tmp_path / "config.yaml"
    LazyConfig.save(cfg, str(path))
    text = path.read_text()
    assert text.startswith("# lazytrain-config-version: 1")
    assert "${..dataset}" in text  # interpolations are kept, not resolved
    again = LazyConfig.load(str(path))
    assert again == cfg
    first, second = instantiate(cfg), instantiate(again)
    assert first["points"] == second["points"] == [helpers.Point(1, 0), helpers.Point(0, 2)]
    assert first["origin"] == second["origin"] == {"point": helpers.Point(3, 4)}
    assert second["dataloader"]["train"].batch_size == 4
    assert second["dataloader"]["train"].sampler.dataset_dicts == [0, 1, 2, 3, 4]


def test_save_rejects_unrepresentable_value_with_key_path(tmp_path):
    cfg = OmegaConf.create({"a": {"b": 1}}, flags={"allow_objects": True})
    cfg.a.b = object()
    with pytest.raises(ConfigError, match=r"'a\.b' holds"):
        LazyConfig.save(cfg, str(tmp_path / "x.yaml"))
    assert not (tmp_path / "x.yaml").exists()


def test_to_py_renders_loadable_python(tmp_path):
    cfg = build_rich_config()
    text = LazyConfig.to_py(cfg)
    assert "from tests.config.helpers import Loader" in text
    assert "L(Loader)(" in text
    path = tmp_path / "rendered.py"
    path.write_text(text)
    assert LazyConfig.load(str(path)) == cfg


def test_versioning_renames_old_key_with_warning(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text(
        "# lazytrain-config-version: 0\n"
        "dataloader:\n  train:\n    sampler:\n      _target_: tests.config.helpers.Sampler\n"
        "      dataset_dicts: []\n      threshold: 0.001\n"
    )
    with caplog.at_level("WARNING", logger="lazytrain.config.versioning"):
        cfg = LazyConfig.load(str(path))
    assert cfg.dataloader.train.sampler.repeat_thresh == 0.001
    assert "threshold" not in cfg.dataloader.train.sampler
    assert (
        "'dataloader.train.sampler.threshold' was renamed to 'dataloader.train.sampler.repeat_thresh'"
        in caplog.text
    )


def test_current_version_file_is_not_rewritten(tmp_path):
    path = tmp_path / "new.yaml"
    path.write_text("# lazytrain-config-version: 1\nsampler:\n  threshold: 3\n")
    assert LazyConfig.load(str(path)).sampler.threshold == 3
