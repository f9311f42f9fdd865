import functools

import pytest
from omegaconf import DictConfig, OmegaConf

from lazytrain.config import InstantiationError, L, LazyConfig, instantiate
from tests.config import helpers


def test_nested_and_lists_become_plain_python():
    cfg = L(helpers.record)(items=[L(helpers.Point)(x=1), {"k": L(helpers.Point)(y=2)}], opts={"a": [1, 2]})
    built = instantiate(cfg)
    assert built["items"] == [helpers.Point(1, 0), {"k": helpers.Point(0, 2)}]
    assert type(built["opts"]) is dict and type(built["opts"]["a"]) is list


def test_convert_none_keeps_config_containers():
    built = instantiate(L(helpers.record)(opts={"a": 1}, _convert_="none"))
    assert isinstance(built["opts"], DictConfig)


def test_partial():
    fn = instantiate(L(helpers.add)(b=2, _partial_=True))
    assert isinstance(fn, functools.partial)
    assert fn(1) == 3


def test_args():
    assert instantiate(L(helpers.add)(2, 3, scale=2)) == 10


def test_recursive_false_passes_nodes():
    built = instantiate(L(helpers.record)(child=L(helpers.Point)(x=1), _recursive_=False))
    assert isinstance(built["child"], DictConfig)
    assert instantiate(built["child"]) == helpers.Point(1, 0)


def test_lazy_target_is_built_then_called():
    cfg = {"_target_": L(helpers.make_adder)(offset=10), "_args_": [5]}
    assert instantiate(cfg) == 15


def test_node_shared_by_interpolation_is_built_once():
    cfg = OmegaConf.create(
        {
            "dataloader": {
                "train": L(helpers.Loader)(
                    dataset=L(helpers.make_dataset)(size=4),
                    sampler=L(helpers.Sampler)(dataset_dicts="${..dataset}"),
                )
            }
        }
    )
    loader = instantiate(cfg.dataloader.train)
    assert helpers.CALLS["make_dataset"] == 1
    assert loader.sampler.dataset_dicts is loader.dataset


def test_shared_node_survives_save_and_reload(tmp_path):
    cfg = OmegaConf.create({"a": L(helpers.make_dataset)(), "b": L(helpers.record)(x="${a}", y="${a}")})
    LazyConfig.save(cfg, str(tmp_path / "c.yaml"))
    built = instantiate(LazyConfig.load(str(tmp_path / "c.yaml")))
    assert helpers.CALLS["make_dataset"] == 1
    assert built["b"]["x"] is built["b"]["y"] is built["a"]


def test_extra_kwargs_override_and_pass_as_is():
    model = object()
    loader = instantiate(L(helpers.Loader)(dataset=None, sampler="???", batch_size=3), sampler=model)
    assert loader.sampler is model and loader.batch_size == 3


def test_objects_and_plain_values_pass_through():
    marker = object()
    assert instantiate(5) == 5
    assert instantiate({"a": marker})["a"] is marker


def test_error_names_key_path_and_target_and_chains_cause():
    cfg = OmegaConf.create({"outer": {"inner": L(helpers.failing)(value=3)}})
    with pytest.raises(InstantiationError) as info:
        instantiate(cfg.outer)
    message = str(info.value)
    assert "'outer.inner'" in message
    assert "tests.config.helpers.failing" in message
    assert "boom 3" in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_missing_value_error_names_key():
    cfg = OmegaConf.create({"m": L(helpers.add)(a="???")})
    with pytest.raises(InstantiationError, match=r"m\.a"):
        instantiate(cfg.m)


def test_non_importable_target_error():
    with pytest.raises(InstantiationError, match="no attribute 'nothing'"):
        instantiate({"x": {"_target_": "tests.config.helpers.nothing"}})
