import textwrap

import pytest
from omegaconf import OmegaConf

from lazytrain.config import CONFIG_VERSION, ConfigError, L, LazyConfig, instantiate
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
    assert text.startswith(f"# lazytrain-config-version: {CONFIG_VERSION}\n")
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
    with pytest.raises(ConfigError, match=r"x\.y\[1\]: a config cannot hold .*\(type object\)"):
        LazyConfig.save({"x": {"y": [1, object()]}}, str(tmp_path / "x.yaml"))
    assert not (tmp_path / "x.yaml").exists()


def test_save_plain_dict_converts_values_like_lazycall(tmp_path):
    LazyConfig.save({"p": helpers.Point(1, 2), "n": 3}, str(tmp_path / "x.yaml"))
    cfg = LazyConfig.load(str(tmp_path / "x.yaml"))
    assert instantiate(cfg) == {"p": helpers.Point(1, 2), "n": 3}


def test_to_py_renders_loadable_python(tmp_path):
    cfg = build_rich_config()
    text = LazyConfig.to_py(cfg)
    assert "from tests.config.helpers import Loader" in text
    assert "L(Loader)(" in text
    path = tmp_path / "rendered.py"
    path.write_text(text)
    assert LazyConfig.load(str(path)) == cfg


def test_module_level_dataclass_and_tuple_are_kept(tmp_path):
    path = write(
        tmp_path / "a.py",
        """
        import dataclasses
        from tests.config.helpers import Point
        origin = Point(1, 2)
        size = (3, 4)
        """,
    )
    cfg = LazyConfig.load(str(path))
    assert set(cfg.keys()) == {"origin", "size"}
    assert instantiate(cfg.origin) == helpers.Point(1, 2)
    assert list(cfg.size) == [3, 4]


def test_eagerly_built_object_is_an_error_naming_the_variable(tmp_path):
    path = write(
        tmp_path / "a.py", "import logging\nlog = logging.getLogger('x')\n_ok = logging.getLogger('y')\n"
    )
    with pytest.raises(ConfigError, match=r"a\.py: log: a config cannot hold .*private name \(_log\)"):
        LazyConfig.load(str(path))


def test_imported_dataclass_stays_an_object_in_the_importer(tmp_path):
    write(
        tmp_path / "base.py",
        "from tests.config.helpers import Point\norigin = Point(1, 2)\nopts = dict(a=1)\n",
    )
    path = write(tmp_path / "child.py", "from .base import origin, opts\norigin.x = 5\nopts.b = 2\n")
    cfg = LazyConfig.load(str(path))
    assert instantiate(cfg.origin) == helpers.Point(5, 2)
    assert dict(cfg.opts) == {"a": 1, "b": 2}


def test_import_cycle_is_named(tmp_path):
    write(tmp_path / "a.py", "from .b import x\ny = 1\n")
    write(tmp_path / "b.py", "from .a import y\nx = 1\n")
    with pytest.raises(ConfigError, match=r"cycle: .*a\.py -> .*b\.py -> .*a\.py"):
        LazyConfig.load(str(tmp_path / "a.py"))


def test_error_while_executing_names_file_and_line(tmp_path):
    write(tmp_path / "base.py", "x = 1\ny = undefined_name\n")
    path = write(tmp_path / "a.py", "from .base import x\n")
    with pytest.raises(ConfigError, match=r"base\.py, line 2: NameError: name 'undefined_name'") as info:
        LazyConfig.load(str(path))
    assert isinstance(info.value.__cause__, NameError)


def test_missing_imported_name_names_the_file(tmp_path):
    write(tmp_path / "base.py", "x = 1\n")
    path = write(tmp_path / "a.py", "from .base import model\n")
    with pytest.raises(
        ConfigError, match=r"a\.py, line 1: ImportError: cannot import name 'model' .*base\.py"
    ):
        LazyConfig.load(str(path))


def test_importing_a_folder_suggests_a_file(tmp_path):
    (tmp_path / "models").mkdir()
    path = write(tmp_path / "a.py", "from .models import model\n")
    with pytest.raises(ConfigError, match=r"is a folder: import from a file in it"):
        LazyConfig.load(str(path))


def test_yaml_reads_exponent_floats_and_keeps_quoted_strings(tmp_path):
    path = tmp_path / "hand.yaml"
    path.write_text("lr: 1e-3\nwd: -2E+4\nscale: .5\nname: '1e-3'\nsteps: 1_000\n")
    cfg = LazyConfig.load(str(path))
    assert cfg == {"lr": 0.001, "wd": -20000.0, "scale": 0.5, "name": "1e-3", "steps": 1000}
    assert type(cfg.lr) is float and type(cfg.name) is str


def test_save_load_round_trips_float_extremes_and_string_lookalikes(tmp_path):
    cfg = OmegaConf.create({"a": 1e-8, "b": 1e20, "c": float("inf"), "d": "1e-3", "e": "null", "f": "${a}"})
    path = tmp_path / "new" / "folder" / "c.yaml"
    LazyConfig.save(cfg, str(path))
    again = LazyConfig.load(str(path))
    assert again == cfg
    assert type(again.d) is str and again.e == "null"


def test_to_py_handles_lazy_targets_odd_keys_and_inf(tmp_path):
    cfg = OmegaConf.create(
        {
            "adder": {"_target_": L(helpers.make_adder)(offset=10), "_args_": [5]},
            "odd": L(helpers.record)(**{"my-key": 1, "class": 2, "ok": float("inf")}),
            "none_node": None,
            "empty": L(helpers.record)(),
        }
    )
    text = LazyConfig.to_py(cfg)
    assert "L(L(make_adder)(\n" in text
    assert "**{\n" in text and "'my-key': 1" in text and "ok=float('inf')" in text
    path = tmp_path / "rendered.py"
    path.write_text(text)
    again = LazyConfig.load(str(path))
    assert again == cfg
    assert instantiate(again.adder) == 15
    assert instantiate(again.odd) == {"my-key": 1, "class": 2, "ok": float("inf")}


def test_star_import_and_dunder_file(tmp_path):
    write(tmp_path / "base.py", "import os\nmodel = dict(depth=50)\nroot = os.path.dirname(__file__)\n")
    path = write(tmp_path / "sub" / "a.py", "from ..base import *\nmodel.depth = 18\n")
    cfg = LazyConfig.load(str(path))
    assert OmegaConf.to_container(cfg) == {"model": {"depth": 18}, "root": str(tmp_path)}


def test_bad_value_in_imported_file_names_that_file(tmp_path):
    write(tmp_path / "base.py", "opts = dict(handler=object())\n")
    path = write(tmp_path / "a.py", "from .base import opts\n")
    with pytest.raises(ConfigError, match=r"config file .*base\.py: opts\.handler: a config cannot hold"):
        LazyConfig.load(str(path))
