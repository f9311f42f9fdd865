"""What OmegaConf 2.4 changed that lazytrain's configs meet (CI runs these on OmegaConf 2.4 in its main
environment and on 2.3 in its floor environment): resolvers' registration and annotation checks, tuples."""

from __future__ import annotations

import textwrap
import warnings

from omegaconf import ListConfig, OmegaConf

from lazytrain.config import LazyConfig, instantiate, register_resolver, tree


def test_frac_of_int_values_resolves_without_a_warning():
    # OmegaConf 2.4 checks a resolver's arguments against its annotations; an int where float was annotated
    # warned on every recipe's LR milestones (failed before on OmegaConf 2.4).
    cfg = OmegaConf.create({"max_iter": 90, "step": "${lazytrain.frac:${max_iter},2,3}"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cfg.step == 60


def test_register_resolver_takes_parsed_arguments_once_and_without_a_warning():
    # OmegaConf 2.4 deprecates register_new_resolver (a UserWarning on lazytrain's import, failed before);
    # 2.3's register_resolver is the legacy string-only API, so the arguments' types tell which was called.
    calls = []

    def add(a: int, b: int) -> int:
        calls.append((a, b))
        return a + b

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register_resolver("lazytrain_test.add", add)
        register_resolver("lazytrain_test.add", lambda a, b: 0)  # registered already: kept
        cfg = OmegaConf.create({"x": 2, "y": "${lazytrain_test.add:${x},3}"})
        assert cfg.y == 5
    assert calls == [(2, 3)]
    OmegaConf.clear_resolver("lazytrain_test.add")


def test_a_tuple_assigned_in_a_config_file_is_a_list_like_any_other(tmp_path):
    # OmegaConf 2.4 stores it as an immutable TupleConfig: the walk did not see its items, an override could not
    # set one and LazyConfig.save refused the config (failed before on OmegaConf 2.4).
    (tmp_path / "base.py").write_text('model = dict(_target_="builtins.dict", depth=50)\n')
    (tmp_path / "config.py").write_text(
        textwrap.dedent(
            """\
            from .base import model

            model.sizes = ((32,), (64, "${model.depth}"))
            """
        )
    )
    cfg = LazyConfig.load(tmp_path / "config.py")
    assert isinstance(cfg.model.sizes, ListConfig) and isinstance(cfg.model.sizes[1], ListConfig)
    assert "model.sizes[1][1]" in [path for path, _ in tree.nodes(cfg)]
    LazyConfig.apply_overrides(cfg, ["model.sizes.0.0=16"])
    LazyConfig.save(cfg, tmp_path / "saved.yaml")
    again = LazyConfig.load(tmp_path / "saved.yaml")
    assert instantiate(again.model) == {"depth": 50, "sizes": [[16], [64, 50]]}
